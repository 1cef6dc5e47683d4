"""Attestation: the measurement, quotes (wrong measurement, expired, foreign), keys, `trustformer attest`."""

import os
import time
from functools import partial

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from helpers import tiny_config

from trustformer.cli import main
from trustformer.secure.attestation import (
    AttestationError,
    Quote,
    generate_signing_key,
    load_signing_key,
    load_trusted_key,
    measured_sources,
    measurement,
    sign_quote,
    verify_quote,
    write_key_pair,
)
from trustformer.secure.tee import SoftwareTEE

RUN, CLIENT = 42, 1


tiny = partial(tiny_config, defaults={"federation.strategy": "trustformer", "secure.mode": "tee"})


@pytest.fixture(scope="module")
def cfg():
    return tiny()


@pytest.fixture()
def setting(cfg):
    """An emulated aggregator and a client's fresh nonce and key, as in the query.attest exchange."""
    signing_key = generate_signing_key()
    tee = SoftwareTEE(signing_key, measurement(cfg), RUN, quote_validity_s=60.0)
    nonce, secret = os.urandom(32), X25519PrivateKey.generate()
    client_key = secret.public_key().public_bytes_raw()
    body, signature = tee.quote(CLIENT, nonce, client_key)
    return dict(signing_key=signing_key, tee=tee, nonce=nonce, client_key=client_key, body=body, signature=signature)


def verify(setting, cfg, body=None, signature=None, **changes):
    args = dict(
        trusted_key=setting["signing_key"].public_key(),
        nonce=setting["nonce"],
        client_key=setting["client_key"],
        run_id=RUN,
        client=CLIENT,
        expected_measurement=measurement(cfg),
    )
    args.update(changes)
    return verify_quote(body or setting["body"], signature or setting["signature"], **args)


def test_measurement_covers_code_and_protocol_config_only(cfg):
    assert measurement(cfg) == measurement(tiny())
    assert len(measurement(cfg)) == 64
    for key, value in [
        ("trustformer.beta", 0.25),
        ("federation.rounds", 3),
        ("secure.mode", "tee+secagg"),
        ("trustformer.weighting", "data_size"),
        ("federation.agg_every", 2),
    ]:
        assert measurement(tiny(**{key: value})) != measurement(cfg), key
    for key, value in [
        ("out", "elsewhere"),
        ("train.lr", 0.01),
        ("secure.expected_measurement", "0" * 64),
        ("secure.quote_validity_s", 5.0),
        ("runtime.threads", 2),
    ]:
        assert measurement(tiny(**{key: value})) == measurement(cfg), key
    files = measured_sources()
    assert {"app.py", "core/aggregation.py", "protocols/trustformer.py", "secure/sealing.py"} <= set(files)
    assert {"runtime/server.py", "runtime/rounds.py"} <= set(files) and files == sorted(files)


def test_valid_quote_verifies(setting, cfg):
    quote = verify(setting, cfg)
    assert quote.measurement == measurement(cfg) and quote.run_id == RUN and quote.client == CLIENT
    assert quote.enclave_key == setting["tee"].public_key.hex() and quote.backend == "software-emulation"


def test_wrong_measurement_names_attestation_and_both_measurements(setting, cfg):
    other = tiny(**{"trustformer.beta": 0.25})
    with pytest.raises(AttestationError) as info:
        verify(setting, cfg, expected_measurement=measurement(other))
    text = str(info.value)
    assert "attestation failed" in text and measurement(other) in text and measurement(cfg) in text
    assert text.index(measurement(other)) < text.index(measurement(cfg))  # expected first, then quoted


def test_expired_and_future_quotes_are_rejected(setting, cfg):
    with pytest.raises(AttestationError, match="expired"):
        verify(setting, cfg, now=time.time() + 120)
    with pytest.raises(AttestationError, match="in the future"):
        verify(setting, cfg, now=time.time() - 3600)


def test_foreign_quotes_are_rejected(setting, cfg):
    with pytest.raises(AttestationError, match="signature does not verify"):  # another aggregator's key
        verify(setting, cfg, trusted_key=generate_signing_key().public_key())
    with pytest.raises(AttestationError, match="for run 42, this is run 43"):
        verify(setting, cfg, run_id=RUN + 1)
    with pytest.raises(AttestationError, match="for client 1, this is client 2"):
        verify(setting, cfg, client=2)
    with pytest.raises(AttestationError, match="another nonce"):  # a quote replayed to another handshake
        verify(setting, cfg, nonce=os.urandom(32))
    with pytest.raises(AttestationError, match="another nonce or client key"):
        verify(setting, cfg, client_key=X25519PrivateKey.generate().public_key().public_bytes_raw())
    # a quote for another run, correctly signed by the trusted key, is still foreign
    quote = Quote.from_bytes(setting["body"])
    foreign = Quote(**{**quote.__dict__, "run_id": RUN + 5})
    body, signature = sign_quote(setting["signing_key"], foreign)
    with pytest.raises(AttestationError, match="for run 47"):
        verify(setting, cfg, body=body, signature=signature)


def test_tampered_or_malformed_quotes_are_rejected(setting, cfg):
    body = bytearray(setting["body"])
    body[body.index(b'"client":1') + 9] = ord("2")
    with pytest.raises(AttestationError, match="signature"):
        verify(setting, cfg, body=bytes(body))
    for bad in (b"not json", b'{"measurement": 1}', b"[]"):
        with pytest.raises(AttestationError, match="malformed"):
            verify(setting, cfg, body=bad, signature=setting["signing_key"].sign(b"trustformer quote v1\0" + bad))


def test_key_files_round_trip_and_hex_public_keys(tmp_path):
    private_path, public_path = write_key_pair(tmp_path / "keys" / "agg")
    assert oct(private_path.stat().st_mode & 0o777) == "0o600"
    key = load_signing_key(private_path)
    assert load_trusted_key(public_path).public_bytes_raw() == key.public_key().public_bytes_raw()
    hex_file = tmp_path / "agg.hex"
    hex_file.write_text(key.public_key().public_bytes_raw().hex() + "\n")
    assert load_trusted_key(hex_file).public_bytes_raw() == key.public_key().public_bytes_raw()
    with pytest.raises(AttestationError, match="not an unencrypted PEM private key"):
        load_signing_key(public_path)
    with pytest.raises(FileNotFoundError, match="secure.trusted_key"):
        load_trusted_key(tmp_path / "missing.pub")


def test_attest_command_prints_the_measurement_first(tmp_path, capsys):
    args = ["attest", "--preset", "tiny", "--strategy", "trustformer", "--secure", "tee"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == measurement(tiny()) and "emulation" in out[1]
    assert main([*args, "--set", "trustformer.beta=0.25"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == measurement(tiny(**{"trustformer.beta": 0.25}))
    assert main([*args, "--keygen", str(tmp_path / "agg")]) == 0
    assert (tmp_path / "agg.key").exists() and (tmp_path / "agg.pub").exists()
    assert main([*args, "--keygen", str(tmp_path / "agg")]) == 2  # never overwrites a key
    assert "refusing to overwrite" in capsys.readouterr().err


def test_the_measurement_covers_every_runtime_module_of_the_round_loop():
    """The round loop's own runtime modules (what runtime/server.py and runtime/rounds.py import from runtime/, and
    what those import in turn) are measured: a module split off the loop must join MEASURED_FILES."""
    import ast
    from pathlib import Path

    import trustformer
    from trustformer.secure.attestation import MEASURED_FILES

    root = Path(trustformer.__file__).parent
    todo, seen = ["runtime/server.py", "runtime/rounds.py"], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse((root / path).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                todo.append(f"runtime/{node.module.replace('.', '/')}.py")
    assert seen <= set(MEASURED_FILES), sorted(seen - set(MEASURED_FILES))
    assert {"runtime/replies.py", "runtime/client_nodes.py"} <= seen
