"""The experiments' commands: ``trustformer bench``, ``reproduce``, ``report`` and ``attack``, each added to the
``trustformer`` parser by a function of this module that ``pyproject.toml`` names in the entry-point group
``trustformer.commands`` (the product's ``cli.py`` finds them there and imports nothing of this package)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from trustformer.cli_options import float_list, int_list, setup_logging, str_list
from trustformer.config import PRESETS, ConfigError, parse_override

# ``trustformer bench WHAT``: the module under trustformer_lab.bench whose ``main(argv)`` runs it, and whether the runs'
# logging is quieted (a benchmark of many runs prints its own progress)
BENCHMARKS: dict[str, tuple[str, bool]] = {
    "kmeans": ("kmeans_bench", False),
    "federation": ("federation_bench", True),
    "scale": ("scale_bench", False),
    "robustness": ("robustness_bench", True),
    "dp-scale": ("dp_scale_bench", True),
    "dp-noise": ("dp_noise_bench", True),
    "dp-bands": ("dp_bands_bench", True),
    "dp-recipe": ("dp_recipe_bench", True),
    "finetune": ("finetune_bench", True),
}


def _cmd_bench(args: argparse.Namespace) -> int:
    module, quiet = BENCHMARKS[args.what]  # argparse restricts the choices to the table's
    if quiet:
        setup_logging(quiet=True)
    return importlib.import_module(f"trustformer_lab.bench.{module}").main(args.rest)


def _reproduce_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="run a paper's experiment grid (cached) and write its tables, figures and report",
        description="Run a paper's grid on a preset, reusing finished runs of the results folder (keyed by "
        "the full configuration), then write its tables (CSV, Markdown), figures (PNG), report.md and "
        "report.html beside the paper's published numbers. --paper trustformer (default): strategies × β "
        "sweep × aggregation frequencies, Tables III–V and Figures 4/5 and 6. --paper fedpc: centralized, "
        "FedAvg, Phong and FedPC for N workers on image classification and segmentation, class-stratified "
        "imbalanced and Dirichlet splits, FedPC's Tables 2–4 and Figure 6 (bytes per epoch against Eq. 8).",
    )
    from .reproduce.fedpc import FEDPC_PARTITIONS, FEDPC_TASKS
    from .reproduce.grid import PAPERS

    p.add_argument(
        "--paper", choices=PAPERS, default="trustformer", help="which paper's grid and report (default: trustformer)"
    )
    p.add_argument("--preset", choices=list(PRESETS), default="tiny", help="base settings (default: tiny)")
    p.add_argument("--config", metavar="FILE", help="TOML file applied to every run")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="results folder, also the cache (default: results/<preset>, results/fedpc-<preset> for --paper fedpc)",
    )
    p.add_argument(
        "--strategies",
        type=str_list,
        metavar="LIST",
        help="comma-separated strategies (default: all the paper's that are installed"
        "; small leaves out centralized; fedpc: centralized,fedavg,phong,fedpc)",
    )
    p.add_argument(
        "--clients",
        type=int_list,
        metavar="LIST",
        help="fedpc: numbers of workers N, e.g. 3,5,10 (default: 3,5,10; tiny: 3)",
    )
    p.add_argument("--tasks", type=str_list, metavar="LIST", help=f"fedpc: tasks (default: {','.join(FEDPC_TASKS)})")
    p.add_argument(
        "--partitions",
        type=str_list,
        metavar="LIST",
        help=f"fedpc: data splits (default: {','.join(FEDPC_PARTITIONS)}; dirichlet: image classification only)",
    )
    p.add_argument("--betas", type=float_list, metavar="LIST", help="trustformer paper: β sweep, e.g. 0.1,0.5,0.9")
    p.add_argument(
        "--agg-every",
        type=int_list,
        metavar="LIST",
        help="trustformer paper: aggregation frequencies Agg_fr to run, e.g. 1,2 (1 is always the base)",
    )
    p.add_argument(
        "--agg-betas",
        type=float_list,
        metavar="LIST",
        help="trustformer paper: β values run at the Agg_fr other than 1 (default 0.5)",
    )
    p.add_argument(
        "--agg-strategies",
        type=str_list,
        metavar="LIST",
        help="trustformer paper: strategies run at the Agg_fr other than 1 (default fedavg,trustformer)",
    )
    p.add_argument("--rounds", type=int, help="rounds of every run (default: the grid's, see docs/reproduction.md)")
    p.add_argument("--seed", type=int, help="seed of every run")
    p.add_argument(
        "--epochs", type=int, default=None, help="trustformer paper: e of Eq. 5 for Table V (default 10, the paper's)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any option of every run by its dotted key (repeatable)",
    )
    p.add_argument("--force", action="store_true", help="rerun even the runs found in the cache")
    p.add_argument("--dry-run", action="store_true", help="list the runs and whether they are cached; run nothing")
    p.add_argument("--quiet", action="store_true", help="only the grid's progress lines and warnings")
    p.set_defaults(func=_cmd_reproduce)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .reproduce import grid as rep

    setup_logging(quiet=False)
    if args.quiet:
        for name in (
            "trustformer.app",
            "trustformer.recording.recorder",
            "trustformer.tasks.translation_workload",
            "trustformer.runtime",
            "trustformer.protocols",
            "trustformer.tasks",
        ):
            logging.getLogger(name).setLevel(logging.WARNING)
    if args.paper == "fedpc":
        return _reproduce_fedpc(args)
    for option in ("clients", "tasks", "partitions"):
        if getattr(args, option) is not None:
            raise ConfigError(f"--{option} applies to --paper fedpc only")
    if args.epochs is None:
        args.epochs = 10
    grid = rep.default_grid(args.preset)
    changes: dict[str, Any] = {}
    for field_name in ("strategies", "betas", "agg_every", "agg_betas", "agg_strategies", "rounds"):
        value = getattr(args, field_name)
        if value is not None:
            changes[field_name] = value
    grid = replace(grid, **changes)
    if args.epochs < 1:
        raise ConfigError(f"--epochs {args.epochs} must be >= 1")
    if not grid.strategies:
        raise ConfigError("--strategies: no strategy given")
    if 1 not in grid.agg_every:
        grid = replace(grid, agg_every=(1, *grid.agg_every))
    overrides = _reproduce_overrides(args)
    results = args.out or os.path.join("results", args.preset)
    if args.dry_run:
        planned = rep.plan(args.preset, grid, results, config_file=args.config, overrides=overrides)
        for i, run in enumerate(planned, 1):
            state = "cached" if rep.is_cached(run) else "to run"
            print(f"{i:3d}/{len(planned)}  {state:7s}  {run.label:32s}  {run.folder}")
        return 0
    command = "trustformer " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else "trustformer reproduce"
    outcome = rep.reproduce(
        args.preset,
        results,
        grid=grid,
        config_file=args.config,
        overrides=overrides,
        force=args.force,
        epochs=args.epochs,
        command=command,
    )
    return _reproduce_outcome(outcome)


def _reproduce_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {"runtime.progress": True}
    if args.seed is not None:
        overrides["seed"] = args.seed
    for item in args.set:
        key, value = parse_override(item)
        overrides[key] = value
    return overrides


def _reproduce_fedpc(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .reproduce import fedpc
    from .reproduce import grid as rep

    for option in ("betas", "agg_every", "agg_betas", "agg_strategies", "epochs"):
        if getattr(args, option) is not None:
            raise ConfigError(
                f"--{option.replace('_', '-')} applies to the Trustformer paper only, not to --paper fedpc"
            )
    grid = fedpc.default_fedpc_grid(args.preset)
    changes = {
        name: getattr(args, name)
        for name in ("strategies", "clients", "tasks", "partitions", "rounds")
        if getattr(args, name) is not None
    }
    grid = replace(grid, **changes)
    fedpc.check_fedpc_grid(grid)
    overrides = _reproduce_overrides(args)
    for key in ("task", "federation.strategy", "federation.clients", "data.partition"):
        if key in overrides:
            raise ConfigError(
                f"--set {key}: the grid sets it for every run (use --tasks, --strategies, --clients or --partitions)"
            )
    results = args.out or os.path.join("results", f"fedpc-{args.preset}")
    if args.dry_run:
        planned = fedpc.plan_fedpc(args.preset, grid, results, config_file=args.config, overrides=overrides)
        for i, run in enumerate(planned, 1):
            state = "cached" if rep.is_cached(run) else "to run"
            print(f"{i:3d}/{len(planned)}  {state:7s}  {run.label:52s}  {run.folder}")
        return 0
    command = "trustformer " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else "trustformer reproduce"
    outcome = fedpc.reproduce_fedpc(
        args.preset, results, grid=grid, config_file=args.config, overrides=overrides, force=args.force, command=command
    )
    return _reproduce_outcome(outcome)


def _reproduce_outcome(outcome: Any) -> int:
    if outcome.report is not None:
        print(f"report: {outcome.report.markdown} (and {outcome.report.html.name}, tables/, figures/)")
    if outcome.failed:
        print(
            f"trustformer: {len(outcome.failed)} run(s) failed: {', '.join(outcome.failed)} "
            f"(see error.txt in their folders)",
            file=sys.stderr,
        )
        return 1
    return 0


def _report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="tables, figures and report.md/html for finished run folder(s)",
        description="Write the paper's tables (CSV, Markdown) and figures (PNG), report.md and a self-contained "
        "report.html for every finished run found at or under the folders given.",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run folders, or folders holding them")
    p.add_argument("--out", metavar="DIR", help="where to write (default: DIR when one is given)")
    p.add_argument("--title", help="the report's title")
    p.add_argument("--epochs", type=int, default=10, help="e of Eq. 5 for Table V (default 10, the paper's)")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import build_report

    setup_logging(quiet=False)
    if args.out is None and len(args.dirs) != 1:
        raise ConfigError("--out is required when more than one folder is given")
    files = build_report(args.dirs, args.out or args.dirs[0], title=args.title, epochs=args.epochs)
    print(
        f"report: {files.markdown} (and {files.html.name}, {len(files.tables)} table files, "
        f"{len(files.figures)} figures)"
    )
    return 0


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmarks (print measured figures side by side)")
    b.add_argument("what", choices=list(BENCHMARKS))
    b.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark (see --help after it)")
    b.set_defaults(func=_cmd_bench)


def add_reproduce_parser(sub: argparse._SubParsersAction) -> None:
    _reproduce_parser(sub)


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    _report_parser(sub)


def add_attack_parser(sub: argparse._SubParsersAction) -> None:
    from .attack.cli import add_attack_parser as add

    add(sub)
