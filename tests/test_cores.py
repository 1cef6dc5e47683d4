"""runtime.threads = 0: torch takes the cores no other process is busy on (runtime/cores.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from trustformer.runtime import cores
from trustformer.runtime.node import torch_threads

STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 350 0 0 0 0 0 0
cpu1 200 0 50 250 0 0 0 0 0 0
intr 1 2 3
"""


def test_cpu_times_reads_each_cpu_line_and_leaves_idle_out():
    assert cores.cpu_times(STAT) == {0: (150, 500), 1: (250, 500)}
    with pytest.raises(ValueError, match="cpuN"):
        cores.cpu_times("intr 1 2\n")


def test_busy_cores_counts_the_share_of_each_cpu_in_use():
    before = {0: (0, 0), 1: (0, 0), 2: (0, 0)}
    after = {0: (100, 100), 1: (25, 100), 2: (100, 100)}
    assert cores.busy_cores(before, after, [0, 1]) == pytest.approx(1.25)  # cpu 2 is not this process's
    assert cores.busy_cores(before, before, [0, 1]) == 0.0  # counters that did not move: idle


def test_a_configured_thread_count_is_kept():
    assert torch_threads(3) == 3


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads the kernel's CPU counters (/proc/stat, Linux)")
def test_a_core_another_process_spins_on_is_not_counted_free():
    cpus = cores.usable_cores()
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: one to spin on, one left")
    idle, _ = cores.free_cores(0.3)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {cpus[0]})
        time.sleep(0.3)
        free, busy = cores.free_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy >= 0.8, busy
    assert free <= min(idle, len(cpus) - 1), (free, idle, busy)
