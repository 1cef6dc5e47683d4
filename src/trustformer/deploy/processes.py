"""The processes of a deployment: Flower's environment for them, starting them in sessions of their own, their
process trees (from ``/proc``), dying with the parent (``prctl``), a reaper for a whole group, and waiting for a
port.

Every Flower process gets ``FLWR_TELEMETRY_ENABLED=0``, ``FLWR_DISABLE_UPDATE_CHECK=1`` and its own
``FLWR_HOME`` (where Flower installs the app bundle and the CLI keeps its connection settings).
Processes start in sessions of their own; stopping one stops its whole process tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TrustformerError

log = logging.getLogger(__name__)

FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
LOOPBACK = "127.0.0.1"


class DeployError(TrustformerError, RuntimeError):
    """A deployment process failed to start, a Flower command failed, or a run did not finish."""


def flower_env(home: str | Path | None = None) -> dict[str, str]:
    """This process's environment plus the Flower settings (telemetry and update check off, FLWR_HOME)."""
    env = dict(os.environ)
    env.update(FLOWER_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    # Flower's commands (and the flwr-serverapp / flwr-clientapp processes they start) from this
    # Python's environment, e.g. a virtualenv that is not activated, before anything else on PATH
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts] + [d for d in env.get("PATH", "").split(os.pathsep) if d and d != scripts])
    if home is not None:
        env["FLWR_HOME"] = str(Path(home).resolve())
    return env


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free right now on ``host`` (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc; elsewhere only ``pid``)."""
    children = _children_map()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


@dataclass
class Proc:
    """A process this module started, its log file and its role."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal_tree(self, sig: int) -> list[int]:
        """Send ``sig`` to the process and every descendant (collected first: children outlive parents)."""
        pids = process_tree(self.pid) if self.alive() else []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def kill(self) -> None:
        """SIGKILL the whole tree now (a crash, as far as the others can tell)."""
        self.signal_tree(signal.SIGKILL)
        self._reap()

    def stop(self, grace_s: float = 8.0) -> None:
        """SIGTERM the tree, then SIGKILL what is left after ``grace_s`` seconds."""
        pids = self.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_exists(p) for p in pids):
            self.popen.poll()
            time.sleep(0.1)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL always ends it
            self.popen.wait(timeout=10)


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _die_with_parent() -> None:
    """In the child before exec (Linux): receive SIGTERM when the process that started it dies, even
    by SIGKILL, so no Flower process outlives the command or test that started it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_GROUP_REAPER = """
import os, signal, sys, time
group, parent = int(sys.argv[1]), int(sys.argv[2])
def alive():
    try:
        os.killpg(group, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
def end():
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
while alive():
    if os.getppid() != parent:
        end()
        break
    time.sleep(0.3)
"""
"""The reaper of one spawned process group: once the process that spawned the group is gone (even by
SIGKILL: the reaper is then re-parented, which it checks every 0.3 s) it ends the whole group,
grandchildren included — e.g. the ``flwr-serverapp`` a SuperLink starts, which a death signal on the
SuperLink alone would leave behind. It exits by itself once the group is gone."""


def spawn(name: str, command: list[str], *, log_path: Path, home: Path, cwd: Path | None = None) -> Proc:
    """Start ``command`` in a session of its own, stdout and stderr to ``log_path``. On Linux every
    process of that session dies with the process that called this (``_GROUP_REAPER``)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    # the death signal follows the thread that forks: only from the main thread, which lives as long as we do
    tie = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
    with log_path.open("ab") as out:
        popen = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=flower_env(home),
            cwd=str(cwd or home),
            start_new_session=True,
            preexec_fn=_die_with_parent if tie else None,
        )
    if tie:  # the group's own session id is the child's pid (start_new_session)
        subprocess.Popen(
            [sys.executable, "-c", _GROUP_REAPER, str(popen.pid), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    log.debug("started %s (pid %d): %s", name, popen.pid, " ".join(command))
    return Proc(name, popen, log_path)


def wait_for_port(proc: Proc, host: str, port: int, timeout_s: float) -> None:
    """Until something listens on ``host:port``; DeployError if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise DeployError(
                f"{proc.name} exited with code {proc.popen.returncode}; its log "
                f"({proc.log_path}) ends with:\n{proc.tail()}"
            )
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise DeployError(
        f"{proc.name} did not listen on {host}:{port} within {timeout_s:.0f} s; "
        f"its log ({proc.log_path}) ends with:\n{proc.tail()}"
    )


__all__ = ["DeployError", "FLOWER_ENV", "Proc", "flower_env", "free_port", "process_tree", "spawn", "wait_for_port"]
