"""Every composition the configuration accepts resumes exactly, wherever it is killed: a run killed at a message of
the round loop and resumed with ``runtime.resume`` ends with the uninterrupted run's metrics, to the bit.

Two axes are generated. The compositions (``compositions.py``): every protocol alone, with each option, and with
each pair of options. The kill points (:func:`kill_points`): every message type the composition's uninterrupted
run sends in each of its rounds (``train``, ``train.payload``, ``train.apply``, the secure channel's
``query.secagg`` phases, the final ``evaluate``), at its first, second, middle and last message of that round, so
that some kills fall after some clients already trained or applied the round. Runs have 3 rounds: the first, a
middle and the last; with client sampling (``2 of 3``) some client sits out a round before a later kill. A kill
stops the whole in-process run (as a killed server would) and forgets what the process held (as a restarted one
would): the resumed run has only the checkpoint and the clients' stores.

A run of the suite takes the pairs that once failed (``PINNED``) and a seeded sample of compositions, each with
a kill point drawn from its own run (``TRUSTFORMER_MATRIX_SEED``, printed; ``TRUSTFORMER_MATRIX_SAMPLE`` of
them); ``TRUSTFORMER_MATRIX=full`` (``pytest tests/test_resume_matrix.py``) takes every composition at
every kill point and prints the size of the product.

Planted bugs show that the matrix sees what it guards: each declared piece of server state left out of the
checkpoint, each piece of client state kept in the process instead of the store, and a store that forgets the
snapshot a client that sat out a round resumes from.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from compositions import Composition, compositions, sample
from helpers import Crash, forget_process, jsonl
from helpers import crash_at as kill_at

from trustformer.app import client_app
from trustformer.config import load_config
from trustformer.engine.inprocess import run_in_process
from trustformer.registry import protocol_spec
from trustformer.runtime import store as store_module
from trustformer.runtime.checkpoint import read_checkpoint, resume_config
from trustformer.runtime.store import ClientState, DiskStore
from trustformer.wire import EVALUATE

SEED = int(os.environ.get("TRUSTFORMER_MATRIX_SEED", "0"))
COUNT = int(os.environ.get("TRUSTFORMER_MATRIX_SAMPLE", "2"))
FULL = os.environ.get("TRUSTFORMER_MATRIX") == "full"
MATRIX = compositions()
BY_LABEL = {c.label: c for c in MATRIX}


@dataclass(frozen=True)
class KillPoint:
    """The run is killed when the ``after + 1``-th message of type ``message`` of round ``round`` is delivered:
    ``after`` of them were handled (the final ``evaluate`` carries the last round's number)."""

    round: int
    message: str
    after: int

    def __str__(self) -> str:
        return f"{self.message} #{self.after + 1} of round {self.round}"


# The pairs that resumed with another result once: server state not yet checkpointed (killed in round 2), and a
# client that sat out round 2 whose store had dropped the snapshot a re-sent round 3 starts from.
PINNED: tuple[tuple[str, KillPoint], ...] = (
    ("fedavg + 4-bit", KillPoint(2, "train", 1)),
    ("trustformer + 4-bit", KillPoint(2, "train", 1)),
    ("fedavg-topk + 2 of 3", KillPoint(3, "train.apply", 1)),
    ("fedavg + 2 of 3", KillPoint(3, "train.apply", 1)),
    ("fedavg + down 4-bit + 2 of 3", KillPoint(3, "train.apply", 1)),
    ("fedavg + 2 of 3", KillPoint(1, "train", 1)),
    ("fedavg + 2 of 3", KillPoint(3, EVALUATE, 4)),
    ("fedavg + secagg", KillPoint(2, "query.secagg", 4)),
    # the server optimizer's moments, step count and x_t, checkpointed after round 1, with a client sitting out
    ("fedavg + adam + 2 of 3", KillPoint(2, "train", 1)),
)
PINNED_SLOW: tuple[tuple[str, KillPoint], ...] = (  # once failed too; the slow tier keeps them
    ("fedavg + 2-bit", KillPoint(2, "train", 1)),
    ("trustformer + 4-bit + shared", KillPoint(2, "train", 1)),
    ("fedavg + 4-bit + public+lora", KillPoint(2, "train", 1)),
    ("fedavg + 2 of 3 + record dp", KillPoint(3, "train.apply", 1)),
)


def traced(log: list[tuple[str, str]]):
    """The client app, recording (group id, message type) of every message it is delivered."""

    def call(message, context):
        log.append((message.metadata.group_id, message.metadata.message_type))
        return client_app(message, context)

    return call


def crash_at(point: KillPoint):
    """The client app that kills the run at ``point``."""
    return kill_at(point.message, point.round, after=point.after)


def kill_points(trace: list[tuple[str, str]]) -> list[KillPoint]:
    """Every message type of every round the run sent (not the connection's ``identify`` queries), at its first,
    second, middle and last message."""
    counts = Counter((int(group), kind) for group, kind in trace if group.isdigit())
    points = set()
    for (rnd, kind), n in counts.items():
        points |= {KillPoint(rnd, kind, after) for after in {0, 1, n // 2, n - 1} if after < n}
    return sorted(points, key=lambda p: (p.round, p.message == EVALUATE, p.message, p.after))


_forget_process = forget_process  # helpers.forget_process: a test plants a process that forgets less


def results(run_dir):
    """metrics.jsonl without wall-clock measurements and the resume event."""
    lines = jsonl(os.path.join(run_dir, "metrics.jsonl"))
    return [
        {k: v for k, v in line.items() if not k.endswith("_s") and k not in ("elapsed", "eta")}
        for line in lines
        if line.get("event") != "resumed"
    ]


# summary.json fields that are wall-clock measurements, paths, or the resume itself
NOT_RESULTS = {"config", "machine", "versions", "time_s", "round_time_s", "server_time_s", "throughput", "models"}
NOT_RESULTS |= {"resumed_after_rounds", "translations"}


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if not k.endswith("_s") and k != "seconds"}
    return value


def summary_results(summary):
    out = {k: _without_timings(v) for k, v in summary.items() if k not in NOT_RESULTS}
    out["events"] = [e for e in summary.get("events", []) if e.get("event") != "resumed"]
    return out


@dataclass
class Uninterrupted:
    out: Path
    summary: dict[str, Any]
    points: list[KillPoint]


_uninterrupted: dict[str, Uninterrupted] = {}


def uninterrupted(composition: Composition, folder: Path) -> Uninterrupted:
    """The composition's uninterrupted run (once per test session) and the kill points its messages give."""
    if composition.label not in _uninterrupted:
        trace: list[tuple[str, str]] = []
        out = folder / "full"
        summary = run_in_process(
            load_config("tiny", None, {**composition.overrides, "out": str(out)}), client_app=traced(trace)
        )
        _uninterrupted[composition.label] = Uninterrupted(out, summary, kill_points(trace))
    return _uninterrupted[composition.label]


def killed_and_resumed(folder: Path, overrides: dict[str, Any], point: KillPoint) -> dict[str, Any]:
    """Run ``overrides`` killed at ``point``, forget the process, resume from the checkpoint (that of the round
    before the kill's); the resumed summary."""
    stopped = load_config("tiny", None, {**overrides, "out": str(folder)})
    try:
        run_in_process(stopped, client_app=crash_at(point))
    except Crash:
        pass
    else:
        raise AssertionError(f"the run never reached its kill point {point}")
    forget_process()
    completed = stopped.federation.rounds if point.message == EVALUATE else point.round - 1
    assert read_checkpoint(stopped.out).round == completed, point
    resumed = run_in_process(resume_config(stopped.out))
    assert resumed["resumed_after_rounds"] == [completed], point
    return resumed


def differences(full: Uninterrupted, resumed: dict[str, Any], folder: Path) -> list[str]:
    """What the resumed run got otherwise than the uninterrupted one (empty: identical)."""
    found = []
    if resumed["test_loss"] != full.summary["test_loss"]:
        found.append(f"test loss {resumed['test_loss']} against {full.summary['test_loss']}")
    if results(folder) != results(full.out):
        found.append("metrics.jsonl")
    if summary_results(resumed) != summary_results(full.summary):
        found.append("summary.json")
    return found


def drawn_point(composition: Composition, points: list[KillPoint]) -> KillPoint:
    return random.Random(f"{SEED}:{composition.label}").choice(points)


def _case_id(case: Any) -> str:
    label, point = case
    return f"{label} @ {point or 'drawn'}"


def _suite_cases() -> list[tuple[str, KillPoint | None]]:
    """PINNED, and COUNT more compositions drawn with SEED, each at a kill point drawn from its run (None)."""
    drawn = sample([c for c in MATRIX if c.label not in {label for label, _p in PINNED}], COUNT, SEED)
    return [*PINNED, *((c.label, None) for c in drawn)]


def _slow_cases() -> list[Any]:
    """The slow tier (``-m slow``): PINNED_SLOW, and SLOW_COUNT more compositions drawn with another seed, one kill
    point each."""
    taken = {label for label, _p in (*_suite_cases(), *PINNED_SLOW)}
    drawn = sample([c for c in MATRIX if c.label not in taken], SLOW_COUNT, SEED + 1000)
    cases = [*PINNED_SLOW, *((c.label, None) for c in drawn)]
    return [pytest.param(label, p, marks=pytest.mark.slow, id=f"{_case_id((label, p))} (slow)") for label, p in cases]


SLOW_COUNT = int(os.environ.get("TRUSTFORMER_MATRIX_SLOW_SAMPLE", "24"))
CASES: list[Any] = [(c.label, None) for c in MATRIX] if FULL else [*_suite_cases(), *_slow_cases()]
print(
    f"resume matrix: {len(CASES)} of {len(MATRIX)} compositions x kill points "
    f"({'every kill point of each' if FULL else f'one kill point each, {SLOW_COUNT} of them in the slow tier'}; "
    f"TRUSTFORMER_MATRIX_SEED={SEED}; TRUSTFORMER_MATRIX=full for the whole product)"
)


@pytest.mark.parametrize(("label", "point"), CASES, ids=[None if hasattr(c, "id") else _case_id(c) for c in CASES])
def test_a_killed_run_resumes_exactly(tmp_path_factory, label, point):
    composition = BY_LABEL[label]
    full = uninterrupted(composition, tmp_path_factory.mktemp("run"))
    if point is not None:
        assert point in full.points, f"{label} sends no {point}: its kill points are {list(map(str, full.points))}"
    points = full.points if FULL and point is None else [point or drawn_point(composition, full.points)]
    if FULL:
        print(f"{label}: {len(full.points)} kill points")
    for kill in points:
        print(f"resume matrix: {label} killed at {kill}")
        folder = tmp_path_factory.mktemp("stopped")
        resumed = killed_and_resumed(folder, composition.overrides, kill)
        assert not differences(full, resumed, folder), f"{label} killed at {kill}: {differences(full, resumed, folder)}"


def test_kill_points_cover_every_message_of_every_round():
    trace = [("identify", "query")] + [(str(r), t) for r in (1, 2, 3) for t in ("train",) * 3 + ("train.apply",) * 2]
    trace += [("3", EVALUATE)] * 4
    points = kill_points(trace)
    assert {(p.round, p.message) for p in points} == {(r, t) for r in (1, 2, 3) for t in ("train", "train.apply")} | {
        (3, EVALUATE)
    }
    assert {p.after for p in points if p.message == "train"} == {0, 1, 2}
    assert {p.after for p in points if p.message == EVALUATE} == {0, 1, 2, 3}


# ----------------------------------------------------------------------------------- planted bugs: server state

# Every declared server state attribute, and a composition whose resume needs it: with the attribute left out of
# the checkpoint, that composition must resume with another result (else the matrix could not see it missing).
NEEDED_BY = {
    ("FedAvg", "latest"): "fedavg + 2 of 3",
    ("FedAvgTopK", "global_model"): "fedavg-topk + 2 of 3",
    ("FedAvgTopK", "latest_round"): "fedavg-topk + 2 of 3",
    ("Trustformer", "public"): "trustformer + 4-bit",
    ("FedPC", "epoch"): "fedpc",
    ("FedPC", "last"): "fedpc",
    ("FedPC", "before"): "fedpc",
    ("FedPC", "costs"): "fedpc",
    ("FedPC", "pilots"): "fedpc",
    ("Phong", "model"): "phong",
    ("Phong", "orders"): "phong",
    ("Scaffold", "control"): "scaffold",
    ("CodedPayload", "reference"): "fedavg + 4-bit",
    ("CodedDownload", "delivered"): "fedavg + down 4-bit",
    ("CodedDownload", "delivered_round"): "fedavg + down 4-bit + 2 of 3",
    ("CodedDownload", "recent"): "fedavg + down 4-bit + 2 of 3",
    ("CodedDownload", "residual"): "fedavg + down 4-bit",
    ("RobustAggregation", "_start"): "fedavg + sign-flip",
    ("RobustAggregation", "_start_round"): "fedavg + 2 of 3 + median",
    ("RobustAggregation", "_aggregations"): "fedavg + flame",
    ("RobustAggregation", "_root_optimizer"): "fedavg + fltrust",
    ("RobustAggregation", "_finetune_optimizer"): "fedavg + root finetune",
    ("DifferentialPrivacy", "ledger"): "dp-fedavg",
    ("DifferentialPrivacy", "clip"): "dp-fedavg + adaptive",
    ("DifferentialPrivacy", "clip_history"): "dp-fedavg + adaptive",
    ("ServerOptimization", "model"): "fedavg + adam",
    ("ServerOptimization", "model_round"): "fedavg-topk + adam + 2 of 3",
    ("ServerOptimization", "first_moment"): "fedavg + adam",
    ("ServerOptimization", "second_moment"): "fedavg + adam",
    ("ServerOptimization", "steps"): "fedavg + adam",
}
SERVER_KILL = KillPoint(2, "train", 1)  # after round 1's checkpoint, with some clients trained in round 2
DROPS = sorted(NEEDED_BY) if FULL else random.Random(SEED).sample(sorted(NEEDED_BY), min(COUNT // 2, len(NEEDED_BY)))


def declared_state():
    """(class name, attribute) of every state attribute a protocol or wrapper class declares."""
    from trustformer.protocols import make_protocol
    from trustformer.protocols.interface.state import STATE

    found = set()
    for composition in MATRIX:
        protocol = make_protocol(load_config("tiny", None, {**composition.overrides, "out": ""}))
        while protocol is not None:
            found |= {(type(protocol).__name__, a) for a in vars(type(protocol)).get(STATE, ())}
            protocol = getattr(protocol, "inner", None)
    return found


def test_every_declared_state_has_a_composition_that_needs_it():
    assert declared_state() == set(NEEDED_BY)
    assert set(NEEDED_BY.values()) <= set(BY_LABEL)


def _resume_is_seen(tmp_path_factory, composition: Composition, point: KillPoint, what: str) -> None:
    """A planted bug is seen: the resumed run fails, or differs from the uninterrupted one."""
    full = uninterrupted(composition, tmp_path_factory.mktemp("run"))
    folder = tmp_path_factory.mktemp("stopped")
    try:
        resumed = killed_and_resumed(folder, composition.overrides, point)
    except Exception as exc:  # noqa: BLE001 - a resumed run that fails has shown the missing state too
        print(f"{what}: the resumed run failed ({type(exc).__name__}: {exc})")
        return
    assert differences(full, resumed, folder), f"{composition.label} resumed exactly with {what}"


@pytest.mark.parametrize("drop", DROPS, ids=[f"{c}.{a}" for c, a in DROPS])
def test_a_state_left_out_of_the_checkpoint_is_seen(tmp_path_factory, monkeypatch, drop):
    """The planted bug: one declared attribute is not saved (declared scratch instead). The resume must differ."""
    from trustformer.protocols import make_protocol
    from trustformer.protocols.interface.state import declared

    name, attribute = drop
    composition = BY_LABEL[NEEDED_BY[drop]]
    uninterrupted(composition, tmp_path_factory.mktemp("run"))  # before the plant
    protocol = make_protocol(load_config("tiny", None, {**composition.overrides, "out": ""}))
    while type(protocol).__name__ != name:
        protocol = protocol.inner
    cls = next(c for c in type(protocol).__mro__ if attribute in vars(c).get("state_attrs", ()))
    monkeypatch.setattr(cls, "state_attrs", tuple(a for a in cls.state_attrs if a != attribute))
    monkeypatch.setattr(cls, "scratch_attrs", (*declared(cls, "scratch_attrs"), attribute))
    point = SERVER_KILL if protocol_spec(composition.strategy).pools_data is False else KillPoint(2, "train", 0)
    _resume_is_seen(tmp_path_factory, composition, point, f"{name}.{attribute} left out of the checkpoint")


# ----------------------------------------------------------------------------------- planted bugs: client state

# Each piece of what a client keeps between rounds (its store's snapshot: the model, the optimizer's state and
# every protocol-state entry, by name up to its second "/"), with a composition that holds it and a kill point
# after which a client must read it back. The planted bug keeps that piece in the process instead of the store:
# an uninterrupted run cannot tell, a restarted one must.
CLIENT_PIECES: dict[str, tuple[str, KillPoint]] = {
    "model": ("fedavg + 2 of 3", KillPoint(3, "train.apply", 1)),
    "optimizer": ("fedavg", KillPoint(2, "train", 1)),
    "coded/residual": ("fedavg + 2-bit", KillPoint(2, "train", 1)),
    "coded/reference": ("fedavg + 2-bit", KillPoint(2, "train", 1)),
    "download/held": ("fedavg + down 4-bit + 2 of 3", KillPoint(3, "train.apply", 1)),
    "global": ("trustformer + local", KillPoint(3, "train", 1)),
    "residual": ("fedavg-topk", KillPoint(2, "train", 1)),
    "previous": ("fedpc", KillPoint(3, "train", 1)),
    "scaffold/c": ("scaffold", KillPoint(2, "train", 1)),  # c, sent with round 1's aggregate
    "scaffold/c_i": ("scaffold", KillPoint(2, "train", 1)),  # c_i, from round 1's local training
    "rlr/global": ("fedavg + secagg + rlr", KillPoint(2, "train", 1)),  # the start its next signs are measured from
    "older snapshots": ("fedavg + 2 of 3", KillPoint(3, "train.apply", 1)),
    # round scratch: written by a round's ``train`` and read only by that round's later messages. A resumed run
    # sends the killed round again from its start, so these never need to survive a kill: the plant must leave
    # the run exact (and fails, to be moved above, the day one of them is read in a later round).
    "labels": ("trustformer + local", KillPoint(3, "train.apply", 1)),
    "local": ("trustformer + local", KillPoint(3, "train.apply", 1)),
    "fedpc": ("fedpc", KillPoint(1, "train.payload", 1)),  # fedpc/lr, α_k of Eq. 4 in the first epoch
}
ROUND_SCRATCH = {"labels", "local", "fedpc"}
CLIENT_DROPS = (
    sorted(CLIENT_PIECES)
    if FULL
    else random.Random(SEED + 1).sample(sorted(CLIENT_PIECES), min(COUNT // 2, len(CLIENT_PIECES)))
)


def piece_of(key: str) -> str:
    """The piece a protocol-state entry belongs to: its name less the tensor's (``coded/residual/<tensor>``)."""
    return key.rsplit("/", 1)[0]


def test_every_piece_of_client_state_has_a_plant(tmp_path_factory):
    """The store of each composition the plants name holds no piece that CLIENT_PIECES lacks."""
    found = set()
    for label in {label for label, _p in CLIENT_PIECES.values()}:
        out = uninterrupted(BY_LABEL[label], tmp_path_factory.mktemp("run")).out
        for path in (out / "client-state").glob("*/client-[0-9]*/r*.pt"):
            found |= {piece_of(k) for k in torch.load(path, weights_only=True)["protocol"]}
    assert found <= set(CLIENT_PIECES), found - set(CLIENT_PIECES)


class ProcessHeld:
    """The planted bug: ``piece`` of every snapshot stays in this process (lost with it), not in the store."""

    def __init__(self, piece: str) -> None:
        self.piece = piece
        self.held: dict[str, Any] = {}
        self._save, self._load = DiskStore.save, DiskStore.load

    def save(self, store: DiskStore, client: str, state: ClientState, at=None) -> None:
        if at is not None:
            state = ClientState(dict(state.model), dict(state.optimizer), dict(state.protocol), state.rounds_done)
            if self.piece in ("model", "optimizer"):
                self.held[client] = getattr(state, self.piece)
                setattr(state, self.piece, {})
            else:
                self.held[client] = {k: v for k, v in state.protocol.items() if piece_of(k) == self.piece}
                state.protocol = {k: v for k, v in state.protocol.items() if piece_of(k) != self.piece}
        self._save(store, client, state, at)

    def load(self, store: DiskStore, client: str, upto=None) -> ClientState | None:
        state = self._load(store, client, upto)
        if state is not None and upto is not None and client in self.held:
            if self.piece in ("model", "optimizer"):
                setattr(state, self.piece, self.held[client])
            else:
                state.protocol.update(self.held[client])
        return state


@pytest.mark.parametrize("piece", CLIENT_DROPS)
def test_a_client_state_kept_out_of_the_store_is_seen(tmp_path_factory, monkeypatch, piece):
    label, point = CLIENT_PIECES[piece]
    composition = BY_LABEL[label]
    uninterrupted(composition, tmp_path_factory.mktemp("run"))  # before the plant
    if piece == "older snapshots":  # the store as it was: snapshots older than the previous round dropped
        monkeypatch.setattr(store_module, "_kept", _previous_round_only)
    else:
        plant = ProcessHeld(piece)
        monkeypatch.setattr(DiskStore, "save", lambda self, client, state, at=None: plant.save(self, client, state, at))
        monkeypatch.setattr(DiskStore, "load", lambda self, client, upto=None: plant.load(self, client, upto))

        def forget() -> None:  # the process that held the piece is gone
            _forget_process()
            plant.held.clear()

        monkeypatch.setitem(globals(), "forget_process", forget)
    what = f"{piece} kept out of the client's store"
    if piece in ROUND_SCRATCH:
        full = uninterrupted(composition, tmp_path_factory.mktemp("run"))
        folder = tmp_path_factory.mktemp("stopped")
        resumed = killed_and_resumed(folder, composition.overrides, point)
        assert not differences(full, resumed, folder), f"{what}: round scratch read after the kill?"
    else:
        _resume_is_seen(tmp_path_factory, composition, point, what)


def _previous_round_only(points, saved):
    return [p for p in points if p <= saved and p[0] >= saved[0] - 1]


def test_the_matrix_covers_every_protocol_and_option():
    from compositions import AXES

    from trustformer.registry import PROTOCOLS

    assert {c.strategy for c in MATRIX} == set(PROTOCOLS)
    used = {label for c in MATRIX for label in c.options}
    assert used == {label for options in AXES.values() for label in options}
    assert all(label in BY_LABEL for label, _point in (*PINNED, *PINNED_SLOW))
    assert {label for label, _point in CLIENT_PIECES.values()} <= set(BY_LABEL)
