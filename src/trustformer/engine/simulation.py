"""Flower's Simulation Engine (Ray backend): the same ``ServerApp`` and ``ClientApp`` with virtual clients.

``runtime.engine = "simulation"`` (``trustformer run --engine simulation``). The ServerApp runs in a thread of
this process; every message to a virtual client runs the ClientApp in a Ray worker process (an actor). Ray runs
``floor(CPUs / runtime.client_cpus)`` actors at once (each reserves ``runtime.client_gpus`` GPUs), on a local Ray
with ``runtime.ray_cpus`` CPUs or on the existing cluster at ``runtime.ray_address`` (several machines).

What differs from the in-process engine, and why:

- Flower gives each virtual client only ``partition-id`` and ``num-partitions`` as its node config, and a
  client's messages may run in any actor: each client keeps its state on disk under ``<out>/client-state``,
  writes its outputs under ``<out>/client-<id>`` and its model under ``<out>/models`` (``runtime/client.py``:
  ``node_defaults``), and no client reports ``fedavg_distance`` (it needs every client's model in one process).
- ``secure.mode`` with ``tee`` is refused at load: a client's trust anchors come from its own node config, which
  the Simulation Engine cannot set per client; ``secagg`` runs. ``federation.faults`` (the in-process grid's)
  are refused too, and so is centralized training (one client: run it in process).
- Messages reach the clients through Ray, not Flower's protobuf wire; the bytes counted are still those of
  Flower's serialization of each message's content (``wire.payload_bytes``), so they equal the in-process ones.

The Python entry point of Flower's engine that takes a run configuration is the internal ``_run_simulation``
(the public ``run_simulation`` passes none; ``flower_internals.start_simulation`` wraps it); it reads the apps'
configuration key from an app folder's ``pyproject.toml``, which :func:`~trustformer.deploy.fab.write_app`
writes into ``<out>/.flower-app``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.serverapp import Grid, ServerApp

from .. import app as apps
from ..config import CONFIG_KEY, ConfigError, RunConfig
from ..deploy.fab import write_app
from ..errors import UncheckedConfigError
from ..flower_internals import SUPERLINK_NODE_ID, simulation_run, start_simulation, task_identity
from ..registry import protocol_spec
from ..runtime.client_nodes import expected_nodes
from ..tasks.run import load_task
from ..wire import FederationError


def backend_config(cfg: RunConfig) -> dict[str, Any]:
    """Flower's backend config: each virtual client's resources, and the Ray to use (local or a cluster)."""
    rt = cfg.runtime
    init_args = {"address": rt.ray_address} if rt.ray_address else {"num_cpus": rt.ray_cpus or os.cpu_count() or 1}
    return {"client_resources": {"num_cpus": rt.client_cpus, "num_gpus": rt.client_gpus}, "init_args": init_args}


def run_simulation(cfg: RunConfig) -> dict[str, Any]:
    """Run a whole federation on the Simulation Engine; returns the summary (also written to ``cfg.out``)."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "runtime.engine = 'simulation' needs Flower's simulation extra: "
            "pip install 'flwr[simulation]==1.41.0' (it brings Ray)"
        )
    if protocol_spec(cfg.federation.strategy).pools_data:  # refused at load (config/run.py)
        raise UncheckedConfigError(
            f"federation.strategy = {cfg.federation.strategy!r} trains one client on every shard: run "
            "it with runtime.engine = 'inprocess'"
        )
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    load_task(cfg)  # data problems surface here, before Ray starts
    out = Path(cfg.out)
    if not cfg.runtime.resume:  # a fresh run: no client may pick up the snapshots of an earlier run here
        shutil.rmtree(out / "client-state", ignore_errors=True)
    run_config: dict[str, bool | float | int | str] = {CONFIG_KEY: cfg.to_json()}
    run_id = int(time.time_ns() % (1 << 62))
    failure: list[BaseException] = []
    server_app = ServerApp()

    @server_app.main()
    def server(grid: Grid, context: Context) -> None:  # the apps' own server, its error kept for the caller
        try:
            apps.server_main(grid, context)
        except BaseException as exc:
            failure.append(exc)
            raise

    started = time.time()
    with task_identity(run_id):
        start_simulation(
            num_supernodes=expected_nodes(cfg),
            client_app=apps.client_app,
            server_app=server_app,
            backend_config=backend_config(cfg),
            server_app_context=Context(
                run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=run_config
            ),
            app_dir=str(write_app(out / ".flower-app")),
            run=simulation_run(run_id, run_config),
        )
    if failure:
        raise failure[0]
    summary = out / "summary.json"
    if not summary.exists() or summary.stat().st_mtime < started:
        raise FederationError("the simulation ended without writing summary.json: see Flower's log above")
    return json.loads(summary.read_text(encoding="utf-8"))


__all__ = ["backend_config", "run_simulation"]
