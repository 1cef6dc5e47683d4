"""How many torch threads a process takes when ``runtime.threads = 0``: the cores it may use that no other process
is busy on right now.

Torch's intra-op threads wait for each other at the end of every operation, so one thread on a core that another
process holds stalls all of them: on a 2-core machine with one core taken, two threads trained at 150 tokens/s
where one trains at 8,700. The cores in use are read from the kernel's counters (``/proc/stat``) over a short
window before training starts; where those counters do not exist, every core is used.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
WINDOW_S = 0.25  # long enough for a busy core to show, short enough to pay once per process
IDLE_FIELDS = (3, 4)  # idle, iowait in a /proc/stat "cpu" line's counters


def usable_cores() -> list[int]:
    """The CPUs this process may run on (its affinity, e.g. a container's cpuset), else all of the machine's."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_times(text: str) -> dict[int, tuple[int, int]]:
    """CPU index -> (busy, total) jiffies, from the ``cpuN`` lines of ``/proc/stat`` (busy: all but idle and
    iowait)."""
    times = {}
    for line in text.splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            counters = [int(v) for v in values]
            idle = sum(counters[i] for i in IDLE_FIELDS if i < len(counters))
            times[int(name[3:])] = (sum(counters) - idle, sum(counters))
    if not times:
        raise ValueError("no 'cpuN' line in /proc/stat")
    return times


def busy_cores(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], cpus: list[int]) -> float:
    """How many of ``cpus`` were in use between two readings of :func:`cpu_times` (a CPU whose counters did not
    move counts as idle)."""
    busy = 0.0
    for cpu in cpus:
        if cpu in before and cpu in after and after[cpu][1] > before[cpu][1]:
            busy += (after[cpu][0] - before[cpu][0]) / (after[cpu][1] - before[cpu][1])
    return busy


def free_cores(window_s: float = WINDOW_S) -> tuple[int, float]:
    """(cores to use, cores of this process's CPUs others were busy on): its CPUs less those in use over
    ``window_s`` (this process sleeps meanwhile), at least 1. Without ``/proc/stat``: every CPU, 0 busy."""
    cpus = usable_cores()
    try:
        before = cpu_times(PROC_STAT.read_text(encoding="ascii"))
        time.sleep(window_s)
        after = cpu_times(PROC_STAT.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return len(cpus), 0.0
    busy = busy_cores(before, after, cpus)
    return max(1, len(cpus) - round(busy)), busy


__all__ = ["busy_cores", "cpu_times", "free_cores", "usable_cores"]
