"""What the deploy commands share while their processes run: SIGTERM ending a command like Ctrl-C, and a log followed
as it grows."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from pathlib import Path


class StopRequest:
    """Whether SIGTERM arrived (a requested stop, not an interruption)."""

    requested = False


@contextmanager
def stop_on_sigterm():
    """While the block runs, SIGTERM ends the command like Ctrl-C does, so its processes are stopped;
    the yielded object says whether SIGTERM was the reason."""
    stop = StopRequest()

    def handler(_signum, _frame):
        stop.requested = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def follow_log(path: Path, position: int) -> int:
    """Print the lines appended to ``path`` since ``position`` to stderr; the new position."""
    try:
        with path.open("rb") as fh:
            fh.seek(position)
            data = fh.read()
    except OSError:
        return position
    complete = data.rfind(b"\n") + 1  # whole lines only; the rest comes next time
    if complete:
        sys.stderr.write(data[:complete].decode("utf-8", errors="replace"))
        sys.stderr.flush()
    return position + complete


__all__ = ["StopRequest", "follow_log", "stop_on_sigterm"]
