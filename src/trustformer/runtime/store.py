"""Per-client state stores: a client's model, optimizer and protocol state between rounds.

Flower's ``context.state`` silently loses large state in deployment, so a client keeps its state
in one of these: :class:`MemoryStore` for the in-process runtime, :class:`DiskStore` (one folder per
client, atomic writes) for separate processes and for runs that must survive a restart.

Snapshots make a re-sent message idempotent. A client saves its state at a point of the round loop,
``(round, TRAINED)`` right after local training of an exchange round or ``(round, ROUND_END)`` at the
end of its round, and a message loads the latest snapshot at or before the point it starts from:
``train`` of round r loads ``(r - 1, ROUND_END)``, ``train.apply`` of round r loads ``(r, TRAINED)``,
the final ``evaluate`` loads ``(last round, ROUND_END)``. Saving a snapshot drops every later one (a
re-run of round r replaces what a first attempt left) and every one older than the last earlier round the
client took part in, so a store keeps at most two rounds: the current one and the one a re-sent ``train``
starts from (which, for a client that sat out rounds, is older than the previous round). A server resumed
from its round-r checkpoint can therefore send round r + 1 again to clients that had already trained it, and
they compute the same.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TRAINED, ROUND_END = 0, 1  # points within a round, in order
_PHASE_NAMES = {TRAINED: "trained", ROUND_END: "end"}
_SNAPSHOT_FILE = re.compile(r"^r(\d+)-(trained|end)\.pt$")
LATEST = "state.pt"  # the single-slot state of save() without a snapshot point

Point = tuple[int, int]  # (round, TRAINED | ROUND_END); round 0 = before round 1


@dataclass
class ClientState:
    """Everything a client keeps between rounds. Tensors only (loadable with ``weights_only``)."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    protocol: dict[str, torch.Tensor] = field(default_factory=dict)
    rounds_done: int = 0


def _check_point(at: Point) -> Point:
    rnd, phase = at
    if rnd < 0 or phase not in _PHASE_NAMES:
        raise ValueError(f"snapshot point {at!r}: expected (round >= 0, TRAINED or ROUND_END)")
    return int(rnd), int(phase)


def _kept(points: list[Point], saved: Point) -> list[Point]:
    """The points that stay after saving ``saved``: none later, and of the earlier rounds only the last one the
    client saved in. A server resumed from its checkpoint of round ``saved[0] - 1`` sends round ``saved[0]`` again,
    and its ``train`` loads the latest snapshot at or before ``(saved[0] - 1, ROUND_END)``: for a client that sat
    out that round (client sampling), a snapshot of an older round, which must still be there."""
    earlier = [p[0] for p in points if p[0] < saved[0]]
    since = max(earlier, default=saved[0])
    return [p for p in points if p <= saved and p[0] >= since]


class MemoryStore:
    """Keeps deep copies of each client's state in this process."""

    def __init__(self) -> None:
        self._states: dict[str, ClientState] = {}
        self._snapshots: dict[str, dict[Point, ClientState]] = {}

    def load(self, client: str, upto: Point | None = None) -> ClientState | None:
        """The latest snapshot at or before ``upto`` (None: the latest one, or the single-slot state)."""
        snapshots = self._snapshots.get(client, {})
        points = sorted(p for p in snapshots if upto is None or p <= _check_point(upto))
        if points:
            return copy.deepcopy(snapshots[points[-1]])
        if upto is None and client in self._states:
            return copy.deepcopy(self._states[client])
        return None

    def save(self, client: str, state: ClientState, at: Point | None = None) -> None:
        """Save the single-slot state, or (``at`` given) a snapshot at that point of the round loop."""
        if at is None:
            self._states[client] = copy.deepcopy(state)
            return
        at = _check_point(at)
        snapshots = self._snapshots.setdefault(client, {})
        snapshots[at] = copy.deepcopy(state)
        for point in set(snapshots) - set(_kept(list(snapshots), at)):
            del snapshots[point]

    def points(self, client: str) -> list[Point]:
        return sorted(self._snapshots.get(client, {}))


class DiskStore:
    """One folder per client: ``r<round>-trained.pt`` / ``r<round>-end.pt`` snapshots (and ``state.pt``,
    the single-slot state), each written to a temporary file and renamed, so a crash mid-write loses
    nothing."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _dir(self, client: str) -> Path:
        return self.root / client

    @staticmethod
    def _name(at: Point) -> str:
        return f"r{at[0]:05d}-{_PHASE_NAMES[at[1]]}.pt"

    def points(self, client: str) -> list[Point]:
        """The snapshot points on disk for ``client``, in order."""
        folder = self._dir(client)
        if not folder.is_dir():
            return []
        found = []
        for path in folder.iterdir():
            match = _SNAPSHOT_FILE.match(path.name)
            if match:
                found.append((int(match.group(1)), TRAINED if match.group(2) == "trained" else ROUND_END))
        return sorted(found)

    def load(self, client: str, upto: Point | None = None) -> ClientState | None:
        """The latest snapshot at or before ``upto`` (None: the latest one, or the single-slot state)."""
        points = [p for p in self.points(client) if upto is None or p <= _check_point(upto)]
        if points:
            path = self._dir(client) / self._name(points[-1])
        elif upto is None and (self._dir(client) / LATEST).exists():
            path = self._dir(client) / LATEST
        else:
            return None
        raw = torch.load(path, map_location="cpu", weights_only=True)
        return ClientState(**raw)

    def save(self, client: str, state: ClientState, at: Point | None = None) -> None:
        """Save the single-slot state, or (``at`` given) a snapshot at that point of the round loop."""
        folder = self._dir(client)
        folder.mkdir(parents=True, exist_ok=True)
        if at is None:
            self._write(folder / LATEST, state)
            return
        at = _check_point(at)
        self._write(folder / self._name(at), state)
        points = self.points(client)
        for point in set(points) - set(_kept(points, at)):
            (folder / self._name(point)).unlink(missing_ok=True)

    @staticmethod
    def _write(path: Path, state: ClientState) -> None:
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
