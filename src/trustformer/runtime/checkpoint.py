"""The server's round checkpoint, and resuming a stopped run from it.

Before round 1 and after every completed round the server writes the protocol's server state (``server_state``: the
``state_attrs`` every protocol and wrapper declares, nested wrapper by wrapper, tensors included) to
``<out>/server-state-r<round>.pt``, and then replaces the manifest ``<out>/checkpoint.json`` (each written
to a temporary file, synced and renamed): the round number, the run's resolved configuration, every
``metrics.jsonl`` line so far, the client → node map of that round, the round each client last applied
an aggregate in (``synced``), the server phase times, the state file's name and SHA-256, and the wall
time of each round. Only then are older state files removed. A kill at any point leaves a manifest that
names a complete state file of its own round: the run resumes from that round, never from a mix.

Resuming (``runtime.resume = true``, the CLI's ``--resume DIR``) restores all of it: ``metrics.jsonl``
is rewritten up to the end of the checkpointed round (lines of an interrupted round are dropped) and
continues; the protocol's state is loaded with ``state.load_server_state``; the loop starts at the next
round. Client state is not in the checkpoint: each client keeps its own on disk (``runtime.store``),
with per-round snapshots that make a re-sent round compute the same thing again
(``trustformer.runtime.store``). A resumed run therefore ends with the same result as an
uninterrupted one with the same seed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, RunConfig, build_config
from ..errors import TrustformerError
from ..protocols.interface.state import (
    UndeclaredStateError,
    fingerprint,
    load_server_state,
    server_state,
    undeclared_changes,
)

CHECKPOINT_FILE = "checkpoint.json"
STATE_PREFIX = "server-state-r"  # + the round, 5 digits, + ".pt": the protocol's server state of that round
FORMAT = 3  # 3: payload coding keeps the next exchange round's reference, not the last aggregate
# settings that change how a run is carried out, not what it computes: a resumed run may differ in these
OPERATIONAL = {"out", "runtime", "federation.round_timeout_s", "federation.node_wait_s"}


# what to do about a checkpoint that cannot be read back
UNREADABLE = "the run cannot be resumed from it; start it again with --overwrite, or restore the file"


class CheckpointError(TrustformerError, RuntimeError):
    """A run cannot be resumed: no checkpoint, an unreadable one, or one of another configuration."""


@dataclass
class Checkpoint:
    """What the server keeps of a run after a completed round."""

    round: int  # the last completed round
    config: dict[str, Any]  # the run's resolved configuration
    lines: list[dict[str, Any]]  # metrics.jsonl up to the end of that round, in order
    clients: dict[str, int] = field(default_factory=dict)  # client id -> node id in that round
    server_phases: dict[str, float] = field(default_factory=dict)
    state_file: str = ""  # the protocol's server_state() of that round, beside the manifest
    state_sha256: str = ""
    synced: dict[str, int] = field(default_factory=dict)  # client id -> round of the last aggregate it applied
    elapsed_s: float = 0.0  # wall time of the run up to the end of that round
    round_s: list[float] = field(default_factory=list)  # wall time of each completed round
    resumed: list[int] = field(default_factory=list)  # rounds after which the run was resumed
    format: int = FORMAT


def run_key(cfg: RunConfig) -> str:
    """Identifies a run across restarts: its configuration less the operational settings, and its
    output folder. A client keeps its state under ``<state-dir>/<run key>/``, so a SuperNode that
    serves several runs keeps them apart, and a resumed run finds its clients' state again."""
    return _run_key(cfg, os.path.normpath(os.path.abspath(cfg.out or ".")))


@lru_cache(maxsize=16)
def _run_key(cfg: RunConfig, out: str) -> str:
    values = {k: v for k, v in _flat(cfg.to_dict()).items() if not _operational(k)}
    values["out"] = out
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_FILE


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_checkpoint(run_dir: str | Path, checkpoint: Checkpoint, state: dict[str, Any] | None = None) -> Path:
    """Write the round's server ``state`` to its own file, then replace the manifest ``checkpoint.json`` that names
    it, then remove older state files: each step atomic, so a kill leaves the last complete pair."""
    run_dir = Path(run_dir)
    if state is not None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        checkpoint.state_file = f"{STATE_PREFIX}{checkpoint.round:05d}.pt"
        checkpoint.state_sha256 = hashlib.sha256(data).hexdigest()
        _write_atomically(run_dir / checkpoint.state_file, data)
    path = checkpoint_path(run_dir)
    _write_atomically(path, json.dumps(asdict(checkpoint), sort_keys=True, ensure_ascii=False).encode("utf-8"))
    for old in run_dir.glob(f"{STATE_PREFIX}*.pt"):
        if old.name != checkpoint.state_file:
            old.unlink(missing_ok=True)
    return path


def read_server_state(run_dir: str | Path, checkpoint: Checkpoint) -> dict[str, Any] | None:
    """The protocol's server state that ``checkpoint`` names (CheckpointError when missing or altered)."""
    if not checkpoint.state_file:
        return None
    path = Path(run_dir) / checkpoint.state_file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(
            f"{checkpoint_path(run_dir)} names the server state {path.name}, which cannot be read ({exc}): "
            "the run cannot be resumed; start it again"
        ) from None
    if hashlib.sha256(data).hexdigest() != checkpoint.state_sha256:
        raise CheckpointError(
            f"{path} does not match the SHA-256 that {CHECKPOINT_FILE} records: it was altered or is incomplete; "
            "the run cannot be resumed; start it again"
        )
    return torch.load(io.BytesIO(data), weights_only=True)


def read_checkpoint(run_dir: str | Path) -> Checkpoint:
    path = checkpoint_path(run_dir)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not Path(run_dir).is_dir():
            raise CheckpointError(
                f"{run_dir} does not exist: resume takes the output folder (--out) of an interrupted run"
            ) from None
        raise CheckpointError(
            f"{run_dir} holds no {CHECKPOINT_FILE}: it is not the folder of a run started with "
            "runtime.checkpoint = true (a run writes one before its first round); start it again"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{path} is not valid JSON (truncated?): {exc}; {UNREADABLE}") from None
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else None
        raise CheckpointError(
            f"{path} is not a checkpoint of format {FORMAT}"
            + (
                f" (format {found}, written by another version of trustformer); the run cannot be resumed from it; "
                "start it again with --overwrite, or resume it with the version that wrote it"
                if found
                else f"; {UNREADABLE}"
            )
        )
    names = {f.name for f in fields(Checkpoint) if f.init}
    required = {f.name for f in fields(Checkpoint) if f.init and f.default is MISSING and f.default_factory is MISSING}
    missing, unexpected = sorted(required - set(raw)), sorted(set(raw) - names)
    if missing or unexpected:
        what = (
            f"is incomplete (no {', '.join(missing)})" if missing else f"has unknown fields ({', '.join(unexpected)})"
        )
        raise CheckpointError(f"{path} {what}; {UNREADABLE}")
    return Checkpoint(**raw)


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _operational(key: str) -> bool:
    return key in OPERATIONAL or key.split(".", 1)[0] in OPERATIONAL


def check_same_run(checkpoint: Checkpoint, cfg: RunConfig) -> None:
    """Raise ConfigError naming the first setting in which ``cfg`` differs from the checkpointed run."""
    saved, now = _flat(checkpoint.config), _flat(cfg.to_dict())
    for key in sorted(set(saved) | set(now)):
        if _operational(key):
            continue
        if saved.get(key) != now.get(key):
            raise ConfigError(
                f"cannot resume: {key} = {now.get(key)!r} differs from the checkpointed run's "
                f"{saved.get(key)!r} (resume with the run's own configuration: --resume DIR alone)"
            )


def resume_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The configuration of the run checkpointed in ``run_dir``, set to resume there.

    ``overrides`` (dotted keys) may change only operational settings (``runtime.*``, timeouts).
    """
    checkpoint = read_checkpoint(run_dir)
    values = json.loads(json.dumps(checkpoint.config))
    values["out"] = str(Path(run_dir))
    for dotted, value in (overrides or {}).items():
        if not _operational(dotted):
            raise ConfigError(
                f"cannot resume with {dotted} changed: a resumed run keeps the run's configuration "
                "(only runtime.* and federation timeouts may change)"
            )
        target = values
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    values.setdefault("runtime", {})["resume"] = True
    return build_config(values)


class Checkpointer:
    """The server loop's side of checkpoints: restores a resumed run, writes one after every round."""

    def __init__(self, cfg: RunConfig, recorder: Any, protocol: Any) -> None:
        """On resume, call after the protocol's ``server().server_begin``: its state is loaded here."""
        self.cfg = cfg
        self._config = cfg.to_dict()  # what every checkpoint records of the run
        self.recorder = recorder
        self.protocol = protocol
        self.enabled = cfg.runtime.checkpoint
        self.completed = 0
        self.server_phases: Counter[str] = Counter()
        self.round_s: list[float] = []
        self.resumed: list[int] = []
        self.synced: dict[int, int] = {}  # the server's: client -> round of the last aggregate it applied
        self._fingerprints: list[dict[str, str]] | None = None  # undeclared attributes at the last checkpoint
        self.link: Any = None  # the secure link, whose run totals the checkpoint keeps too (attach_link)
        self._saved_link: dict[str, Any] | None = None
        if cfg.runtime.resume:
            self._restore(read_checkpoint(cfg.out))
        self._round_started = time.perf_counter()

    def _restore(self, checkpoint: Checkpoint) -> None:
        check_same_run(checkpoint, self.cfg)
        rec = self.recorder
        with rec.metrics_path.open("w", encoding="utf-8") as fh:
            for line in checkpoint.lines:
                fh.write(json.dumps(line, sort_keys=True, ensure_ascii=False) + "\n")
        rec.records = [line for line in checkpoint.lines if "event" not in line]
        rec.events = [line for line in checkpoint.lines if "event" in line]
        rec.started = time.perf_counter() - checkpoint.elapsed_s
        rec._round_started = time.perf_counter()
        self.completed = checkpoint.round
        self.server_phases.update(checkpoint.server_phases)
        self.round_s = list(checkpoint.round_s)
        self.resumed = [*checkpoint.resumed, checkpoint.round]
        self.synced.update({int(c): int(r) for c, r in checkpoint.synced.items()})
        state = read_server_state(self.cfg.out, checkpoint)
        if state is None:
            raise CheckpointError(f"{checkpoint_path(self.cfg.out)} names no server state: start the run again")
        self._saved_link = state.get("link")
        try:
            load_server_state(self.protocol, state["protocol"])
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"{checkpoint.state_file}: cannot restore {self.protocol.name}: {exc}") from None
        rec.event(
            event="resumed",
            round=checkpoint.round,
            reason=f"resumed after round {checkpoint.round} from {CHECKPOINT_FILE}",
        )

    def start(self, clients: dict[int, int]) -> None:
        """Before round 1 of a new run: the checkpoint of round 0 (the server's state after ``server_begin``), so
        that a run killed in its first round resumes too. The declared-state check starts from round 1's."""
        if self.enabled and not self.cfg.runtime.resume:
            self._write(0, clients, time.perf_counter())

    def round_done(self, rnd: int, clients: dict[int, int]) -> None:
        """After round ``rnd`` completed: write the checkpoint (when ``runtime.checkpoint`` is on)."""
        now = time.perf_counter()
        self.round_s.append(round(now - self._round_started, 4))
        self._round_started = now
        self.completed = rnd
        if not self.enabled:
            return
        self._check_declared_state()
        self._write(rnd, clients, now)

    def _write(self, rnd: int, clients: dict[int, int], now: float) -> None:
        lines = [
            json.loads(line)
            for line in self.recorder.metrics_path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        write_checkpoint(
            self.cfg.out,
            Checkpoint(
                round=rnd,
                config=self._config,
                lines=lines,
                clients={str(c): n for n, c in sorted(clients.items(), key=lambda kv: kv[1])},
                server_phases=dict(self.server_phases),
                synced={str(c): r for c, r in sorted(self.synced.items())},
                elapsed_s=now - self.recorder.started,
                round_s=self.round_s,
                resumed=self.resumed,
            ),
            {
                "protocol": server_state(self.protocol),
                "link": self.link.state_dict() if hasattr(self.link, "state_dict") else None,
            },
        )

    def attach_link(self, link: Any) -> None:
        """The round loop's link: a secure link's run totals (what summary.json["secure"] counts) are checkpointed
        with the protocol's state and restored on resume."""
        self.link = link
        if self._saved_link is not None and hasattr(link, "load_state_dict"):
            link.load_state_dict(self._saved_link)

    def _chain(self) -> list[Any]:
        """The protocol and every protocol it wraps, outermost first."""
        chain, current = [], self.protocol
        while current is not None:
            chain.append(current)
            current = getattr(current, "inner", None)
        return chain

    def _check_declared_state(self) -> None:
        """Refuse a protocol whose undeclared attributes changed since the last checkpoint: state the checkpoint
        would not hold, so a resumed run would silently differ (``protocols/interface/state.py``)."""
        now = [fingerprint(p) for p in self._chain()]
        if self._fingerprints is not None:
            for protocol, before in zip(self._chain(), self._fingerprints, strict=False):
                changed = undeclared_changes(before, protocol)
                if changed:
                    raise UndeclaredStateError(
                        f"{type(protocol).__name__} changed {', '.join(changed)} between two rounds without "
                        "declaring it in state_attrs (saved in every checkpoint) or scratch_attrs (recomputed): "
                        "a resumed run would differ from an uninterrupted one"
                    )
        self._fingerprints = now


__all__ = [
    "CHECKPOINT_FILE",
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "check_same_run",
    "checkpoint_path",
    "read_checkpoint",
    "read_server_state",
    "resume_config",
    "run_key",
    "write_checkpoint",
]
