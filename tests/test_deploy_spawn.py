"""Processes the deployment starts die with the command that started them, grandchildren included
(a SuperLink's flwr-serverapp must not outlive a SIGKILLed `deploy server`)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux death signals only")

PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trustformer.deploy.launch import spawn
    tmp = Path(sys.argv[1])
    # the child starts a grandchild of its own, as a SuperLink starts flwr-serverapp
    child = [sys.executable, "-c", "import subprocess, sys, time; g = subprocess.Popen(['sleep', '300']); "
             "print(g.pid, flush=True); time.sleep(300)"]
    proc = spawn("child", child, log_path=tmp / "child.log", home=tmp / "home")
    print(proc.pid, flush=True)
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_sigkilled_parent_takes_the_whole_spawned_group_with_it(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
    )
    try:
        child = int(parent.stdout.readline())
        log = tmp_path / "child.log"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (log.exists() and log.read_text().strip()):
            time.sleep(0.1)
        grandchild = int(log.read_text().split()[0])
        assert _alive(child) and _alive(grandchild)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (_alive(child) or _alive(grandchild)):
            time.sleep(0.2)
        assert not _alive(child), "the spawned process outlived the SIGKILLed parent"
        assert not _alive(grandchild), "the spawned process's own child outlived the SIGKILLed parent"
    finally:
        parent.kill()
