"""Sealed messages: tamper, replay, reorder, truncation, wrong key/client/direction, nonce reuse."""

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from trustformer.secure.sealing import (
    HEADER,
    Channel,
    SealError,
    SessionKeys,
    derive_session_keys,
    message_counter,
)
from trustformer.wire import PayloadError

RUN = 7


def pair(client=1, run=RUN):
    """A client and the aggregator sharing keys derived by X25519 + HKDF, as after attestation."""
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    transcript = os.urandom(32) + a.public_key().public_bytes_raw() + b.public_key().public_bytes_raw()
    keys_a = derive_session_keys(a.exchange(b.public_key()), run_id=run, client=client, transcript=transcript)
    keys_b = derive_session_keys(b.exchange(a.public_key()), run_id=run, client=client, transcript=transcript)
    assert keys_a == keys_b and keys_a.up != keys_a.down
    return Channel(run, client, keys_a, "client"), Channel(run, client, keys_b, "server")


def flip(data: bytes, index: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[index] ^= 1 << bit
    return bytes(out)


def test_round_trip_both_directions_and_counters():
    client, server = pair()
    up = client.seal(b"centroids", round_=1, kind="train", bound={"num_examples": 60})
    assert server.open(up, round_=1, kind="train", bound={"num_examples": 60}) == b"centroids"
    down = server.seal(b"aggregate", round_=1, kind="train.apply")
    assert client.open(down, round_=1, kind="train.apply") == b"aggregate"
    assert client.last_sent == server.last_accepted == message_counter(1, "train")
    assert b"centroids" not in up and len(up) == len(b"centroids") + HEADER.size + 16


def test_every_single_bit_flip_is_rejected():
    client, server = pair()
    sealed = client.seal(b"x" * 20, round_=1, kind="train")
    for index in range(len(sealed)):
        with pytest.raises(SealError) as info:
            server.open(flip(sealed, index, index % 8), round_=1, kind="train")
        assert info.value.reason in ("authentication", "malformed", "replay", "out-of-order")
    assert server.open(sealed, round_=1, kind="train") == b"x" * 20  # nothing was accepted before


def test_tampered_payload_names_authentication():
    client, server = pair()
    sealed = client.seal(b"payload", round_=2, kind="train")
    with pytest.raises(SealError, match=r"rejected \(authentication\).*train of round 2 from client 1"):
        server.open(flip(sealed, len(sealed) - 1), round_=2, kind="train")


def test_replay_of_round_r_in_round_r_plus_1_is_rejected():
    client, server = pair()
    first = client.seal(b"round 1", round_=1, kind="train")
    server.open(first, round_=1, kind="train")
    client.seal(b"round 2", round_=2, kind="train")  # the real round-2 message is replaced in transit
    with pytest.raises(SealError) as info:
        server.open(first, round_=2, kind="train")
    assert info.value.reason == "replay"
    with pytest.raises(SealError, match="replay"):  # and the same message twice in its own round
        server.open(first, round_=1, kind="train")


def test_stale_message_never_accepted_is_still_a_replay():
    client, server = pair()
    stale = client.seal(b"round 1", round_=1, kind="train")  # lost in round 1
    with pytest.raises(SealError) as info:
        server.open(stale, round_=3, kind="train")
    assert info.value.reason == "replay"


def test_reordered_messages_are_rejected():
    client, server = pair()
    keys = client.seal(b"keys", round_=1, kind="secagg.keys")
    masked = client.seal(b"masked", round_=1, kind="train")
    with pytest.raises(SealError) as info:  # the later message delivered in place of the earlier one
        server.open(masked, round_=1, kind="secagg.keys")
    assert info.value.reason == "out-of-order"
    forged = HEADER.pack(*HEADER.unpack_from(keys)) + masked[HEADER.size :]  # its counter rewritten
    with pytest.raises(SealError) as info:
        server.open(forged, round_=1, kind="secagg.keys")
    assert info.value.reason == "authentication"
    assert server.open(keys, round_=1, kind="secagg.keys") == b"keys"
    assert server.open(masked, round_=1, kind="train") == b"masked"


def test_a_lost_or_rejected_message_does_not_desynchronise_the_session():
    client, server = pair()
    bad = client.seal(b"round 1", round_=1, kind="train")
    with pytest.raises(SealError):
        server.open(flip(bad, 20), round_=1, kind="train")
    assert server.open(client.seal(b"round 2", round_=2, kind="train"), round_=2, kind="train") == b"round 2"


@pytest.mark.parametrize("cut", [1, 16, 17, 40])
def test_truncated_messages_are_rejected(cut):
    client, server = pair()
    sealed = client.seal(b"some payload bytes", round_=1, kind="train")
    with pytest.raises(SealError) as info:
        server.open(sealed[:-cut], round_=1, kind="train")
    assert info.value.reason in ("authentication", "truncated")


def test_wrong_client_key_wrong_binding_and_wrong_direction_are_rejected():
    client1, server1 = pair(client=1)
    client2, server2 = pair(client=2)
    sealed = client1.seal(b"from client 1", round_=1, kind="train", bound={"num_examples": 60})
    with pytest.raises(SealError, match="authentication"):  # delivered as client 2's message
        server2.open(sealed, round_=1, kind="train", bound={"num_examples": 60})
    with pytest.raises(SealError, match="authentication"):  # another example count than the client bound
        server1.open(sealed, round_=1, kind="train", bound={"num_examples": 6000})
    with pytest.raises(SealError, match="authentication"):  # reflected back to the client
        client1.open(sealed, round_=1, kind="train")
    with pytest.raises(SealError, match="authentication"):  # same keys, another run id
        Channel(RUN + 1, 1, server1.keys, "server").open(sealed, round_=1, kind="train", bound={"num_examples": 60})
    other = SessionKeys(up=os.urandom(32), down=os.urandom(32))
    with pytest.raises(SealError, match="authentication"):
        Channel(RUN, 1, other, "server").open(sealed, round_=1, kind="train", bound={"num_examples": 60})
    assert server1.open(sealed, round_=1, kind="train", bound={"num_examples": 60}) == b"from client 1"


def test_nonce_never_reused_except_for_the_identical_message():
    client, server = pair()
    first = client.seal(b"payload", round_=1, kind="train")
    assert client.seal(b"payload", round_=1, kind="train") == first  # a re-sent request answered identically
    with pytest.raises(SealError) as info:
        client.seal(b"another payload", round_=1, kind="train")
    assert info.value.reason == "nonce-reuse"
    client.seal(b"later", round_=2, kind="train")
    with pytest.raises(SealError, match="nonce-reuse"):
        client.seal(b"payload", round_=1, kind="train")


def test_session_state_survives_the_state_store_as_tensors():
    client, server = pair()
    client.seal(b"a", round_=1, kind="train")
    client.open(server.seal(b"b", round_=1, kind="train.apply"), round_=1, kind="train.apply")
    tensors = client.to_tensors("channel/")
    assert all(t.dtype.is_floating_point is False for t in tensors.values())
    restored = Channel.from_tensors(tensors, "client", "channel/")
    assert restored == client
    with pytest.raises(SealError, match="nonce-reuse"):
        restored.seal(b"other", round_=1, kind="train")


def test_seal_error_is_a_payload_error_so_the_round_loop_drops_the_client():
    assert issubclass(SealError, PayloadError)


def test_counters_are_schedule_slots():
    assert message_counter(1, "secagg.keys") < message_counter(1, "train") < message_counter(1, "train.apply")
    assert message_counter(1, "train.apply") < message_counter(2, "secagg.keys")
    with pytest.raises(ValueError):
        message_counter(0, "train")
    with pytest.raises(ValueError):
        message_counter(1, "evaluate")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=120))
def test_random_bytes_never_open(data):
    _client, server = pair()
    with pytest.raises(SealError):
        server.open(data, round_=1, kind="train")
