"""`trustformer bench scale`: what a round costs as the federation grows, with a fixed number of clients per round.

For every engine (``--engines``: inprocess, simulation) and number of clients N (``--clients``, default 10, 100,
1,000), one ``trustformer run`` on the ``tiny`` preset in a process of its own, with ``--per-round`` clients drawn
each round (``federation.clients_per_round``), each holding ``--client-size`` pairs, for ``--rounds`` rounds of
FedAvg (``--strategy``). Printed side by side (and written with ``--json``):

- **s/round**: the mean wall time of the rounds after the first (the first also connects every client node);
- **first s**: the first round's wall time; **final s**: the final evaluation (every client reports its test loss;
  one client per distinct model is scored);
- **peak MB**: the peak resident memory of the run's whole process tree (the engine and, on the Simulation
  Engine, Ray's processes), sampled every 0.2 s from ``/proc``;
- **× N₀**: s/round relative to the smallest N of the same engine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def tree_rss_mb(root: int) -> float:
    """Resident memory (MB) of process ``root`` and all its descendants, read from ``/proc``."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            pages = int((entry / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
        rss[int(entry.name)] = pages
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(command: list[str], summary_path: Path, log_path: Path) -> dict[str, Any]:
    """Run ``command``; its peak process-tree memory and, from the summary it writes, the round times."""
    peak = [0.0]
    with log_path.open("w", encoding="utf-8") as log:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                peak[0] = max(peak[0], tree_rss_mb(process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = process.wait()
        done.set()
        sampler.join()
        wall = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit code {code}); see {log_path}")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    rounds = [float(x) for x in summary["round_time_s"]]
    later = rounds[1:] or rounds
    return {
        "s_per_round": sum(later) / len(later),
        "first_round_s": rounds[0],
        "rounds_s": rounds,
        "final_s": max(0.0, float(summary["time_s"]["total"]) - sum(rounds)),
        "wall_s": wall,
        "peak_mb": peak[0],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trustformer bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="10,100,1000", help="numbers of clients N (default: 10,100,1000)")
    p.add_argument("--per-round", type=int, default=10, help="clients drawn each round (default: 10)")
    p.add_argument("--rounds", type=int, default=4, help="rounds of each run (default: 4)")
    p.add_argument("--client-size", type=int, default=10, help="training pairs per client (default: 10)")
    p.add_argument("--strategy", default="fedavg", help="protocol (default: fedavg)")
    p.add_argument("--engines", default="inprocess,simulation", help="engines (default: inprocess,simulation)")
    p.add_argument("--out", default="runs/bench-scale", help="folder of the runs (default: runs/bench-scale)")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any run option (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(x) for x in args.clients.split(",") if x.strip()]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    out = Path(args.out)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    total = len(sizes) * len(engines)
    for engine in engines:
        for n in sizes:
            folder = out / f"{engine}-{n}"
            command = [
                sys.executable,
                "-m",
                "trustformer",
                "run",
                "--quiet",
                "--preset",
                "tiny",
                "--engine",
                engine,
                "--strategy",
                args.strategy,
                "--clients",
                str(n),
                "--rounds",
                str(args.rounds),
                "--out",
                str(folder),
                "--set",
                f"federation.clients_per_round={min(args.per_round, n)}",
                "--set",
                f"data.client_size={args.client_size}",
                "--set",
                "eval.meteor=false",
                "--set",
                "eval.bertscore=false",
                "--set",
                "runtime.checkpoint=true",
            ]
            for item in args.set:
                command += ["--set", item]
            folder.mkdir(parents=True, exist_ok=True)
            result = measure(command, folder / "summary.json", folder / "bench.log")
            rows.append({"engine": engine, "clients": n, "per_round": min(args.per_round, n), **result})
            elapsed = time.perf_counter() - started
            print(
                f"[{len(rows)}/{total}] {engine} · {n} clients: {result['s_per_round']:.2f} s/round · peak "
                f"{result['peak_mb']:.0f} MB · elapsed {elapsed / 60:.1f} min · ETA "
                f"{elapsed / len(rows) * (total - len(rows)) / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
    print(format_table(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {"command": "trustformer bench scale " + shlex.join(argv or sys.argv[3:]), "rows": rows}, indent=2
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'engine':<11} {'clients':>7} {'per round':>9} {'s/round':>8} {'× N₀':>6} {'first s':>8} {'final s':>8} "
        f"{'peak MB':>8}"
    )
    lines = [head, "-" * len(head)]
    base: dict[str, float] = {}
    for r in rows:
        base.setdefault(r["engine"], r["s_per_round"])
        lines.append(
            f"{r['engine']:<11} {r['clients']:>7} {r['per_round']:>9} {r['s_per_round']:>8.2f} "
            f"{r['s_per_round'] / base[r['engine']]:>6.2f} {r['first_round_s']:>8.1f} {r['final_s']:>8.1f} "
            f"{r['peak_mb']:>8.0f}"
        )
    return "\n".join(lines)


__all__ = ["format_table", "main", "measure", "tree_rss_mb"]
