"""`trustformer bench federation`: every protocol on one privacy–utility–bytes frontier, on a setting where
federation matters.

The runs (one configuration, ``--seeds`` for the runs that decide the verdict):

- ``local`` (every client trains alone), ``fedavg``, and ``fedavg`` at each width of ``--bits`` (payload coding);
- per β (``--betas``): ``trustformer`` (``--memberships``, default the protocol's default) at 32 bits and at each
  width of ``--bits``, and the byte-matched cheap alternatives: FedAvg that exchanges every ⌈1/β⌉ rounds and FedAvg of
  top-k updates keeping β/2 of the coordinates (an int32 index travels with every float32 value);
- single seed: ``fedavg`` and ``trustformer`` under ``secagg`` (32 bits: secure aggregation cannot sum coded
  payloads), and the DP baselines at the paper's ε (``--no-dp`` leaves them out);
- every run fine-tunes its final models on each client's own data (``federation.finetune_epochs``): each run
  also gives a ``+ fine-tuning`` row (same bytes, same attack: fine-tuning is local);
- with ``--public`` (:func:`plan_public_runs`), the public-start rows: the public model alone (``train.init =
  "public"``, scored without training), public + training alone, public + FedAvg, public + FedAvg of LoRA adapters
  (``--lora-ranks``, at 32 bits and each width of ``--bits``), public + Trustformer per β over the full model and
  over the adapters of the largest rank. Their gains are reported against both references: from scratch (local = 0,
  FedAvg = 1) and from the public start (``pgain``: public + local = 0, public + FedAvg = 1). ``--only public`` runs
  just these (with the four references);
- with ``--download-bits`` (:func:`plan_download_runs`), the coded-download rows: FedAvg at the narrowest ``--bits``,
  Trustformer at the largest β and the widest ``--bits`` and (with ``--public``) LoRA at each rank, each at 32 bits
  and at every download width. ``--only download`` runs just these (with local and FedAvg; add ``public`` to
  ``--only`` for the public-start references).

Measured per row: test loss and BLEU on the shared test set and on each client's own held-out data (its
domains), the **gain retained** (X − local) / (FedAvg − local) on each of the four, upload and download bytes
per client per round relative to FedAvg's, what the server recovers of the clients' models (``attack
reconstruct``) and its **membership advantage** on their data (``attack membership``: the best server score's
AUC − 0.5, and its TPR at 1% FPR; ``--no-attacks`` skips both). A second table gives the **bytes both
ways**: the total bytes (up + down, all clients, all rounds) and the bytes until the mean shared-test loss first
reaches 90% of FedAvg's final gain over training alone (per seed, against the same seed's references), and the
server's time per round (``--curves FILE.png`` draws each run's loss against its cumulative bytes).
The **Pareto front** of (gain on pooled test loss ↑, upload ↓, advantage ↓)
is marked ``*`` (on own-data gain: ``†``); a difference smaller than the seed-to-seed spread is a tie. Printed as
one table; ``--json FILE`` writes it with every measurement, ``--figure FILE.png`` draws the frontier.

The default setting (:data:`DEFAULT_SETTING`, ``small`` preset) is non-IID: 3 clients holding different
LibreOffice help modules (``data.partition = "domain"``), 3,000 pairs each plus 300 held out of their own
domains, 10 rounds; FedAvg reaches BLEU ≈ 11 there, clearly above training alone. ``--preset tiny`` is a fast
smoke form; ``--data``, ``--clients``, ``--rounds`` and ``--set`` change the setting.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any, cast

from trustformer.cli_options import add_config_options, resolve_config
from trustformer.config import STRATEGIES, RunConfig

from .federation_figure import curves_figure, figure
from .federation_plan import (
    BENCH_OPTIONS,
    DEFAULT_SETTING,
    DOWN,
    PUBLIC_PREFIX,
    SCRATCH,
    TINY_SETTING,
    BenchRun,
    plan_download_runs,
    plan_extra_rows,
    plan_public_runs,
    plan_record_dp_runs,
    plan_runs,
)
from .federation_run import finished, run_configs, run_one
from .federation_table import format_bytes_table, format_table, gain_retained, mark_pareto, mean_of, table

# ------------------------------------------------------------------------------ the command


def _widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        widths = []
    if not widths or any(w not in (16, 8, 4, 2) for w in widths):
        raise argparse.ArgumentTypeError(f"{text!r}: give widths from 16, 8, 4, 2, comma-separated (e.g. 4,2)")
    return widths


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trustformer bench federation",
        description="Every protocol on one privacy–utility–bytes frontier on a non-IID setting (module docstring of "
        "trustformer.bench.federation_bench; docs/benchmarks.md).",
    )
    add_config_options(p)
    p.add_argument("--betas", default="0.1,0.5", help="Trustformer betas and byte budgets (default: 0.1,0.5)")
    p.add_argument(
        "--bits",
        type=_widths,
        default="4,2",
        help="the coded runs' widths, comma-separated, each 16, 8, 4 or 2 (default: 4,2)",
    )
    p.add_argument("--memberships", default="", help="Trustformer membership modes (default: the protocol's default)")
    p.add_argument("--seeds", default="0,1", help="seeds of the runs that decide the verdict (default: 0,1)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each (default: 2)")
    p.add_argument("--no-dp", action="store_true", help="leave out the DP baselines")
    p.add_argument("--no-secagg", action="store_true", help="leave out the secure-aggregation runs")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated labels to run (with local and fedavg), e.g. 'trustformer β=0.5,top-k 0.25'",
    )
    p.add_argument("--json", metavar="FILE", help="also write the table and every measurement as JSON")
    p.add_argument("--figure", metavar="FILE.png", help="also draw the frontier")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="take a run whose folder holds the measurements of exactly "
        "the same configuration instead of running it again",
    )
    p.add_argument(
        "--public",
        action="store_true",
        help="add the public-start rows: the public model alone, public + local, public + fedavg, "
        "public + fedavg with LoRA adapters (--lora-ranks, at 32 bits and --bits), public + "
        "trustformer (--betas; full model and adapters); '--only public' runs just these",
    )
    p.add_argument("--lora-ranks", default="4,16", help="--public: LoRA ranks of the adapter rows (default: 4,16)")
    p.add_argument(
        "--record-dp",
        default="",
        metavar="EPSILONS",
        help="add record-level DP-SGD rows at these ε (comma-separated, e.g. 1,3,8; δ = 1e-5): FedAvg, "
        "FedAvg at the narrowest --bits, Trustformer at the largest --betas, from scratch and, with "
        "--public, from the public model with LoRA (largest --lora-ranks) and full; plus the DP "
        "baselines' record-level reading at ε = 1. '--only dp' runs just these",
    )
    p.add_argument(
        "--download-bits",
        type=_widths,
        default=None,
        metavar="WIDTHS",
        help="add the coded-download rows at these widths (e.g. 8,4,2): FedAvg at the narrowest --bits, "
        "Trustformer at the largest --betas and widest --bits, and with --public LoRA at each --lora-ranks; "
        "'--only download' runs just these",
    )
    p.add_argument(
        "--no-attacks",
        action="store_true",
        help="skip the reconstruction and membership attacks (their columns read n/a): about 40%% faster",
    )
    p.add_argument("--curves", metavar="FILE.png", help="also draw each run's test loss against its cumulative bytes")
    p.add_argument(
        "--row",
        action="append",
        default=[],
        metavar="'LABEL: key=value ...'",
        help="add a row of any protocol, decided with every seed: its label, a colon, then its options "
        "as space-separated key=value (e.g. 'fedprox μ=0.1: federation.strategy=fedprox "
        "fedprox.mu=0.1'); seeds=0 among them runs it with those of --seeds only; a row with a planned "
        "row's label replaces it; repeatable",
    )
    p.add_argument(
        "--no-default-setting",
        action="store_true",
        help="do not apply the benchmark's non-IID setting; run the preset/config as given",
    )
    return p.parse_args(argv)


def base_config(
    args: argparse.Namespace, options: dict[str, Any] | None = None, out: str = "runs/bench-federation"
) -> RunConfig:
    """The configuration every run shares: the named setting (and the benchmark's ``options``, default
    :data:`BENCH_OPTIONS`) under the user's options; ``out`` when ``--out`` is not given."""
    given = {item.partition("=")[0] for item in args.set}
    setting = (
        {} if args.no_default_setting else (DEFAULT_SETTING if (args.preset or "small") == "small" else TINY_SETTING)
    )
    options = BENCH_OPTIONS if options is None else options
    extra = {**options, **{k: v for k, v in setting.items() if not k.startswith("federation.")}}
    if args.data and "data.partition" not in given:
        extra.pop("data.partition", None)  # a TSV file may have no domains
    if args.clients is None and "federation.clients" in setting:
        args.clients = setting["federation.clients"]
    if args.rounds is None and "federation.rounds" in setting:
        args.rounds = setting["federation.rounds"]
    args.set = [f"{k}={json.dumps(v)}" for k, v in extra.items() if k not in given] + list(args.set)
    if args.out is None:
        args.out = out
    # the benchmark runs the protocols of its rows (robustness: --strategies), each with its own section
    return resolve_config(args, strategies=getattr(args, "strategies", None) or STRATEGIES)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = base_config(args)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    runs = plan_runs(
        [float(b) for b in args.betas.split(",") if b.strip()],
        args.bits,
        seeds,
        [m.strip() for m in args.memberships.split(",") if m.strip()] or None,
        dp=not args.no_dp,
        secagg=not args.no_secagg,
    )
    extra = plan_extra_rows(args.row, seeds)  # a --row with a planned row's label replaces it (its seeds too)
    runs = [r for r in runs if r.label not in {e.label for e in extra}] + extra
    if cfg.train.init != "scratch":  # a --public-data file given: the from-scratch rows still start from scratch
        for run in runs:
            run.overrides = {**SCRATCH, **run.overrides}
    if args.public:
        runs += plan_public_runs(
            seeds,
            [int(r) for r in args.lora_ranks.split(",") if r.strip()],
            args.bits,
            [float(b) for b in args.betas.split(",") if b.strip()],
        )
    if args.record_dp:
        runs += plan_record_dp_runs(
            [float(e) for e in args.record_dp.split(",") if e.strip()],
            seeds,
            public=args.public,
            lora_rank=max(int(r) for r in args.lora_ranks.split(",")),
            beta=max(float(b) for b in args.betas.split(",")),
            bits=min(args.bits),
        )
    if args.download_bits:  # its base rows run as it plans them (32 bits down: once, as a reference curve)
        downloads = plan_download_runs(
            args.download_bits,
            seeds,
            bits=args.bits,
            beta=max(float(b) for b in args.betas.split(",")),
            ranks=[int(r) for r in args.lora_ranks.split(",") if r.strip()],
            public=args.public,
        )
        runs = [r for r in runs if r.label not in {d.label for d in downloads}] + downloads
    runs = [r for i, r in enumerate(runs) if (r.label, r.seed) not in {(p.label, p.seed) for p in runs[:i]}]
    if args.only:
        wanted = {x.strip() for x in args.only.split(",") if x.strip()}
        keep = {"local", "fedavg", *wanted}
        if PUBLIC_PREFIX in wanted:
            keep |= {"public + local", "public + fedavg"}  # the public-start references (pgain)
        download = {r.label.partition(DOWN)[0] for r in runs if DOWN in r.label} if "download" in wanted else set()
        runs = [
            r
            for r in runs
            if r.label in keep
            or (PUBLIC_PREFIX in wanted and r.label.startswith(PUBLIC_PREFIX))
            or ("dp" in wanted and (" dp ε=" in r.label or " record ε=" in r.label))
            or r.label.partition(DOWN)[0] in download
        ]
    out = Path(cfg.out)
    d, f = cfg.data, cfg.federation
    print(
        f"setting: preset {cfg.preset} · {f.clients} clients · partition {d.partition} · "
        f"{d.client_sizes or d.client_size or 'all'} pairs per client + {d.own_test_size} held out · {f.rounds} "
        f"rounds · {len(runs)} runs, {args.jobs} at a time · output {out}",
        file=sys.stderr,
        flush=True,
    )
    jobs = run_configs(cfg, runs)
    results: list[dict[str, Any] | None] = [None] * len(runs)
    if args.reuse:
        results = [finished(run_cfg, not args.no_attacks) for _, run_cfg in jobs]
        if reused := sum(r is not None for r in results):
            print(f"reusing {reused} finished runs from {out}", file=sys.stderr, flush=True)
    todo = [i for i, r in enumerate(results) if r is None]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_one, jobs[i][0], False, runs[i].kind, not args.no_attacks): i for i in todo}
        for done, future in enumerate(as_completed(futures), start=1):
            i = futures[future]
            results[i] = r = future.result()
            elapsed = time.perf_counter() - started
            print(
                f"[{done}/{len(todo)}] {runs[i].label} (seed {runs[i].seed}): test loss "
                f"{mean_of(r['summary']['test_loss']):.3f} · BLEU {mean_of(r['summary']['bleu']):.2f} · "
                f"{r['wall_s']:.0f} s · elapsed {elapsed / 60:.1f} min · ETA "
                f"{elapsed / done * (len(todo) - done) / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
    rows = table(runs, cast("list[dict[str, Any]]", results))  # every run has its result now (reused or run)
    print(format_table(rows))
    print("\n" + format_bytes_table(rows))
    local, fedavg = rows[0], next(r for r in rows if r["run"] == "fedavg")
    print(
        f"FedAvg − local: {local['loss'] - fedavg['loss']:.3f} nats of pooled test loss, "
        f"{fedavg['bleu'] - local['bleu']:.2f} BLEU; own data: {local['own_loss'] - fedavg['own_loss']:.3f} nats · "
        f"total {(time.perf_counter() - started) / 60:.1f} min"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": "trustformer bench federation " + shlex.join(argv or []),
                    "setting": cfg.to_dict(),
                    "rows": rows,
                },
                indent=2,
                ensure_ascii=False,
                allow_nan=True,
            )
            + "\n",
            encoding="utf-8",
        )
    if args.figure:
        print(f"figure: {figure(rows, args.figure)}", file=sys.stderr)
    if args.curves:
        print(f"curves: {curves_figure(rows, args.curves)}", file=sys.stderr)
    return 0


__all__ = [
    "BENCH_OPTIONS",
    "DEFAULT_SETTING",
    "BenchRun",
    "figure",
    "format_table",
    "gain_retained",
    "main",
    "finished",
    "mark_pareto",
    "plan_public_runs",
    "plan_runs",
    "run_configs",
    "run_one",
    "table",
]
