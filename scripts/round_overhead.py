"""The in-process round's overhead: each round's wall time minus its clients' local training time (in process the
clients train one after another, so the rest is the round's plumbing: messages, checks, state, evaluation).

Usage: .venv/bin/python scripts/round_overhead.py [--preset small] [--rounds 2] [--set key=value ...]
Prints one line per round and the mean, in seconds. Run it against two checkouts in one command (e.g. with
PYTHONPATH pointing at another checkout's src/) to compare them on the same machine.
"""

import argparse
import json
import tempfile
from pathlib import Path

import trustformer
from trustformer.config import load_config, parse_override
from trustformer.engine.inprocess import run_in_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp())
    values = {"out": str(out), "federation.rounds": args.rounds, "runtime.progress": False}
    values.update({"eval.meteor": False, "eval.bertscore": False, "eval.bleu_size": 8})
    values.update(dict(parse_override(item) for item in args.set))
    summary = run_in_process(load_config(args.preset, None, values))
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    overheads = []
    for rnd, wall in enumerate(summary["round_time_s"], start=1):
        train = sum(float(x.get("train_s", 0.0)) for x in lines if x.get("round") == rnd and "event" not in x)
        overheads.append(wall - train)
        print(f"round {rnd}: {wall:.2f} s, clients' training {train:.2f} s, overhead {wall - train:.2f} s")
    print(
        f"{Path(trustformer.__file__).parent.parent}: mean overhead {sum(overheads) / len(overheads):.2f} s per round"
    )


if __name__ == "__main__":
    main()
