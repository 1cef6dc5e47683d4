"""End-to-end secure exchange on the tiny preset: tee, secagg, tee+secagg, attestation failures,
tampering, replay and a client dropping out after the masking setup."""

from functools import partial

import numpy as np
import pytest
import torch
from helpers import jsonl, tiny_config

from trustformer.app import FederationError, client_app
from trustformer.cli import main
from trustformer.config import ConfigError
from trustformer.engine.inprocess import run_in_process
from trustformer.secure.attestation import measurement, write_key_pair
from trustformer.secure.sealing import REJECTED_TAG
from trustformer.wire import from_array_record

TINY = {  # this module's tiny run (helpers.tiny_config)
    "federation.strategy": "trustformer",
    "eval.diagnostics": True,
}
tiny = partial(tiny_config, defaults=TINY)


def read_metrics(cfg):
    lines = jsonl(f"{cfg.out}/metrics.jsonl")
    return [x for x in lines if "event" not in x], [x for x in lines if "event" in x]


class Intercept:
    """Stands in for the ClientApp: sees (and may alter) every delivered message and every reply."""

    def __init__(self, before=None, after=None):
        self.before, self.after = before, after
        self.seen: list[tuple[int, str, int | None]] = []
        self.aggregates: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def __call__(self, message, context):
        client = int(context.node_config["partition-id"])
        kind = message.metadata.message_type
        config = message.content.get("config", {})
        rnd = int(config["round"]) if "round" in config else None
        self.seen.append((client, kind, rnd))
        if kind == "train.apply" and "aggregate" in message.content:
            self.aggregates[(rnd, client)] = from_array_record(message.content["aggregate"])
        if self.before is not None:
            self.before(client, kind, rnd, message)
        reply = client_app(message, context)
        if self.after is not None:
            self.after(client, kind, rnd, reply)
        return reply


def flip_sealed(content) -> None:
    sealed = bytearray(content["secure"]["sealed"])
    sealed[len(sealed) // 2] ^= 0x01
    content["secure"]["sealed"] = bytes(sealed)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    spy = Intercept()
    cfg = tiny(tmp, "none")
    return cfg, run_in_process(cfg, client_app=spy), spy


def test_tee_changes_no_number_and_reports_counts_and_overhead(tmp_path, plain):
    plain_cfg, plain_summary, _ = plain
    cfg = tiny(tmp_path, "tee", **{"secure.mode": "tee"})
    spy = Intercept()
    summary = run_in_process(cfg, client_app=spy)
    assert summary["test_loss"] == plain_summary["test_loss"]  # sealing changes no number
    rows, events = read_metrics(cfg)
    plain_rows, _ = read_metrics(plain_cfg)
    assert events == [] and [r["test_loss"] for r in rows] == [r["test_loss"] for r in plain_rows]
    secure = summary["secure"]
    assert secure["mode"] == "tee" and secure["emulated"] is True and secure["backend"] == "software-emulation"
    assert secure["measurement"] == measurement(cfg)
    assert secure["attestation_key"].startswith("generated for this run")
    assert secure["counts"] == {"attestations": 3, "sealed": 12, "opened": 12, "rejected": {}}
    assert set(secure["overhead"]["per_round"]) == {"1", "2"} and secure["overhead"]["seconds"] > 0
    for row in rows:
        assert row["seal_s"] > 0 and row["open_s"] > 0 and "payload_overhead_bytes" in row
        assert (row["attest_bytes"] > 0 and row["attest_s"] > 0) if row["round"] == 1 else "attest_bytes" not in row
    # the attestation messages are counted in the round-1 bytes as well
    assert (
        rows[0]["bytes_down"] - plain_rows[0]["bytes_down"] > rows[1]["bytes_down"] - plain_rows[1]["bytes_down"] - 1000
    )
    # clients attest before anything else; no payload travels in clear
    kinds = [k for _c, k, _r in spy.seen if k != "query"]  # "query": which client a node is
    assert kinds[:6] == ["query.attest"] * 6
    assert spy.aggregates == {}


def test_wrong_expected_measurement_stops_the_run_before_any_payload(tmp_path):
    cfg = tiny(tmp_path, "wrong", **{"secure.mode": "tee", "secure.expected_measurement": "0" * 64})
    spy = Intercept()
    with pytest.raises(FederationError) as info:
        run_in_process(cfg, client_app=spy)
    text = str(info.value)
    assert "attestation failed" in text and "0" * 64 in text and measurement(cfg) in text
    assert {kind for _c, kind, _r in spy.seen} <= {"query", "query.attest"}  # no train: nothing left a client
    rows, events = read_metrics(cfg)
    assert rows == [] and len(events) == 3 and all("measurement does not match" in e["reason"] for e in events)


def test_a_foreign_aggregator_key_fails_attestation(tmp_path):
    _private, public = write_key_pair(tmp_path / "other")
    cfg = tiny(tmp_path, "foreign", **{"secure.mode": "tee", "secure.trusted_key": str(public)})
    with pytest.raises(FederationError, match="signature does not verify under the trusted attestation key"):
        run_in_process(cfg)


def test_tampered_and_replayed_messages_are_rejected_counted_and_the_run_goes_on(tmp_path):
    cfg = tiny(tmp_path, "tamper", **{"secure.mode": "tee", "federation.rounds": 3, "federation.min_clients": 1})
    kept: dict[int, bytes] = {}

    def before(client, kind, rnd, message):
        if (client, kind, rnd) == (0, "train.apply", 2):
            flip_sealed(message.content)  # the aggregate to client 0 is tampered with

    def after(client, kind, rnd, reply):
        if kind != "train" or reply.has_error():
            return
        if (client, rnd) == (1, 1):
            flip_sealed(reply.content)  # one bit of client 1's payload
        if (client, rnd) == (2, 1):
            kept[2] = reply.content["secure"]["sealed"]
        if (client, rnd) == (2, 2):
            reply.content["secure"]["sealed"] = kept[2]  # round 1's message resent in round 2

    summary = run_in_process(cfg, client_app=Intercept(before, after))
    rows, events = read_metrics(cfg)
    dropped = {(e["round"], e["client"]): e["reason"] for e in events if e["event"] == "dropped"}
    assert set(dropped) == {(1, 1), (2, 2), (2, 0)}
    assert "invalid payload: " + REJECTED_TAG + " (authentication)" in dropped[(1, 1)]
    assert REJECTED_TAG + " (replay)" in dropped[(2, 2)]
    assert "apply failed" in dropped[(2, 0)] and REJECTED_TAG + " (authentication)" in dropped[(2, 0)]
    assert summary["secure"]["counts"]["rejected"] == {
        "authentication": 1,
        "replay": 1,
        "authentication (by a client)": 1,
    }
    assert sorted(r["client"] for r in rows if r["round"] == 1) == [0, 2]
    assert sorted(r["client"] for r in rows if r["round"] == 2) == [1]
    assert sorted(r["client"] for r in rows if r["round"] == 3) == [0, 1, 2]  # the sessions stay in step


def test_secagg_mean_equals_the_plain_mean_within_the_reported_bound(tmp_path, plain):
    _plain_cfg, plain_summary, plain_spy = plain
    cfg = tiny(tmp_path, "secagg", **{"secure.mode": "secagg"})
    spy = Intercept()
    summary = run_in_process(cfg, client_app=spy)
    secagg = summary["secure"]["secagg"]
    bound = secagg["quantization_error_bound"]
    assert bound == pytest.approx(0.5 / 2**24) and secagg["threshold"] == 2 and secagg["rounds"] == 2
    assert 0 < secagg["measured_max_error"] <= bound + secagg["float64_rounding"]
    assert secagg["float64_rounding"] < 1e-3 * bound
    # round 1 starts from identical local models: the unmasked mean is the plain mean, up to the bound
    # (plus the float32 rounding both aggregates get when cast back to the payload dtype)
    for client in range(3):
        masked, exact = spy.aggregates[(1, client)], plain_spy.aggregates[(1, client)]
        assert masked.keys() == exact.keys()
        for name in exact:
            diff = (masked[name].double() - exact[name].double()).abs().numpy()
            slack = 2 * np.spacing(np.abs(exact[name].numpy()))
            assert np.all(diff <= bound + slack), name
    assert summary["test_loss"] == pytest.approx(plain_summary["test_loss"], abs=1e-4)
    rows, events = read_metrics(cfg)
    assert events == [] and all(r["secagg_bytes"] > 0 and r["secagg_s"] > 0 for r in rows)
    # the masked vector is 64-bit: the payload costs more than the plain float32 one
    assert all(r["payload_overhead_bytes"] > 0 for r in rows)

    both = tiny(tmp_path, "tee+secagg", **{"secure.mode": "tee+secagg"})
    sealed = run_in_process(both)
    assert sealed["test_loss"] == summary["test_loss"]  # sealing the secagg messages changes no number
    counts = sealed["secure"]["counts"]
    assert counts["attestations"] == 3 and counts["rejected"] == {} and counts["sealed"] == counts["opened"] > 0


def test_secagg_survives_a_client_dropping_after_the_masking_setup(tmp_path):
    cfg = tiny(
        tmp_path, "dropout", **{"secure.mode": "secagg", "federation.strategy": "fedavg", "federation.min_clients": 2}
    )

    def before(client, kind, rnd, message):
        if (client, kind, rnd) == (1, "train", 2):  # keys and shares done, then it is gone
            raise RuntimeError("client 1 lost its connection")

    spy = Intercept(before)
    summary = run_in_process(cfg, client_app=spy)
    assert (1, "query.secagg", 2) in spy.seen and spy.seen.count((1, "query.secagg", 2)) == 2  # keys, shares
    rows, events = read_metrics(cfg)
    assert [(e["round"], e["client"]) for e in events] == [(2, 1)]
    assert sorted(r["client"] for r in rows if r["round"] == 2) == [0, 2]
    secagg = summary["secure"]["secagg"]
    assert secagg["dropped_after_setup"] == 1
    assert secagg["measured_max_error"] <= secagg["quantization_error_bound"] + secagg["float64_rounding"]
    losses = summary["test_loss"]
    assert losses[0] == losses[2] != losses[1]  # the two survivors adopted the same mean model


def test_secagg_needs_a_mean_of_payloads_protocol(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"secure.mode = 'secagg' does not support federation.strategy = 'dp-fedavg'"):
        tiny(tmp_path, "x", **{"secure.mode": "secagg", "federation.strategy": "dp-fedavg"})
    with pytest.raises(ConfigError, match="secure.mode"):
        tiny(tmp_path, "x", **{"secure.mode": "sgx"})
    with pytest.raises(ConfigError, match="secure.secagg_threshold = 4"):
        tiny(tmp_path, "x", **{"secure.mode": "secagg", "secure.secagg_threshold": 4})
    with pytest.raises(ConfigError, match="secure.expected_measurement"):
        tiny(tmp_path, "x", **{"secure.mode": "tee", "secure.expected_measurement": "abc"})
    assert main(["run", "--preset", "tiny", "--strategy", "local", "--secure", "secagg"]) == 2
    assert "secure.mode = 'secagg'" in capsys.readouterr().err
