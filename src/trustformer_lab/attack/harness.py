"""The attack harness: a federation run in this process under the observer (:func:`observed_run`), and the
reconstruction attack on it (:func:`run_attack`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trustformer.config import RunConfig, load_config
from trustformer.protocols import bare, make_protocol, observe
from trustformer.protocols.interface.base import Tensors
from trustformer.registry import protocol_spec

from .run_observer import Exchange, RunRecorder
from .scoring import SECAGG_MODES, attack


def _initial(cfg: RunConfig) -> Tensors:
    from trustformer.protocols.interface.base import trainable_tensors
    from trustformer.tasks.run import load_task

    return trainable_tensors(load_task(cfg).initial_model())


def _final_models(cfg: RunConfig, names: Sequence[str]) -> Exchange:
    """A run without exchanges: every client's model after the last round, from its state on disk."""
    from trustformer.core.shared import ALL_SHARDS
    from trustformer.runtime.checkpoint import run_key
    from trustformer.runtime.store import ROUND_END, DiskStore

    store = DiskStore(Path(cfg.out) / "client-state" / run_key(cfg))
    pooled = protocol_spec(cfg.federation.strategy).pools_data
    clients = [ALL_SHARDS] if pooled else list(range(cfg.federation.clients))
    received: dict[int, Tensors] = {}
    ex = Exchange(cfg.federation.rounds, received=received)
    for client in clients:
        state = store.load(
            "all" if client == ALL_SHARDS else f"client-{client}", upto=(cfg.federation.rounds, ROUND_END)
        )
        if state is None:
            raise RuntimeError(f"client {client} left no state in {store.root}")
        ex.trained[client] = {n: state.model[n].detach().clone() for n in names}
        received[client] = {}  # the dict ex.received holds
    return ex


@dataclass
class ObservedRun:
    """A federation run in this process under the attack harness's observer: its summary and every exchange."""

    cfg: RunConfig
    summary: dict[str, Any]
    wall_s: float
    initial: Tensors
    exchanges: list[Exchange]
    protocol: Any  # the bare protocol (inside coding and differential privacy)
    unmatched: int = 0


def observed_run(cfg: RunConfig) -> ObservedRun:
    """Run the federation ``cfg`` in this process and record what every party held (see the module docstring)."""
    from trustformer.engine.inprocess import run_in_process

    exchanges_model = make_protocol(cfg).spec.exchanges
    if not exchanges_model and cfg.runtime.store != "disk":  # the truth is read from the clients' state on disk
        cfg = load_config(cfg.preset, None, {**cfg.flat(), "runtime.store": "disk"})
    recorder = RunRecorder()
    started = time.perf_counter()
    with observe(recorder):
        summary = run_in_process(cfg)
    wall_s = time.perf_counter() - started
    initial = _initial(cfg)
    exchanges = list(recorder.exchanges.values()) if exchanges_model else [_final_models(cfg, list(initial))]
    return ObservedRun(cfg, summary, wall_s, initial, exchanges, bare(make_protocol(cfg)), recorder.unmatched)


def run_attack(cfg: RunConfig, run: ObservedRun | None = None) -> dict[str, Any]:
    """Run the federation ``cfg`` in this process (or take ``run``) and attack it; returns the result."""
    run = run if run is not None else observed_run(cfg)
    cfg, summary = run.cfg, run.summary
    result = attack(cfg, run.initial, run.exchanges, run.protocol)
    result.update(
        strategy=cfg.federation.strategy,
        secure=cfg.secure.mode,
        wall_s=run.wall_s,
        test_loss=summary.get("test_loss"),
        up_bytes_per_client_per_round=summary.get("bytes", {}).get("up_per_client_per_round"),
    )
    run_fields = protocol_spec(cfg.federation.strategy).run_fields
    if run_fields is not None:
        result.update(run_fields(cfg))
    if run.unmatched and cfg.secure.mode not in SECAGG_MODES:  # under secagg the aggregation sees only the mean
        result["unmatched_payloads"] = run.unmatched
    return result


__all__ = ["ObservedRun", "observed_run", "run_attack"]
