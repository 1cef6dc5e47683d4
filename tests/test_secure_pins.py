"""Trust anchors belong to the client: the aggregator key it trusts and the measurement it requires come
from its own node config, never from the run config the server submits."""

from functools import partial

import pytest
from helpers import jsonl, tiny_config

from trustformer.app import FederationError, client_app
from trustformer.engine.inprocess import run_in_process
from trustformer.secure.attestation import measurement, write_key_pair

TINY = {  # this module's tiny run (helpers.tiny_config)
    "federation.rounds": 1,
    "secure.mode": "tee",
    "eval.bleu_size": 2,
    "eval.meteor": False,
    "eval.bertscore": False,
}
tiny = partial(tiny_config, defaults=TINY)


def watch(log):
    """The real ClientApp; every message it receives and what its replies carry are logged."""

    def call(message, context):
        reply = client_app(message, context)
        log.append((message.metadata.message_type, set(reply.content) if reply.has_content() else set()))
        return reply

    return call


def refused_before_any_payload(cfg, pins, pattern):
    log = []
    with pytest.raises(FederationError, match=pattern):
        run_in_process(cfg, client_app=watch(log), node_config=pins)
    assert {kind for kind, _ in log} <= {"query", "query.attest"}  # no train message reached a client
    assert not any(keys & {"payload", "secure"} for _, keys in log)  # no payload left one


def test_a_server_submitting_its_own_key_is_refused(tmp_path):
    _honest_key, honest_pub = write_key_pair(tmp_path / "honest")
    evil_key, evil_pub = write_key_pair(tmp_path / "evil")
    # the server signs with a key of its own and names it in the run config it submits
    cfg = tiny(tmp_path, "key", **{"secure.signing_key": str(evil_key), "secure.trusted_key": str(evil_pub)})
    pins = {"trusted-key": str(honest_pub), "expected-measurement": measurement(cfg)}
    refused_before_any_payload(cfg, pins, r"attestation failed for 3 of 3.*signature")


def test_a_server_submitting_its_own_measurement_is_refused(tmp_path):
    key, pub = write_key_pair(tmp_path / "aggregator")
    agreed = tiny(tmp_path, "agreed", **{"federation.strategy": "trustformer", "trustformer.beta": 0.5})
    # the server runs another protocol configuration and submits the measurement that matches it
    other = tiny(
        tmp_path,
        "other",
        **{"federation.strategy": "trustformer", "trustformer.beta": 0.25, "secure.signing_key": str(key)},
    )
    served = tiny(
        tmp_path,
        "served",
        **{
            "federation.strategy": "trustformer",
            "trustformer.beta": 0.25,
            "secure.signing_key": str(key),
            "secure.expected_measurement": measurement(other),
        },
    )
    pins = {"trusted-key": str(pub), "expected-measurement": measurement(agreed)}
    refused_before_any_payload(
        served,
        pins,
        r"attestation failed for 3 of 3.*measurement does not match.*"
        r"node config 'expected-measurement'",
    )
    # the honest server with the agreed configuration passes the same client's checks
    honest = tiny(
        tmp_path,
        "honest",
        **{"federation.strategy": "trustformer", "trustformer.beta": 0.5, "secure.signing_key": str(key)},
    )
    summary = run_in_process(honest, node_config=pins)
    assert summary["secure"]["counts"]["attestations"] == 3


@pytest.mark.parametrize(
    "missing, pattern",
    [
        ({"attestation-public-key": ""}, "pins no aggregator key.*--trusted-key"),
        ({"expected-measurement": ""}, "pins no aggregator measurement.*--expected-measurement"),
    ],
)
def test_a_client_without_its_own_pins_sends_nothing(tmp_path, missing, pattern):
    key, pub = write_key_pair(tmp_path / "aggregator")
    # the run config names the right key and measurement: the client still refuses without pins of its own
    cfg = tiny(tmp_path, "x", **{"secure.signing_key": str(key), "secure.trusted_key": str(pub)})
    cfg = tiny(
        tmp_path,
        "x",
        **{"secure.signing_key": str(key), "secure.trusted_key": "", "secure.expected_measurement": measurement(cfg)},
    )
    refused_before_any_payload(cfg, missing, pattern)


def test_the_metrics_of_a_sealed_exchange_travel_sealed(tmp_path):
    """With tee, a train reply says in clear only which client, which round and how many examples (the
    seal binds them); its training measurements are inside the sealed record, which the aggregator opens."""
    clear = []

    def call(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "train":
            clear.append(dict(reply.content["metrics"]))
        return reply

    cfg = tiny(tmp_path, "sealed-metrics", **{"federation.rounds": 2})
    run_in_process(cfg, client_app=call)
    assert len(clear) == 6
    for metrics in clear:
        assert set(metrics) - {"secure_train_seal_s"} == {"client", "round", "num_examples"}

    rows = jsonl(f"{cfg.out}/metrics.jsonl")
    assert len(rows) == 6 and all("event" not in r for r in rows)
    assert all(r["train_loss"] > 0 and r["steps"] > 0 and "train_s" in r for r in rows)  # opened by the aggregator
