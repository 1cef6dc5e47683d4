"""What a node of the run is, apart from its message handlers. Every process, the server's and each client's: torch's
threads and the progress lines (:func:`process_setup`). A client node: its client id (data partition), where it keeps
its state (memory or disk, ``runtime.store``) and its node settings (output folders), with the engines' defaults."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context

from ..config import RunConfig, build_config
from ..core.shared import ALL_SHARDS
from ..tasks.run import initial_tensors
from ..wire import FederationError
from .checkpoint import CheckpointError, check_same_run, read_checkpoint, run_key
from .cores import free_cores, usable_cores
from .store import DiskStore, MemoryStore

log = logging.getLogger(__name__)
DEPLOYED_PROCESSES = ("flwr-serverapp", "flwr-clientapp")  # Flower starts one per run / message


_chosen_threads: int | None = None  # decided once per process: later, its own training would count as busy


def torch_threads(configured: int) -> int:
    """``runtime.threads``, or for 0 the free cores (``cores.py``: a torch thread on a busy core stalls the others),
    decided once per process and logged when busy cores leave fewer threads than cores."""
    global _chosen_threads
    if configured:
        return configured
    if _chosen_threads is None:
        threads, busy = free_cores()
        usable = len(usable_cores())
        if threads < usable:
            log.warning(
                "runtime.threads = 0: %.1f of %d cores are busy with other processes; training on %d thread(s), since "
                "a torch thread on a busy core stalls the others (set runtime.threads to choose)",
                busy,
                usable,
                threads,
            )
        _chosen_threads = threads
    return _chosen_threads


def process_setup(cfg: RunConfig, log_file: Path | None = None) -> None:
    """Torch threads from ``runtime.threads`` (0: the free cores, ``cores.py``). In a process Flower's deployment
    runtime started, also the progress lines: to stderr (a SuperNode's log) and ``log_file`` (the ServerApp's
    ``server.log``, since Flower keeps a ServerApp's own output for ``flwr log``)."""
    threads = torch_threads(cfg.runtime.threads)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    root = logging.getLogger("trustformer")
    if Path(sys.argv[0]).name not in DEPLOYED_PROCESSES or root.handlers or not cfg.runtime.progress:
        return
    formatter = logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


_memory_stores: dict[int, MemoryStore] = {}


def memory_store(run_id: int) -> MemoryStore:
    """The in-process state store of a run (shared by its in-process clients)."""
    return _memory_stores.setdefault(run_id, MemoryStore())


def release_memory_store(run_id: int) -> None:
    _memory_stores.pop(run_id, None)


def client_id(context: Context) -> int:
    """The client (data partition) this node is, from its node config's ``partition-id``."""
    if "partition-id" not in context.node_config:
        raise FederationError("node_config has no 'partition-id' (which data shard this client owns)")
    return int(context.node_config["partition-id"])


def keeps_state_on_disk(cfg: RunConfig) -> bool:
    """``runtime.store``: disk, memory, or (auto) disk when the run writes checkpoints (``runtime.checkpoint``,
    the default: a run that can be resumed keeps its clients' state where the resume finds it) or when every
    client's state would not fit in ``runtime.memory_budget_mb`` (a model and two optimizer moments per snapshot,
    two snapshots per client); the simulation engine's clients live in several processes, so their state is
    always on disk."""
    if cfg.runtime.engine == "simulation" or cfg.runtime.store != "auto":
        return cfg.runtime.engine == "simulation" or cfg.runtime.store == "disk"
    if cfg.runtime.checkpoint:
        return True
    params = sum(t.numel() for t in initial_tensors(cfg).values())
    return cfg.federation.clients * params * 4 * 3 * 2 > cfg.runtime.memory_budget_mb * 2**20


def check_resumable(cfg: RunConfig, nodes: list[dict[str, Any]]) -> None:
    """Refuse (CheckpointError) to resume ``cfg.out`` in this process unless every client finds the state it
    ended the checkpointed round with: the run that wrote the checkpoint kept its clients' state on disk, this one
    does too, and each client that applied an aggregate has a snapshot in its node's ``state-dir``. A client
    without its state would start from the initial model and fresh optimizer moments, silently giving another
    run than the one checkpointed."""
    checkpoint = read_checkpoint(cfg.out)
    check_same_run(checkpoint, cfg)  # another configuration is named as such, before its state is looked for
    recorded = build_config({**checkpoint.config, "out": str(cfg.out)})
    for which, run in (("the interrupted run", recorded), ("this resume", cfg)):
        if not keeps_state_on_disk(run):
            raise CheckpointError(
                f"cannot resume {cfg.out}: in {which} the clients keep their state in memory "
                f"(runtime.store = {run.runtime.store}, runtime.checkpoint = {str(run.runtime.checkpoint).lower()}), "
                "where no resume can find it; start the run again (--overwrite), with runtime.store = auto or "
                "disk to make it resumable"
            )
    for node in nodes:
        client = int(node["partition-id"])
        applied = checkpoint.synced.get(str(client), 0)
        state_dir = node.get("state-dir")
        if not applied or not state_dir:
            continue
        key = "all" if client == ALL_SHARDS else f"client-{client}"
        if not DiskStore(Path(str(state_dir)) / run_key(cfg)).points(key):
            raise CheckpointError(
                f"cannot resume {cfg.out}: client {client} applied round {applied}'s aggregate, but its state is not "
                f"in {state_dir}; without it the run would not continue as it was. Restore that folder, or start "
                "the run again (--overwrite)"
            )


def node_defaults(cfg: RunConfig, client: int) -> dict[str, str]:
    """Where a client keeps its state and writes its outputs when its node config does not say (the engines set
    these for their virtual clients; a deployed SuperNode sets its own)."""
    name = "client-all" if client == ALL_SHARDS else f"client-{client}"
    out = Path(cfg.out)
    defaults = {"output-dir": str(out / name), "models-dir": str(out / "models")}
    if keeps_state_on_disk(cfg):
        defaults["state-dir"] = str(out / "client-state")
    return defaults


def client_store(cfg: RunConfig, context: Context) -> MemoryStore | DiskStore:
    """Node config ``state-dir``: state on disk under ``<state-dir>/<run key>/``; else the run's memory store
    (the simulation engine: always on disk, under ``<out>/client-state``)."""
    state_dir = context.node_config.get("state-dir")
    if not state_dir and cfg.runtime.engine == "simulation":
        state_dir = node_defaults(cfg, client_id(context))["state-dir"]
    return DiskStore(Path(str(state_dir)) / run_key(cfg)) if state_dir else memory_store(context.run_id)


def node_setting(cfg: RunConfig, context: Context, key: str) -> str | None:
    """A node config entry (``output-dir``, ``models-dir``); on the simulation engine, its default."""
    value = context.node_config.get(key)
    if value is None and cfg.runtime.engine == "simulation":
        value = node_defaults(cfg, client_id(context)).get(key)
    return str(value) if value else None


__all__ = [
    "torch_threads",
    "DEPLOYED_PROCESSES",
    "process_setup",
    "client_id",
    "check_resumable",
    "client_store",
    "keeps_state_on_disk",
    "memory_store",
    "node_defaults",
    "node_setting",
    "release_memory_store",
]
