"""Download coding on the frontier's non-IID setting: bytes both ways, quality, and the total bytes to a target.

Runs each row once (one seed) on the setting of ``trustformer bench federation`` (small preset, domain partition,
3 clients, 10 rounds), without its attacks or fine-tuning, and prints one table: the final shared-test loss, the
share of FedAvg's gain over training alone it keeps, bytes up and down against the uncoded FedAvg run's, the total
bytes (up + down, all clients, all rounds) until the mean test loss first reaches 90% of FedAvg's final gain, and
the server's time per round. With ``--figure`` it draws every run's test loss against its cumulative bytes.

Usage: .venv/bin/python scripts/download_bench.py [--rounds 10] [--seed 0] [--json FILE] [--figure FILE.png]
"""

import argparse
import json
import time
from pathlib import Path

from trustformer.config import load_config
from trustformer.engine.inprocess import run_in_process

SETTING = {
    "data.partition": "domain",
    "data.own_test_size": 300,
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.progress": False,
}
ROWS = [
    ("local", {"federation.strategy": "local"}),
    ("fedavg", {}),
    ("fedavg 2-bit up", {"federation.payload_bits": 2}),
    ("fedavg 2-bit up, 8-bit down", {"federation.payload_bits": 2, "federation.download_bits": 8}),
    ("fedavg 2-bit up, 4-bit down", {"federation.payload_bits": 2, "federation.download_bits": 4}),
    ("fedavg 2-bit up, 2-bit down", {"federation.payload_bits": 2, "federation.download_bits": 2}),
    ("trustformer β=0.5 4-bit", {"federation.strategy": "trustformer", "federation.payload_bits": 4}),
    (
        "trustformer β=0.5 4-bit, 4-bit down",
        {"federation.strategy": "trustformer", "federation.payload_bits": 4, "federation.download_bits": 4},
    ),
]


def curve(out: Path) -> list[tuple[int, float, float]]:
    """(round, mean test loss over the clients, cumulative bytes up + down) after every round."""
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    rows, total = [], 0
    for rnd in sorted({x["round"] for x in lines if "event" not in x}):
        these = [x for x in lines if x.get("round") == rnd and "event" not in x]
        total += sum(int(x["bytes_up"]) + int(x["bytes_down"]) for x in these)
        rows.append((rnd, sum(x["test_loss"] for x in these) / len(these), total))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench-download")
    parser.add_argument("--json")
    parser.add_argument("--figure")
    args = parser.parse_args()
    results = {}
    for label, values in ROWS:
        out = Path(args.out) / label.replace(" ", "_").replace(",", "").replace("=", "")
        started = time.perf_counter()
        cfg = load_config(
            "small",
            None,
            {**SETTING, **values, "federation.rounds": args.rounds, "seed": args.seed, "out": str(out)},
        )
        summary = run_in_process(cfg)
        server = summary.get("server_time_s", {})
        results[label] = {
            "loss": sum(summary["test_loss"]) / len(summary["test_loss"]),
            "bleu": summary["bleu"][0],
            "up": summary["bytes"]["up_total"],
            "down": summary["bytes"]["down_total"],
            "server_s_per_round": sum(server.values()) / args.rounds,
            "curve": curve(out),
            "wall_s": time.perf_counter() - started,
        }
        print(f"{label}: loss {results[label]['loss']:.3f} ({results[label]['wall_s']:.0f} s)", flush=True)
    local, fedavg = results["local"]["loss"], results["fedavg"]["loss"]
    target = local - 0.9 * (local - fedavg)
    up0, down0 = results["fedavg"]["up"], results["fedavg"]["down"]
    print(f"\nsetting: small, domain partition, 3 clients, {args.rounds} rounds, seed {args.seed}")
    print(f"target: mean test loss <= {target:.3f} (90% of FedAvg's gain over training alone)")
    header = "| run | test loss | BLEU | gain | up × FedAvg | down × FedAvg | bytes to target | server s/round |"
    print(header + "\n|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        if label == "local":
            continue
        reached = next((b for _rnd, loss, b in r["curve"] if loss <= target), None)
        r["gain"] = (local - r["loss"]) / (local - fedavg)
        r["bytes_to_target"] = reached
        print(
            f"| {label} | {r['loss']:.3f} | {r['bleu']:.1f} | {r['gain']:.3f} | {r['up'] / up0:.4f} | "
            f"{r['down'] / down0:.4f} | {f'{reached / 1e6:.2f} MB' if reached else 'not reached'} | "
            f"{r['server_s_per_round']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"setting": SETTING, "rounds": args.rounds, "seed": args.seed, "target_loss": target, "rows": results},
                indent=2,
            )
            + "\n"
        )
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for label, r in results.items():
            if label == "local":
                continue
            ax.plot(
                [b for _r, _l, b in r["curve"]], [loss for _r, loss, _b in r["curve"]], marker="o", ms=3, label=label
            )
        ax.axhline(target, color="grey", ls="--", lw=1, label="90% of FedAvg's gain")
        ax.set_xscale("log")
        ax.set_xlabel("bytes up + down, all clients, so far (log)")
        ax.set_ylabel("mean shared-test loss")
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)


if __name__ == "__main__":
    main()
