"""`trustformer bench federation`: is a protocol worth its bytes on a setting where federation matters?

Runs, on one configuration, ``local`` (every client trains alone) and ``fedavg``, then every strategy
named with ``--strategies``; for ``trustformer`` one run per β (``--betas``) and membership mode
(``--memberships``). For every β it also runs the two cheapest baselines at the same byte budget:
FedAvg that exchanges only every ⌈1/β⌉ rounds (``--agg-every``) and FedAvg of top-k sparsified updates
keeping a fraction β/2 of the coordinates (``fedavg-topk``: an int32 index travels with every float32
value, so β/2 of the coordinates cost β of FedAvg's upload; the indices are counted in its bytes).

Printed as one table (and written with ``--json FILE``), per run: mean and spread (population standard
deviation) of the clients' final test loss, mean BLEU, upload bytes per client per round as a fraction
of FedAvg's, wall time, and the **gain retained** (L_local − L) / (L_local − L_fedavg) on the mean test
loss: 1 = all of FedAvg's gain, 0 = no better than training alone.

The default setting (``DEFAULT_SETTING``, "domain-3x1000") is non-IID: 3 clients that each hold
different LibreOffice help modules (``data.partition = "domain"``), 1,000 pairs each, 10 rounds of the
``small`` model and recipe. There FedAvg clearly beats training alone (README "Federation benchmark":
the measured gap). ``--preset``, ``--data``, ``--clients``, ``--rounds`` and ``--set`` change it, so the
same comparison runs on any corpus and partition; ``--preset tiny`` is a fast smoke form.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli_options import add_config_options, resolve_config
from ..config import RunConfig

DEFAULT_SETTING: dict[str, Any] = {
    "data.partition": "domain",
    "data.client_size": 1000,
    "federation.clients": 3,
    "federation.rounds": 10,
}
"""The benchmark's named non-IID setting ("domain-3x1000"), applied on top of the preset for ``small``."""

FAST_EVAL: dict[str, Any] = {"eval.meteor": False, "eval.bertscore": False}
"""The benchmark compares test loss and BLEU only: METEOR and BERTScore are not computed."""


@dataclass
class BenchRun:
    """One row of the table: what ran and what it measured."""

    label: str
    strategy: str
    overrides: dict[str, Any]
    beta: float | None = None
    test_loss: list[float] = field(default_factory=list)
    bleu: list[float] = field(default_factory=list)
    up_bytes: float = 0.0
    wall_s: float = 0.0
    attack: dict[str, float] | None = None  # --attack: what the honest-but-curious server recovers

    @property
    def loss_mean(self) -> float:
        return statistics.fmean(self.test_loss)

    @property
    def loss_spread(self) -> float:
        return statistics.pstdev(self.test_loss) if len(self.test_loss) > 1 else 0.0

    @property
    def bleu_mean(self) -> float:
        return statistics.fmean(self.bleu)


def plan_runs(strategies: list[str], betas: list[float], memberships: list[str], *,
              baselines: bool = True) -> list[BenchRun]:
    """local, fedavg, then each named strategy (trustformer: per β and membership mode) and, per β,
    the two byte-matched baselines (unless ``baselines`` is False)."""
    runs = [BenchRun("local", "local", {"federation.strategy": "local"}),
            BenchRun("fedavg", "fedavg", {"federation.strategy": "fedavg"})]
    for strategy in strategies:
        if strategy in ("local", "fedavg"):
            continue
        if strategy != "trustformer":
            runs.append(BenchRun(strategy, strategy, {"federation.strategy": strategy}))
            continue
        for beta in betas:
            for mode in memberships:
                runs.append(BenchRun(f"trustformer β={beta:g} {mode}", "trustformer",
                                     {"federation.strategy": "trustformer", "federation.beta": beta,
                                      "federation.memberships": mode}, beta=beta))
    for beta in betas if baselines else []:
        every = math.ceil(1 / beta - 1e-9)
        runs.append(BenchRun(f"fedavg every {every} (β={beta:g})", "fedavg",
                             {"federation.strategy": "fedavg", "federation.agg_every": every}, beta=beta))
        runs.append(BenchRun(f"fedavg-topk {beta / 2:g} (β={beta:g})", "fedavg-topk",
                             {"federation.strategy": "fedavg-topk", "federation.topk_keep": beta / 2}, beta=beta))
    return runs


def gain_retained(loss: float, local: float, fedavg: float) -> float:
    """(L_local − L) / (L_local − L_fedavg); NaN when FedAvg is no better than training alone."""
    gap = local - fedavg
    return (local - loss) / gap if gap > 0 else math.nan


def table(runs: list[BenchRun]) -> list[dict[str, Any]]:
    """The benchmark's rows (what is printed and written as JSON)."""
    local, fedavg = runs[0], runs[1]
    rows = []
    for run in runs:
        rows.append({
            "run": run.label, "strategy": run.strategy, "beta": run.beta, "overrides": run.overrides,
            "test_loss_mean": run.loss_mean, "test_loss_spread": run.loss_spread, "test_loss": run.test_loss,
            "bleu_mean": run.bleu_mean, "bleu": run.bleu,
            "upload_vs_fedavg": run.up_bytes / fedavg.up_bytes if fedavg.up_bytes else math.nan,
            "up_bytes_per_client_per_round": run.up_bytes,
            "gain_retained": gain_retained(run.loss_mean, local.loss_mean, fedavg.loss_mean),
            "wall_s": run.wall_s,
            **({"attack_recovered_fraction": run.attack["recovered_fraction_mean"],
                "attack_relative_error": run.attack["relative_error_mean"]} if run.attack else {}),
        })
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    attacked = any("attack_recovered_fraction" in r for r in rows)
    head = f"{'run':<34} {'test loss':>9} {'± spread':>8} {'BLEU':>6} {'upload':>7} {'gain':>6} {'wall s':>7}"
    head += f" {'recovered':>9} {'rel. err':>8}" if attacked else ""
    lines = [head, "-" * len(head)]
    for r in rows:
        gain = "n/a" if math.isnan(r["gain_retained"]) else f"{r['gain_retained']:.2f}"
        line = (f"{r['run']:<34} {r['test_loss_mean']:>9.3f} {r['test_loss_spread']:>8.3f} "
                f"{r['bleu_mean']:>6.2f} {r['upload_vs_fedavg']:>7.3f} {gain:>6} {r['wall_s']:>7.0f}")
        if attacked:
            line += (f" {r['attack_recovered_fraction']:>9.4f} {r['attack_relative_error']:>8.4f}"
                     if "attack_recovered_fraction" in r else f" {'':>9} {'':>8}")
        lines.append(line)
    if attacked:
        lines.append("recovered / rel. err: `trustformer attack reconstruct` on the same run — the fraction of each "
                     "client's trained weights the server recovers to 1e-6, and the relative L2 error of its "
                     "estimate (mean over clients, at the last exchange)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trustformer bench federation",
        description="local, fedavg and the named strategies on one non-IID setting, with the byte-matched "
                    "baselines of every beta; prints one table (module docstring of "
                    "trustformer.bench.federation_bench).",
    )
    add_config_options(p)
    p.add_argument("--strategies", default="trustformer",
                   help="comma-separated strategies besides local and fedavg (default: trustformer)")
    p.add_argument("--betas", default="0.1,0.5", help="trustformer betas and byte budgets (default: 0.1,0.5)")
    p.add_argument("--memberships", default="rotating,shared,local",
                   help="trustformer membership modes to run (default: rotating,shared,local)")
    p.add_argument("--json", metavar="FILE", help="also write the table and the setting as JSON")
    p.add_argument("--reuse", action="store_true",
                   help="take a run whose folder under --out holds a finished summary of exactly the same "
                        "configuration from there instead of training it again (continues an interrupted benchmark)")
    p.add_argument("--attack", action="store_true",
                   help="also play the honest-but-curious server on every run (trustformer attack reconstruct) and "
                        "print what it recovers")
    p.add_argument("--no-baselines", action="store_true",
                   help="skip the byte-matched baselines (FedAvg every ceil(1/beta) rounds, top-k)")
    p.add_argument("--no-default-setting", action="store_true",
                   help="do not apply the benchmark's non-IID setting; run the preset/config as given")
    return p.parse_args(argv)


def base_config(args: argparse.Namespace) -> RunConfig:
    """The configuration every run shares: the named setting (for the small preset) under the user's
    options; --out is the folder that holds one sub-folder per run."""
    extra = [f"{k}={json.dumps(v)}" for k, v in FAST_EVAL.items()]
    if (args.preset or "small") == "small" and not args.no_default_setting:
        given = {item.partition("=")[0] for item in args.set}
        if args.clients is None:
            args.clients = DEFAULT_SETTING["federation.clients"]
        if args.rounds is None:
            args.rounds = DEFAULT_SETTING["federation.rounds"]
        extra += [f"{k}={json.dumps(v)}" for k, v in DEFAULT_SETTING.items()
                  if k not in given and not k.startswith("federation.")]
        if args.data and "data.partition" not in given:
            extra = [e for e in extra if not e.startswith("data.partition=")]  # a TSV may have no domains
    args.set = extra + list(args.set)
    if args.out is None:
        args.out = "runs/bench-federation"
    return resolve_config(args)


def _finished(cfg: RunConfig) -> dict[str, Any] | None:
    """The summary of a finished run of exactly this configuration in its folder, if there is one."""
    path = Path(cfg.out) / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if summary.get("config") != cfg.to_dict() or summary.get("rounds") != cfg.federation.rounds:
        return None
    return summary


def run_one(cfg: RunConfig, run: BenchRun, out: Path, *, reuse: bool = False, attack: bool = False) -> None:
    from ..config import load_config
    from ..engine.inprocess import run_in_process

    values = cfg.to_dict()
    flat = {f"{section}.{key}": value for section, body in values.items() if isinstance(body, dict)
            for key, value in body.items()}
    flat.update({k: v for k, v in values.items() if not isinstance(v, dict)})
    flat.update(run.overrides)
    flat["out"] = str(out / run.label.replace(" ", "_").replace("=", "").replace("(", "").replace(")", ""))
    run_cfg = load_config(cfg.preset, None, flat)
    previous = _finished(run_cfg) if reuse else None
    attack_file = Path(run_cfg.out) / "attack.json"
    if previous is not None and attack and not attack_file.exists():
        previous = None
    if previous is not None:
        summary = previous
        run.wall_s = float(summary["time_s"]["total"])
        if attack:
            run.attack = json.loads(attack_file.read_text(encoding="utf-8"))
    elif attack:
        from ..attack.reconstruct import run_attack

        started = time.perf_counter()
        run.attack = run_attack(run_cfg)
        run.wall_s = time.perf_counter() - started
        summary = json.loads((Path(run_cfg.out) / "summary.json").read_text(encoding="utf-8"))
        attack_file.write_text(json.dumps(run.attack, indent=1) + "\n", encoding="utf-8")
    else:
        started = time.perf_counter()
        summary = run_in_process(run_cfg)
        run.wall_s = time.perf_counter() - started
    run.test_loss = [float(x) for x in summary["test_loss"]]
    run.bleu = [float(x) for x in summary["bleu"]]
    run.up_bytes = float(summary["bytes"]["up_per_client_per_round"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = base_config(args)
    runs = plan_runs([s.strip() for s in args.strategies.split(",") if s.strip()],
                     [float(b) for b in args.betas.split(",") if b.strip()],
                     [m.strip() for m in args.memberships.split(",") if m.strip()], baselines=not args.no_baselines)
    out = Path(cfg.out)
    d, f = cfg.data, cfg.federation
    print(f"setting: preset {cfg.preset} · {f.clients} clients · partition {d.partition}"
          f"{f' (alpha {d.alpha:g})' if d.partition == 'dirichlet' else ''} · "
          f"{d.client_sizes or d.client_size or 'all'} pairs per client · {f.rounds} rounds · "
          f"{len(runs)} runs · output {out}", file=sys.stderr, flush=True)
    for run in runs:
        every = run.overrides.get("federation.agg_every", 1)
        if every > f.rounds:
            print(f"warning: {run.label} never exchanges in {f.rounds} rounds (its row is training alone); "
                  f"use --rounds >= {every} for a byte-matched baseline", file=sys.stderr, flush=True)
    started = time.perf_counter()
    for i, run in enumerate(runs, start=1):
        run_one(cfg, run, out, reuse=args.reuse, attack=args.attack)
        elapsed = time.perf_counter() - started
        eta = elapsed / i * (len(runs) - i)
        print(f"[{i}/{len(runs)}] {run.label}: test loss {run.loss_mean:.3f} · BLEU {run.bleu_mean:.2f} · "
              f"{run.wall_s:.0f} s · elapsed {elapsed / 60:.1f} min · ETA {eta / 60:.1f} min",
              file=sys.stderr, flush=True)
    rows = table(runs)
    print(format_table(rows))
    gap = runs[0].loss_mean - runs[1].loss_mean
    print(f"FedAvg − local: {gap:.3f} nats of mean test loss, "
          f"{runs[1].bleu_mean - runs[0].bleu_mean:.2f} BLEU · total {(time.perf_counter() - started) / 60:.1f} min")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"setting": cfg.to_dict(), "fedavg_minus_local_nats": gap,
                                               "rows": rows}, indent=2, ensure_ascii=False) + "\n",
                                   encoding="utf-8")
    return 0
