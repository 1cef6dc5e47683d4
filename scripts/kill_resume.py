"""Kill a `trustformer run` in the middle of a round (SIGKILL, after client 1 reported that round's training), resume it
with `trustformer run --resume`, and compare its final test losses with an uninterrupted run of the same command.

    python scripts/kill_resume.py --rounds 4 --kill 1,2,3,4 --runs /tmp/kill-resume            # the demo's settings
    python scripts/kill_resume.py --rounds 3 --kill 2 --runs /tmp/kr -- --preset tiny          # extra run options

Prints one row per kill: the round killed in, the round the checkpoint held, the resumed and the uninterrupted
final test losses, and whether they are equal; exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TRUSTFORMER = [sys.executable, "-m", "trustformer"]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def run(out: Path, rounds: int, extra: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([*TRUSTFORMER, "run", "--rounds", str(rounds), "--out", str(out), "--quiet", *extra], check=True)
    return time.perf_counter() - started


def killed_in(out: Path, rounds: int, kill: int, extra: list[str]) -> int:
    """Start the run and SIGKILL it once client 1 has trained round ``kill``; the checkpoint's round."""
    child = subprocess.Popen(
        [*TRUSTFORMER, "run", "--rounds", str(rounds), "--out", str(out), *extra],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert child.stderr is not None
    for line in child.stderr:
        if f"client 1 · round {kill} ·" in line:
            os.killpg(child.pid, signal.SIGKILL)
            break
    child.wait()
    if child.returncode != -signal.SIGKILL:
        raise SystemExit(f"the run ended (exit {child.returncode}) before client 1 trained round {kill}")
    return json.loads((out / "checkpoint.json").read_text(encoding="utf-8"))["round"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--kill", default="2", help="rounds to kill in, comma-separated")
    parser.add_argument("--runs", required=True, help="folder for the runs (emptied first)")
    parser.add_argument("extra", nargs="*", help="run options after --")
    args = parser.parse_args()
    root = Path(args.runs)
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir(parents=True)
    full_s = run(root / "uninterrupted", args.rounds, args.extra)
    full = summary(root / "uninterrupted")["test_loss"]
    print(f"uninterrupted: {args.rounds} rounds in {full_s:.0f} s, test loss {full}")
    print("| killed in round | checkpoint round | resume time (s) | resumed test loss | uninterrupted | equal |")
    print("|---|---|---|---|---|---|")
    differ = 0
    for kill in (int(k) for k in args.kill.split(",")):
        out = root / f"killed-r{kill}"
        at = killed_in(out, args.rounds, kill, args.extra)
        started = time.perf_counter()
        subprocess.run([*TRUSTFORMER, "run", "--resume", str(out), "--quiet"], check=True, stdout=subprocess.DEVNULL)
        resumed = summary(out)["test_loss"]
        differ += resumed != full
        print(
            f"| {kill} | {at} | {time.perf_counter() - started:.0f} | "
            f"{', '.join(f'{x:.6f}' for x in resumed)} | {', '.join(f'{x:.6f}' for x in full)} | {resumed == full} |",
            flush=True,
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
