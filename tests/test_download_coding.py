"""Download coding (``federation.download_bits``): every client ends with exactly the server's delivered state, the
server's error feedback keeps the model on the uncoded run's track, catch-ups are exact, and the bytes counted are
those of the coded messages. Every test goes through the real in-process runtime and the real codec."""

from pathlib import Path

import pytest
import torch
from helpers import jsonl

from trustformer.config import ConfigError, load_config
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import ProtocolObserver, observe
from trustformer.protocols.wrappers.download import HELD, REPLAY, CodedDownload
from trustformer.runtime.checkpoint import read_checkpoint, read_server_state
from trustformer.runtime.store import DiskStore

BASE = {
    "federation.rounds": 4,
    "runtime.progress": False,
    "runtime.store": "disk",
    "eval.meteor": False,
    "eval.bertscore": False,
    "eval.bleu_size": 4,
}


def run(tmp_path, name, **values):
    cfg = load_config("tiny", None, {**BASE, **values, "out": str(tmp_path / name)})
    return cfg, run_in_process(cfg)


def delivered_state(cfg):
    """The server's delivered state, from the last checkpoint (the download layer is the outermost wrapper)."""
    state = read_server_state(cfg.out, read_checkpoint(cfg.out))["protocol"]
    assert state["class"] == "CodedDownload"
    return state["state"]["delivered"], state["state"]["delivered_round"]


def held_states(cfg):
    """Each client's held state and the round it last applied, from its state on disk."""
    root = next((Path(cfg.out) / "client-state").iterdir())
    store = DiskStore(root)
    out = {}
    for client in range(cfg.federation.clients):
        saved = store.load(f"client-{client}")  # its latest snapshot
        assert saved is not None, f"no state of client {client}"
        out[client] = {n[len(HELD) :]: t for n, t in saved.protocol.items() if n.startswith(HELD)}
    return out


def lines(cfg):
    return [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" not in r]


def test_every_client_holds_exactly_the_servers_delivered_state(tmp_path):
    """Client sampling (2 of 3): a client left out is caught up with the full delivered state before it trains, and
    every client that applied the last exchange holds the server's copy to the bit."""
    cfg, _summary = run(tmp_path, "coded", **{"federation.download_bits": 2, "federation.clients_per_round": 2})
    delivered, rnd = delivered_state(cfg)
    assert rnd == cfg.federation.rounds
    last = {x["client"] for x in lines(cfg) if x["round"] == rnd and x.get("sampled", True)}
    held = held_states(cfg)
    assert len(last) == 2
    for client in last:
        assert set(held[client]) == set(delivered)
        assert all(torch.equal(held[client][n], delivered[n]) for n in delivered), client


def _some_client_differs(cfg) -> bool:
    """Whether a client that applied the last exchange holds anything but the server's delivered state."""
    delivered, rnd = delivered_state(cfg)
    last = {x["client"] for x in lines(cfg) if x["round"] == rnd and x.get("sampled", True)}
    held = held_states(cfg)
    assert last and all(set(held[c]) == set(delivered) for c in last)
    return any(not all(torch.equal(held[c][n], delivered[n]) for n in delivered) for c in last)


def test_a_catch_up_in_float32_decoded_against_the_wrong_reference_is_seen(tmp_path, monkeypatch):
    """The planted bug: a client caught up with the full state keeps its stale held state (decodes the next download
    against it)."""
    original = CodedDownload.client_start_from

    def stale(self, session, model):
        return self.inner.catching_up().client_start_from(session, model)  # the held state is not refreshed

    monkeypatch.setattr(CodedDownload, "missed_messages", lambda self, version: None)  # always the full state
    monkeypatch.setattr(CodedDownload, "client_start_from", stale)
    cfg, _summary = run(tmp_path, "stale", **{"federation.download_bits": 2, "federation.clients_per_round": 2})
    monkeypatch.setattr(CodedDownload, "client_start_from", original)
    assert _some_client_differs(cfg)


def test_a_replayed_catch_up_decoded_against_the_wrong_reference_is_seen(tmp_path, monkeypatch):
    """The planted bug: a client catching up with the coded messages it missed decodes them against the initial
    model instead of the state it holds."""
    original = CodedDownload.client_start_from

    def from_initial(self, session, model):
        if any(n.startswith(REPLAY) for n in model):
            for name in [n for n in session.protocol_state if n.startswith(HELD)]:
                del session.protocol_state[name]
        return original(self, session, model)

    monkeypatch.setattr(CodedDownload, "client_start_from", from_initial)
    cfg, _summary = run(
        tmp_path,
        "stale",
        **{"federation.download_bits": 2, "federation.clients_per_round": 1, "federation.rounds": 6},
    )
    monkeypatch.undo()
    assert _some_client_differs(cfg)


def test_a_client_that_missed_rounds_replays_the_coded_messages_when_they_are_fewer_bytes(tmp_path, monkeypatch):
    """One client of three per round: the others catch up with the coded messages they missed, decoded in turn.
    The run is the same, to the bit, as one whose catch-ups send the full state in float32, for fewer bytes."""
    values = {"federation.download_bits": 2, "federation.clients_per_round": 1, "federation.rounds": 6}
    cfg, replayed = run(tmp_path, "replayed", **values)
    assert not _some_client_differs(cfg)
    monkeypatch.setattr(CodedDownload, "missed_messages", lambda self, version: None)
    full_cfg, full = run(tmp_path, "full", **values)
    assert replayed["test_loss"] == full["test_loss"]
    assert all(
        torch.equal(a, b)
        for a, b in zip(delivered_state(cfg)[0].values(), delivered_state(full_cfg)[0].values(), strict=True)
    )
    assert replayed["bytes"]["down_total"] < 0.8 * full["bytes"]["down_total"]


class Aggregates(ProtocolObserver):
    """Every exact aggregate the server's protocol returned (inside the coding layers)."""

    def __init__(self):
        self.seen = []

    def server_aggregated(self, aggregate):
        self.seen.append({n: t.detach().clone() for n, t in aggregate.items()})


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_the_servers_residual_keeps_what_clients_hold_near_the_uncoded_model(tmp_path, monkeypatch):
    """2-bit downloads, 6 rounds: the server adds the coding error it has not delivered yet to the next difference
    (EF21-P), so the state the clients hold stays within about one round's coding error of the uncoded run's model.
    The planted bug drops that residual: each round's error stays in the clients' model, they add up, and the test
    loss drifts from the uncoded run's with them."""
    rounds = {"federation.rounds": 6}
    with observe(Aggregates()) as aggregates:
        _cfg, plain = run(tmp_path, "plain", **rounds)
    uncoded = aggregates.seen[-1]

    def distance(cfg) -> float:
        delivered, _rnd = delivered_state(cfg)
        return float(sum(((delivered[n].double() - uncoded[n].double()) ** 2).sum() for n in delivered).sqrt())

    coded_cfg, coded = run(tmp_path, "coded", **rounds, **{"federation.download_bits": 2})
    monkeypatch.setattr(CodedDownload, "exact_model", lambda self, view: {n: t.double() for n, t in view.items()})
    dropped_cfg, dropped = run(tmp_path, "dropped", **rounds, **{"federation.download_bits": 2})
    honest, planted = distance(coded_cfg), distance(dropped_cfg)
    print(
        f"|delivered - uncoded|: {honest:.3f} with the residual, {planted:.3f} without; test loss "
        f"{plain['test_loss'][0]:.4f} uncoded, {coded['test_loss'][0]:.4f}, {dropped['test_loss'][0]:.4f}"
    )
    assert planted > 3 * honest, (honest, planted)
    loss_gap = abs(coded["test_loss"][0] - plain["test_loss"][0])
    assert abs(dropped["test_loss"][0] - plain["test_loss"][0]) > 3 * loss_gap  # the loss drifts with it


@pytest.mark.parametrize(("memberships", "kept"), [("rotating", False), ("shared", True)])
def test_the_residual_is_kept_only_where_a_coordinate_means_the_same_thing_every_round(tmp_path, memberships, kept):
    """Trustformer's centroids regroup at every exchange unless memberships are shared: a residual carried to the
    next round would land on another group, so the server keeps none there (and rounds stochastically)."""
    values = {"federation.strategy": "trustformer", "trustformer.memberships": memberships}
    cfg, _summary = run(tmp_path, memberships, **values, **{"federation.download_bits": 2, "federation.rounds": 2})
    state = read_server_state(cfg.out, read_checkpoint(cfg.out))["protocol"]["state"]
    assert bool(state["residual"]) is kept
    assert not _some_client_differs(cfg)


def test_the_download_bytes_are_the_coded_messages(tmp_path):
    _cfg, plain = run(tmp_path, "plain", **{"federation.rounds": 2})
    _cfg, coded = run(tmp_path, "coded", **{"federation.rounds": 2, "federation.download_bits": 2})
    # the upload is the same model (its reply carries one more timing field: the download's decoding time)
    assert coded["bytes"]["up_total"] == pytest.approx(plain["bytes"]["up_total"], rel=1e-3)
    ratio = coded["bytes"]["down_total"] / plain["bytes"]["down_total"]
    assert ratio < 0.25, ratio  # 2 bits of 32, plus the grids and the record's framing


@pytest.mark.parametrize("strategy", ["fedavg-topk", "dp-fedavg", "fedpc", "local"])
def test_download_coding_is_refused_where_it_does_not_compose(strategy):
    values = {"federation.strategy": strategy, "federation.download_bits": 4}
    if strategy == "fedpc":
        values.update({"task": "image-classification", "image.dataset": "digits"})
    with pytest.raises(ConfigError, match=r"federation.download_bits = 4 does not apply"):
        load_config("tiny", None, values)
