"""Per-client state stores: a client's model, optimizer and protocol state between rounds.

Flower's ``context.state`` silently loses large state in deployment, so a client keeps its state
in one of these: :class:`MemoryStore` for the in-process runtime, :class:`DiskStore` (one folder per
client, atomic writes) for separate processes and for runs that must survive a restart.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class ClientState:
    """Everything a client keeps between rounds. Tensors only (loadable with ``weights_only``)."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    protocol: dict[str, torch.Tensor] = field(default_factory=dict)
    rounds_done: int = 0


class MemoryStore:
    """Keeps deep copies of each client's state in this process."""

    def __init__(self) -> None:
        self._states: dict[str, ClientState] = {}

    def load(self, client: str) -> ClientState | None:
        state = self._states.get(client)
        return copy.deepcopy(state) if state is not None else None

    def save(self, client: str, state: ClientState) -> None:
        self._states[client] = copy.deepcopy(state)


class DiskStore:
    """One ``state.pt`` per client folder, replaced atomically so a crash mid-write loses nothing."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, client: str) -> Path:
        return self.root / client / "state.pt"

    def load(self, client: str) -> ClientState | None:
        path = self._path(client)
        if not path.exists():
            return None
        raw = torch.load(path, map_location="cpu", weights_only=True)
        return ClientState(**raw)

    def save(self, client: str, state: ClientState) -> None:
        path = self._path(client)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".state-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(state.__dict__, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
