import base64
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trustformer.secure.masking import _pair_seed, dequantize, mask_stream, quantization_error_bound, quantize
from trustformer.secure.secagg import SecAggClient, SecAggError, SecAggParams, SecAggServer
from trustformer.secure.shamir import FIELD_PRIME, _interpolate, parse_share, shamir_combine, shamir_split
from trustformer_lab.bench.secagg_bench import benchmark

SESSION = b"run-test/round-1"


def _setup(ids, threshold, length, session=SESSION, scale_bits=24):
    params = SecAggParams(threshold=threshold, scale_bits=scale_bits)
    server = SecAggServer(ids, params, length, session)
    clients = {i: SecAggClient(i, ids, params, session, length=length) for i in ids}
    broadcast = server.collect_keys({i: c.advertise_keys() for i, c in clients.items()})
    routed = server.route_shares({i: c.share_keys(broadcast) for i, c in clients.items()})
    return server, clients, routed


def _aggregate(vectors, threshold, drop=(), scale_bits=24):
    """Run the whole protocol; clients in ``drop`` vanish after share_keys."""
    ids = sorted(vectors)
    length = len(next(iter(vectors.values())))
    server, clients, routed = _setup(ids, threshold, length, scale_bits=scale_bits)
    masked = {i: clients[i].masked_input(vectors[i], routed[i]) for i in ids if i not in drop}
    survivors, dropped = server.collect_masked(masked)
    assert survivors == sorted(set(ids) - set(drop)) and dropped == sorted(drop)
    return server.unmask({i: clients[i].unmask(survivors, dropped) for i in survivors})


def _assert_within_bound(total, plain, num_clients, scale_bits=24):
    bound = quantization_error_bound(num_clients, scale_bits)
    # the bound is exact for the integer sum; allow the float64 rounding of the two results
    slack = 4 * np.finfo(np.float64).eps * np.maximum(np.abs(plain), 1.0)
    assert np.all(np.abs(total - plain) <= bound + slack)


@pytest.mark.parametrize("num_clients,threshold", [(3, 2), (5, 3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sum_equals_plain_sum_within_bound(num_clients, threshold, seed):
    rng = np.random.default_rng(seed)
    ids = sorted(rng.choice(1000, size=num_clients, replace=False).tolist())  # arbitrary, not 0..n-1
    scale = 10.0 ** rng.uniform(-3, 3)
    vectors = {i: rng.normal(0.0, scale, 257) for i in ids}
    total = _aggregate(vectors, threshold)
    plain = np.sum([vectors[i] for i in ids], axis=0)
    assert total.dtype == np.float64 and total.shape == (257,)
    _assert_within_bound(total, plain, num_clients)
    # the result is not trivially the plain sum rounded differently: the error is fixed-point sized
    assert np.max(np.abs(total - plain)) < 1e-3 * scale


def test_client_id_zero_and_float32_inputs():
    rng = np.random.default_rng(7)
    vectors = {i: rng.normal(size=64).astype(np.float32) for i in (0, 1, 2)}
    total = _aggregate(vectors, 2)
    _assert_within_bound(total, np.sum([v.astype(np.float64) for v in vectors.values()], axis=0), 3)


def test_one_client_dropped_after_share_keys():
    rng = np.random.default_rng(3)
    vectors = {i: rng.normal(size=100) for i in range(3)}
    total = _aggregate(vectors, threshold=2, drop=[1])
    _assert_within_bound(total, vectors[0] + vectors[2], 2)
    # the dropped client's vector really is absent, not silently included
    assert np.max(np.abs(total - (vectors[0] + vectors[1] + vectors[2]))) > 1e-3


@pytest.mark.parametrize("drop", [[0, 4], [1, 3], [2, 3]])
def test_two_dropped_when_threshold_allows(drop):
    rng = np.random.default_rng(4)
    vectors = {i: rng.normal(size=50) for i in range(5)}
    total = _aggregate(vectors, threshold=3, drop=drop)
    _assert_within_bound(total, np.sum([vectors[i] for i in range(5) if i not in drop], axis=0), 3)


def test_too_many_dropped_raises():
    rng = np.random.default_rng(5)
    vectors = {i: rng.normal(size=20) for i in range(5)}
    expected = r"2 masked inputs arrived, threshold is 3; too many clients dropped \(\[2, 3, 4\]\)"
    with pytest.raises(SecAggError, match=expected):
        _aggregate(vectors, threshold=3, drop=[2, 3, 4])


def test_too_few_unmask_answers_raises():
    ids = list(range(4))
    server, clients, routed = _setup(ids, 3, 10)
    survivors, dropped = server.collect_masked({i: clients[i].masked_input(np.ones(10), routed[i]) for i in ids})
    answers = {i: clients[i].unmask(survivors, dropped) for i in ids[:2]}
    with pytest.raises(SecAggError, match="2 clients answered, threshold is 3"):
        server.unmask(answers)


def test_too_few_shares_for_one_owner_raises():
    ids = list(range(4))
    server, clients, routed = _setup(ids, 3, 10)
    survivors, dropped = server.collect_masked({i: clients[i].masked_input(np.ones(10), routed[i]) for i in ids})
    answers = {i: clients[i].unmask(survivors, dropped) for i in ids}
    for i in (0, 1):
        del answers[i][2]
    with pytest.raises(SecAggError, match="self-mask seed of client 2 .*2 shares given, 3 needed"):
        server.unmask(answers)


def test_single_masked_input_reveals_nothing_obvious():
    length = 1 << 16
    ids = [0, 1, 2]
    server, clients, routed = _setup(ids, 2, length)
    x = np.full(length, 1.5)  # a constant input: any leak would show as structure
    y = clients[1].masked_input(x, routed[1])
    q = quantize(x, 24)
    assert y.dtype == np.uint64 and y.shape == (length,)
    assert np.count_nonzero(y == q) == 0
    # top 4 bits uniform over 16 bins: chi-square with 15 dof; 80 is far beyond p = 1e-9
    counts = np.bincount((y >> np.uint64(60)).astype(np.int64), minlength=16)
    expected = length / 16
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < 80.0
    # low bits (where q(x) lives) also look uniform, and consecutive outputs are uncorrelated
    low = (y & np.uint64(0xFF)).astype(np.float64)
    assert abs(low.mean() - 127.5) < 5 * 73.9 / np.sqrt(length)
    u = y.astype(np.float64) / 2.0**64
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / np.sqrt(length)
    # a sum of two masked inputs also stays masked (pairwise masks against the third client remain)
    y0 = clients[0].masked_input(x, routed[0])
    assert np.count_nonzero((y0 + y) == quantize(2 * x, 24)) == 0


def test_tampered_share_ciphertext_rejected():
    server, clients, routed = _setup([0, 1, 2], 2, 8)
    bad = bytearray(routed[2][0])
    bad[20] ^= 0x01
    with pytest.raises(SecAggError, match="client 2: share ciphertext from client 0 fails authentication"):
        clients[2].masked_input(np.zeros(8), {**routed[2], 0: bytes(bad)})


def test_share_ciphertext_redirected_or_from_other_session_rejected():
    server, clients, routed = _setup([0, 1, 2], 2, 8)
    # 0 -> 1 ciphertext presented to 2 as if it came from 0
    with pytest.raises(SecAggError, match="client 2: share ciphertext from client 0 fails authentication"):
        clients[2].masked_input(np.zeros(8), {**routed[2], 0: routed[1][0]})
    # same clients and keys, but a ciphertext of another session (e.g. an earlier round replayed)
    data = json.loads(clients[2].to_bytes())
    data["session"] = base64.b64encode(b"run-test/round-2").decode()
    other = SecAggClient.from_bytes(json.dumps(data).encode())
    with pytest.raises(SecAggError, match="fails authentication"):
        other.masked_input(np.zeros(8), routed[2])


def test_server_asking_for_both_shares_of_a_client_refused():
    ids = [0, 1, 2]
    server, clients, routed = _setup(ids, 2, 8)
    for i in ids:
        clients[i].masked_input(np.ones(8), routed[i])
    with pytest.raises(SecAggError, match=r"client 0 refuses: .*both .* client\(s\) \[2\]"):
        clients[0].unmask([0, 1, 2], [2])
    # asking twice with a different split is the same attack spread over two requests
    first = clients[0].unmask([0, 1, 2], [])
    assert set(first) == {0, 1, 2}
    with pytest.raises(SecAggError, match="client 0 refuses: a repeated unmask request changes who survived"):
        clients[0].unmask([0, 1], [2])
    assert clients[0].unmask([0, 1, 2], []) == first  # an identical retry is fine


def test_unmask_request_must_partition_the_clients_that_shared():
    ids = [0, 1, 2, 3]
    server, clients, routed = _setup(ids, 2, 8)
    clients[0].masked_input(np.ones(8), routed[0])
    with pytest.raises(SecAggError, match=r"client 0: client\(s\) \[3\] are listed neither"):
        clients[0].unmask([0, 1], [2])
    with pytest.raises(SecAggError, match=r"client 0: unknown client\(s\) \[9\]"):
        clients[0].unmask([0, 1, 9], [2, 3])
    with pytest.raises(SecAggError, match="client 0: this client is listed as dropped"):
        clients[0].unmask([1, 2], [0, 3])
    with pytest.raises(SecAggError, match="client 0: duplicate survivor ids"):
        clients[0].unmask([0, 0, 1], [2, 3])


def test_wrong_kind_of_share_rejected_by_server():
    ids = [0, 1, 2]
    server, clients, routed = _setup(ids, 2, 8)
    survivors, dropped = server.collect_masked({i: clients[i].masked_input(np.ones(8), routed[i]) for i in (0, 1)})
    answers = {i: clients[i].unmask(survivors, dropped) for i in survivors}
    answers[1][2] = b"b" + answers[1][2][1:]
    with pytest.raises(SecAggError, match="client 1 sent a share of the wrong kind for the masking key of client 2"):
        server.unmask(answers)


def test_tampered_unmask_share_detected():
    ids = [0, 1, 2]
    server, clients, routed = _setup(ids, 2, 8)
    survivors, dropped = server.collect_masked({i: clients[i].masked_input(np.ones(8), routed[i]) for i in ids})
    answers = {i: clients[i].unmask(survivors, dropped) for i in survivors}
    share = bytearray(answers[2][1])
    share[-1] ^= 0x01
    answers[2][1] = bytes(share)
    with pytest.raises(SecAggError, match="self-mask seed of client 1 .*share 2 is inconsistent"):
        server.unmask(answers)


def test_shamir_round_trip_and_any_threshold_subset():
    secret = bytes(range(32))
    shares = shamir_split(secret, 3, [0, 5, 7, 11, 2**64 - 1])
    assert set(shares) == {0, 5, 7, 11, 2**64 - 1}
    assert shamir_combine(shares) == secret
    for subset in ([0, 5, 7], [7, 11, 2**64 - 1], [0, 11, 5, 7]):
        assert shamir_combine({i: shares[i] for i in subset}) == secret
    assert shamir_split(secret, 3, [1, 2, 3]) != shamir_split(secret, 3, [1, 2, 3])  # fresh randomness


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.integers(2, 6), st.data())
def test_shamir_fewer_than_threshold_fails_or_is_wrong(secret, threshold, data):
    n = data.draw(st.integers(threshold, 8))
    shares = shamir_split(secret, threshold, list(range(n)))
    assert shamir_combine(shares) == secret
    few = {i: shares[i] for i in range(threshold - 1)}
    with pytest.raises(SecAggError, match=f"{threshold - 1} shares given, {threshold} needed"):
        shamir_combine(few)
    # the raw interpolation through t-1 points gives an unrelated value, not the secret
    points = [(i + 1, parse_share(i, shares[i])[2]) for i in range(threshold - 1)]
    assert _interpolate(points, 0) != int.from_bytes(secret, "big")


def test_shamir_rejects_bad_shares():
    shares = shamir_split(b"\x01" * 32, 2, [1, 2, 3])
    with pytest.raises(SecAggError, match="share given as id 2 is labelled id 1"):
        shamir_combine({2: shares[1], 3: shares[3]})
    mixed = shamir_split(b"\x02" * 32, 2, [1, 2, 3])
    with pytest.raises(SecAggError, match="share 3 is inconsistent"):
        shamir_combine({1: shares[1], 2: shares[2], 3: mixed[3]})
    with pytest.raises(SecAggError, match="inconsistent shares"):
        shamir_combine({1: shares[1], 2: shamir_split(b"\x01" * 32, 3, [1, 2, 3])[2]})
    with pytest.raises(SecAggError, match="not a 78-byte share"):
        shamir_combine({1: shares[1][:-1], 2: shares[2]})
    with pytest.raises(SecAggError, match="threshold 4"):
        shamir_split(b"x" * 32, 4, [1, 2, 3])
    with pytest.raises(SecAggError, match="duplicate share ids"):
        shamir_split(b"x" * 32, 2, [1, 1, 3])
    assert FIELD_PRIME > 2**256


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 52), st.data())
def test_quantize_round_trip_within_half_step(scale_bits, data):
    limit = 2.0**62 / 2.0**scale_bits
    x = data.draw(
        st.lists(
            st.floats(-limit, limit, allow_nan=False, allow_infinity=False, exclude_min=True, exclude_max=True),
            min_size=1,
            max_size=20,
        )
    )
    values = np.array(x, dtype=np.float64)
    q = quantize(values, scale_bits)
    assert q.dtype == np.uint64
    assert np.all(np.abs(dequantize(q, scale_bits) - values) <= 2.0**-scale_bits / 2)


def test_quantize_refuses_out_of_range_and_non_finite():
    assert quantize(np.array([-1.0]), 24)[0] == np.uint64(2**64 - 2**24)  # two's complement
    limit = 2.0**62 / (2.0**24 * 3)
    quantize(np.array([limit * 0.999]), 24, num_clients=3)
    with pytest.raises(SecAggError, match="too large for the fixed-point range"):
        quantize(np.array([limit]), 24, num_clients=3)
    with pytest.raises(SecAggError, match="NaN/Inf"):
        quantize(np.array([0.0, np.nan]), 24)
    with pytest.raises(SecAggError, match="expected uint64"):
        dequantize(np.array([1], dtype=np.int64), 24)
    assert quantization_error_bound(5, 24) == 5 * 0.5 / 2**24


def test_masks_deterministic_per_context_and_different_across_sessions():
    seed = bytes(range(32))
    a = mask_stream(seed, 1000, b"session-1")
    assert a.dtype == np.uint64 and a.shape == (1000,)
    assert np.array_equal(a, mask_stream(seed, 1000, b"session-1"))
    b = mask_stream(seed, 1000, b"session-2")
    assert np.count_nonzero(a == b) == 0
    assert np.array_equal(mask_stream(seed, 10, b"session-1"), a[:10])  # a prefix of the same stream
    shared = bytes(32)
    assert _pair_seed(shared, b"run/round-1", 0, 1) == _pair_seed(shared, b"run/round-1", 1, 0)
    assert _pair_seed(shared, b"run/round-1", 0, 1) != _pair_seed(shared, b"run/round-2", 0, 1)
    # end to end: the same input masked in two sessions gives unrelated vectors
    ys = []
    for session in (b"run/round-1", b"run/round-2"):
        params = SecAggParams(threshold=2)
        server = SecAggServer([0, 1], params, 64, session)
        clients = {i: SecAggClient(i, [0, 1], params, session) for i in (0, 1)}
        broadcast = server.collect_keys({i: c.advertise_keys() for i, c in clients.items()})
        routed = server.route_shares({i: c.share_keys(broadcast) for i, c in clients.items()})
        ys.append(clients[0].masked_input(np.ones(64), routed[0]))
    assert np.count_nonzero(ys[0] == ys[1]) == 0


def test_client_input_validation():
    server, clients, routed = _setup([0, 1, 2], 2, 8)
    with pytest.raises(SecAggError, match="client 0: .*NaN/Inf"):
        clients[0].masked_input(np.array([0, 1, 2, 3, 4, 5, 6, np.inf]), routed[0])
    with pytest.raises(SecAggError, match="client 0: input has length 7, expected 8"):
        clients[0].masked_input(np.zeros(7), routed[0])
    with pytest.raises(SecAggError, match="client 0: input must be a non-empty 1-D vector"):
        clients[0].masked_input(np.zeros((2, 4)), routed[0])
    with pytest.raises(SecAggError, match=r"client 0: value 1e\+12 is too large"):
        clients[0].masked_input(np.full(8, 1e12), routed[0])
    with pytest.raises(SecAggError, match="client 0: share ciphertext from unknown client 7"):
        clients[0].masked_input(np.zeros(8), {**routed[0], 7: b"x" * 40})
    with pytest.raises(SecAggError, match="client 0: only 1 clients shared keys, threshold is 2"):
        clients[0].masked_input(np.zeros(8), {})
    y = clients[0].masked_input(np.zeros(8), routed[0])
    assert y.shape == (8,)
    with pytest.raises(SecAggError, match="client 0: called after step 'masked_input'"):
        clients[0].masked_input(np.ones(8), routed[0])  # a second input under the same masks


def test_key_validation():
    params = SecAggParams(threshold=2)
    server = SecAggServer([1, 2, 3], params, 4, SESSION)
    c1, c2 = (SecAggClient(i, [1, 2, 3], params, SESSION) for i in (1, 2))
    k1, k2 = c1.advertise_keys(), c2.advertise_keys()
    with pytest.raises(SecAggError, match="collect_keys: unknown client id 9"):
        server.collect_keys({1: k1, 9: k2})
    with pytest.raises(SecAggError, match="client 2 key 'c_pk' has 31 bytes, expected 32"):
        server.collect_keys({1: k1, 2: {**k2, "c_pk": k2["c_pk"][:31]}})
    with pytest.raises(SecAggError, match="client 2 key 's_pk' repeats a key of client 1"):
        server.collect_keys({1: k1, 2: {**k2, "s_pk": k1["s_pk"]}})
    with pytest.raises(SecAggError, match="1 clients sent keys, threshold is 2"):
        server.collect_keys({1: k1})
    broadcast = server.collect_keys({1: k1, 2: k2})
    with pytest.raises(SecAggError, match="client 1: the broadcast keys do not contain this client's own"):
        c1.share_keys({1: k2, 2: k1})
    with pytest.raises(SecAggError, match=r"client 1 addressed recipients \[\], expected \[2\]"):
        server.route_shares({1: {}, 2: c2.share_keys(broadcast)})
    with pytest.raises(SecAggError, match="threshold 4 exceeds the number of clients 3"):
        SecAggServer([1, 2, 3], SecAggParams(threshold=4), 4, SESSION)
    with pytest.raises(SecAggError, match="threshold must be an integer >= 2"):
        SecAggParams(threshold=1)
    with pytest.raises(SecAggError, match="client 5 is not among the clients"):
        SecAggClient(5, [1, 2, 3], params, SESSION)
    with pytest.raises(SecAggError, match="session must be non-empty bytes"):
        SecAggClient(1, [1, 2, 3], params, b"")


def test_server_rejects_bad_masked_inputs():
    server, clients, routed = _setup([0, 1, 2], 2, 8)
    y0 = clients[0].masked_input(np.ones(8), routed[0])
    with pytest.raises(SecAggError, match=r"masked input of client 0 is float64 with shape \(8,\)"):
        server.collect_masked({0: y0.astype(np.float64), 1: y0})
    with pytest.raises(SecAggError, match=r"masked input of client 1 is uint64 with shape \(7,\)"):
        server.collect_masked({0: y0, 1: y0[:7]})
    with pytest.raises(SecAggError, match="masked input from client 5, which did not share keys"):
        server.collect_masked({0: y0, 5: y0})


def test_client_state_survives_serialization_between_messages():
    rng = np.random.default_rng(11)
    ids = [3, 8, 21]
    vectors = {i: rng.normal(size=40) for i in ids}
    params = SecAggParams(threshold=2)
    server = SecAggServer(ids, params, 40, SESSION)
    blobs = {i: SecAggClient(i, ids, params, SESSION).to_bytes() for i in ids}

    def step(i, fn):
        client = SecAggClient.from_bytes(blobs[i])
        out = fn(client)
        blobs[i] = client.to_bytes()
        return out

    broadcast = server.collect_keys({i: step(i, lambda c: c.advertise_keys()) for i in ids})
    routed = server.route_shares({i: step(i, lambda c: c.share_keys(broadcast)) for i in ids})
    masked = {i: step(i, lambda c, i=i: c.masked_input(vectors[i], routed[i])) for i in ids if i != 8}
    survivors, dropped = server.collect_masked(masked)
    total = server.unmask({i: step(i, lambda c: c.unmask(survivors, dropped)) for i in survivors})
    _assert_within_bound(total, vectors[3] + vectors[21], 2)
    with pytest.raises(SecAggError, match="client state is malformed"):
        SecAggClient.from_bytes(b"{not json")


def test_benchmark_reports_steps_and_error():
    result = benchmark(2000, 3)
    for key in ("masked_input_s", "server_unmask_s", "share_keys_s", "total_s", "server_unmask_one_dropped_s"):
        assert result[key] >= 0.0
    assert result["masked_bytes"] == 3 * 2000 * 8
    assert result["max_abs_error"] <= result["error_bound"] + 1e-12
    assert result["max_abs_error_one_dropped"] <= quantization_error_bound(2, 24) + 1e-12


def test_share_with_a_different_threshold_rejected():
    ids = [0, 1, 2]
    server = SecAggServer(ids, SecAggParams(threshold=2), 4, SESSION)
    clients = {i: SecAggClient(i, ids, SecAggParams(threshold=3 if i == 2 else 2), SESSION) for i in ids}
    broadcast = server.collect_keys({i: c.advertise_keys() for i, c in clients.items()})
    routed = server.route_shares({i: c.share_keys(broadcast) for i, c in clients.items()})
    with pytest.raises(
        SecAggError, match="client 2: share of the self-mask seed of client 0 has threshold 2, expected 3"
    ):
        clients[2].masked_input(np.zeros(4), routed[2])
