"""`trustformer bench dp-scale`: client-level DP (dp-fedavg, McMahan et al. 2018) where it is meant to work, with
many clients, fixed against adaptive clipping (Andrew et al. 2021).

Setting (``tiny`` preset's model, 31k weights): ``--clients`` N clients (default 1,000) of ``--client-size`` pairs
(default 12: the default corpus has 13,891 pairs of at most 12 words, ``tiny``'s ``data.max_words``, of which the
test set and the public split take 1,540), ``--rounds`` rounds of ``train.local_epochs = 3``. Each DP row samples
every client with probability q = m / N for m = ``--per-round`` expected participants (Poisson, the accountant's
assumption) and solves σ for (ε, δ) over the planned rounds. Rows, for every m:

- ``fedavg``: non-private FedAvg with ``federation.clients_per_round = m`` (m clients drawn each round);
- ``dp-fedavg <clipping> ε=<eps>`` for ``--clippings`` × ``--epsilons`` (the first m gets every clipping, the others
  ``--more-clippings``);
- once, ``alone``: every client trains on its own shard (``local``) for the same rounds. The iid shards are cut in
  client order from one shuffled pool, so clients 0…K−1 hold the same shards whatever N: ``--alone-clients`` K
  (default 20) of them stand for all N.

Reported per row: the global model's test loss after the last round (mean over the clients that hold it), the gain
retained (training alone = 0, FedAvg with the same m = 1; ``bench federation``'s ``gain_retained``), ε spent, σ,
the update noise σ_Δ, the bound C at the end, σ·C/m (the standard deviation per coordinate of the noise on the mean
update) and σ/m, and wall time. Then the learning point: the σ/m at which the gain reaches ``--learned`` (default
0.5), interpolated between the measured rows, and — **extrapolated**, not measured — the m that gives the same σ/m
at ε for larger N (σ solved by the accountant at q = m/N, δ = min(δ, N^−1.1)).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trustformer.config import RunConfig, load_config
from trustformer.core.accounting import solve_noise_multiplier

SETTING: dict[str, Any] = {
    "train.local_epochs": 3,
    "eval.bleu_size": 20,
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.threads": 1,
    "runtime.ray_cpus": 1,
    "runtime.client_cpus": 1.0,
    "runtime.checkpoint": False,
    "runtime.progress": False,
}
"""Every run: one thread (one Ray CPU on the Simulation Engine), no checkpoints, test loss and a small BLEU only."""


def _label(strategy: str, m: int, clipping: str = "", eps: float | None = None) -> str:
    return f"{strategy} {clipping} ε={eps:g} m={m}" if clipping else f"{strategy} m={m}"


def plan(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(label, option values) of every run, in the order they run (references first)."""
    base = {
        "federation.clients": args.clients,
        "federation.rounds": args.rounds,
        "data.client_size": args.client_size,
        "runtime.engine": args.engine,
        "privacy.delta": args.delta,
        **SETTING,
    }
    runs = [("alone", {**base, "federation.strategy": "local", "federation.clients": args.alone_clients})]
    for i, m in enumerate(args.per_round):
        runs.append((_label("fedavg", m), {**base, "federation.strategy": "fedavg", "federation.clients_per_round": m}))
        for eps in args.epsilons:
            for clipping in args.clippings if i == 0 else args.more_clippings:
                runs.append(
                    (
                        _label("dp-fedavg", m, clipping, eps),
                        {
                            **base,
                            "federation.strategy": "dp-fedavg",
                            "privacy.clipping": clipping,
                            "privacy.epsilon": eps,
                            "privacy.sampling_rate": m / args.clients,
                        },
                    )
                )
    return runs


def global_loss(out: Path) -> float:
    """Test loss of the global model after the last round: the mean over the last round's lines of the clients that
    hold it (the sampled ones with client sampling; every client otherwise, and every client under DP)."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if "event" not in r and r.get("test_loss") is not None]
    last = max(r["round"] for r in rows)
    held = [r["test_loss"] for r in rows if r["round"] == last and r.get("sampled", True)]
    return statistics.fmean(held)


def run_one(label: str, values: dict[str, Any], out: Path) -> dict[str, Any]:
    """One run through the configured engine; its measurements."""
    from trustformer.engine import run

    cfg: RunConfig = load_config("tiny", None, {**values, "out": str(out / _folder(label))})
    started = time.perf_counter()
    summary = run(cfg)
    wall = time.perf_counter() - started
    rounds = summary.get("round_time_s", [])
    row: dict[str, Any] = {
        "label": label,
        "strategy": cfg.federation.strategy,
        "clients": cfg.federation.clients,
        "per_round": cfg.federation.clients_per_round or round(cfg.privacy.sampling_rate * cfg.federation.clients),
        "test_loss": global_loss(Path(cfg.out)),
        "wall_s": wall,
        "s_per_round": statistics.fmean(rounds) if rounds else math.nan,
    }
    privacy = summary.get("privacy")
    if privacy:
        m = cfg.privacy.sampling_rate * cfg.federation.clients
        sigma = privacy["noise_multiplier"]
        clip = privacy.get("clip_norm_next", privacy["clip_norm"])
        row.update(
            clipping=privacy.get("clipping", "fixed"),
            epsilon_target=cfg.privacy.epsilon,
            epsilon=privacy["epsilon"],
            delta=privacy["delta"],
            sigma=sigma,
            update_sigma=privacy.get("update_noise_multiplier", sigma),
            clip_end=clip,
            clip_per_round=privacy.get("clip_norm_per_round"),
            sigma_per_m=sigma / m,
            noise_std=privacy.get("update_noise_multiplier", sigma) * clip / m,
        )
    return row


def _folder(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in label.replace("ε=", "eps"))


def add_gains(rows: list[dict[str, Any]]) -> None:
    """Gain retained (bench federation's ``gain_retained``): alone = 0, FedAvg with the same m = 1."""
    from .federation_table import gain_retained

    alone = next(r["test_loss"] for r in rows if r["label"] == "alone")
    fedavg = {r["per_round"]: r["test_loss"] for r in rows if r["strategy"] == "fedavg"}
    for r in rows:
        ref = fedavg.get(r["per_round"])
        r["gain"] = (
            gain_retained(r["test_loss"], alone, ref)
            if ref is not None and r["label"] != "alone"
            else (0.0 if r["label"] == "alone" else math.nan)
        )


def learning_point(rows: list[dict[str, Any]], learned: float) -> float | None:
    """The σ/m at which the gain reaches ``learned``: log-linear interpolation between the DP rows just above and
    just below it (None when no row reaches it, or every row does)."""
    points = sorted((r["sigma_per_m"], r["gain"]) for r in rows if "sigma_per_m" in r and not math.isnan(r["gain"]))
    for (z_lo, g_lo), (z_hi, g_hi) in zip(points, points[1:], strict=False):
        if g_lo >= learned > g_hi and z_hi > z_lo:
            t = (g_lo - learned) / (g_lo - g_hi)
            return math.exp(math.log(z_lo) + t * (math.log(z_hi) - math.log(z_lo)))
    return None


def participants_needed(z: float, clients: int, epsilon: float, delta: float, rounds: int) -> int | None:
    """**Extrapolated**: the smallest expected participants m (q = m/N) whose solved σ gives σ/m ≤ z at (ε, δ) over
    ``rounds`` releases (bisection on m; None when even m = N does not)."""

    def ratio(m: int) -> float:
        return solve_noise_multiplier(epsilon, delta, min(1.0, m / clients), rounds) / m

    if ratio(clients) > z:
        return None
    lo, hi = 1, clients
    while hi - lo > max(1, hi // 200):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ratio(mid) <= z else (mid, hi)
    return hi


def extrapolate(
    z: float | None, args: argparse.Namespace, sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
) -> list[dict[str, Any]]:
    """The learning point's σ/m carried to larger N at every ε (δ = min(--delta, N^−1.1)); extrapolated."""
    if z is None:
        return []
    out = []
    for n in sizes:
        delta = min(args.delta, n**-1.1)
        for eps in args.epsilons:
            m = participants_needed(z, n, eps, delta, args.rounds)
            out.append({"clients": n, "epsilon": eps, "delta": delta, "per_round": m, "extrapolated": True})
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| run | m / round | test loss | gain retained | ε spent | σ | σ_Δ | C at end | σ/m | σ·C/m | s/round "
        "| wall s |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        dp = "sigma" in r
        cells = [
            r["label"],
            str(r["per_round"]),
            f"{r['test_loss']:.3f}",
            f"{r['gain']:.2f}",
            (f"{r['epsilon']:.3g}" if r.get("epsilon") is not None else "∞") if dp else "",
            f"{r['sigma']:.3f}" if dp else "",
            f"{r['update_sigma']:.3f}" if dp else "",
            f"{r['clip_end']:.3g}" if dp else "",
            f"{r['sigma_per_m']:.4f}" if dp else "",
            f"{r['noise_std']:.2e}" if dp else "",
            f"{r['s_per_round']:.1f}",
            f"{r['wall_s']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _numbers(kind: type, text: str) -> list[Any]:
    return [kind(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trustformer bench dp-scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=1000, help="clients N (default: 1000)")
    p.add_argument("--client-size", type=int, default=12, help="pairs per client (default: 12)")
    p.add_argument(
        "--per-round",
        type=lambda t: _numbers(int, t),
        default=[100, 300],
        help="expected participants per round m, comma-separated (default: 100,300)",
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds of every run (default: 5)")
    p.add_argument("--epsilons", type=lambda t: _numbers(float, t), default=[1.0, 8.0], help="default: 1,8")
    p.add_argument("--delta", type=float, default=1e-5, help="δ of every DP row (default: 1e-5)")
    p.add_argument(
        "--clippings",
        type=lambda t: t.split(","),
        default=["fixed", "adaptive"],
        help="clipping of the first m's DP rows (default: fixed,adaptive)",
    )
    p.add_argument(
        "--more-clippings",
        type=lambda t: t.split(","),
        default=["adaptive"],
        help="clipping of the other m's DP rows (default: adaptive)",
    )
    p.add_argument("--alone-clients", type=int, default=20, help="clients of the training-alone row (default: 20)")
    p.add_argument(
        "--engine",
        default="simulation",
        choices=["simulation", "inprocess"],
        help="runtime.engine (default: simulation)",
    )
    p.add_argument("--learned", type=float, default=0.5, help="gain retained that counts as learning (default: 0.5)")
    p.add_argument("--out", default="runs/bench-dp-scale", help="folder of the runs (default: runs/bench-dp-scale)")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs, out = plan(args), Path(args.out)
    print(
        f"setting: tiny model · N = {args.clients} clients × {args.client_size} pairs · {args.rounds} rounds · "
        f"m = {args.per_round} per round · engine {args.engine} · {len(runs)} runs, one at a time · output {out}",
        file=sys.stderr,
        flush=True,
    )
    rows, started = [], time.perf_counter()
    for i, (label, values) in enumerate(runs, start=1):
        rows.append(row := run_one(label, values, out))
        elapsed = time.perf_counter() - started
        print(
            f"[{i}/{len(runs)}] {label}: test loss {row['test_loss']:.3f} · {row['s_per_round']:.1f} s/round · "
            f"{row['wall_s']:.0f} s · elapsed {elapsed / 60:.1f} min · ETA "
            f"{elapsed / i * (len(runs) - i) / 60:.1f} min",
            file=sys.stderr,
            flush=True,
        )
    add_gains(rows)
    z = learning_point(rows, args.learned)
    extrapolated = extrapolate(z, args)
    print(format_table(rows))
    print(f"learning point (gain {args.learned:g}): σ/m = " + (f"{z:.4f}" if z else "not bracketed by the rows"))
    for e in extrapolated:
        print(
            f"extrapolated: N = {e['clients']:,} at ε = {e['epsilon']:g}, δ = {e['delta']:.2g}: m = "
            + (f"{e['per_round']:,} per round" if e["per_round"] else "more than N")
        )
    print(f"total {(time.perf_counter() - started) / 60:.1f} min")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": "trustformer bench dp-scale " + shlex.join(argv or []),
                    "rows": rows,
                    "learning_point_sigma_per_m": z,
                    "extrapolated": extrapolated,
                },
                indent=2,
                allow_nan=True,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


__all__ = [
    "SETTING",
    "add_gains",
    "extrapolate",
    "format_table",
    "global_loss",
    "learning_point",
    "main",
    "participants_needed",
    "plan",
    "run_one",
]
