"""What a client node is, apart from its message handlers: its client id (data partition), where it keeps its state
(memory or disk, ``runtime.store``) and its node settings (output folders), with the engines' defaults."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context

from ..config import RunConfig
from ..core.shared import ALL_SHARDS
from ..tasks.run import initial_tensors
from ..wire import FederationError
from .checkpoint import run_key
from .store import DiskStore, MemoryStore

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
    """``runtime.store``: disk, memory, or (auto) disk when every client's state would not fit in
    ``runtime.memory_budget_mb`` (a model and two optimizer moments per snapshot, two snapshots per client);
    the simulation engine's clients live in several processes, so their state is always on disk."""
    if cfg.runtime.engine == "simulation" or cfg.runtime.store != "auto":
        return cfg.runtime.engine == "simulation" or cfg.runtime.store == "disk"
    params = sum(t.numel() for t in initial_tensors(cfg.json).values())
    return cfg.federation.clients * params * 4 * 3 * 2 > cfg.runtime.memory_budget_mb * 2**20


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
    "client_id",
    "client_store",
    "keeps_state_on_disk",
    "memory_store",
    "node_defaults",
    "node_setting",
    "release_memory_store",
]
