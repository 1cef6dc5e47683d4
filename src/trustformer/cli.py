"""The ``trustformer`` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from typing import Any

from .cli_options import (
    add_config_options,
    check_out_folder,
    float_list,
    int_list,
    interrupted_advice,
    refuse_existing_run,
    resolve_config,
    run_config,
    setup_logging,
    str_list,
)
from .config import PRESETS, ConfigError, parse_override


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="train one federation (in one process) and write metrics.jsonl and summary.json",
        description="Train a model across several clients: a Transformer on translation (default), a FIXUP "
        "ResNet on image classification or a U-Net on segmentation (--task). Options override --config, "
        "which overrides --preset.",
    )
    add_config_options(p)
    p.add_argument("--quiet", action="store_true", help="only warnings and the final line")
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run checkpointed in DIR after its last completed round (its clients' state must be "
        "on disk: runtime.store = auto, the default, or disk; the run's own configuration is used)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in the output folder (a finished or interrupted run there is otherwise refused)",
    )
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = run_config(args)  # --resume DIR: the checkpointed run's configuration
    check_out_folder(cfg.out)  # before any data loads
    if not cfg.runtime.resume and not args.overwrite:
        refuse_existing_run(cfg.out)

    setup_logging(quiet=args.quiet or not cfg.runtime.progress)
    from .engine import run
    from .tasks.checks import check_metrics

    check_metrics(cfg)  # before any training, not after it
    try:
        summary = run(cfg)
    except KeyboardInterrupt:
        print(f"trustformer: the run in {cfg.out} was interrupted; {interrupted_advice(cfg)}", file=sys.stderr)
        raise
    from .tasks.results import FINAL_METRICS

    if cfg.task != "translation":
        scores = " · ".join(f"{key} {summary[key]}" for key in FINAL_METRICS[cfg.task])
        print(
            f"test loss {summary['test_loss']} · {scores} · {summary['time_s']['total']:.0f} s · {cfg.out}/summary.json"
        )
    elif args.quiet:
        print(f"test loss {summary['test_loss']} · BLEU {summary['bleu']} · {cfg.out}/summary.json")
    else:
        print_samples(summary)
    return 0


def print_samples(summary: dict[str, Any]) -> None:
    """The first client's sample translations (source / reference / hypothesis), on stdout."""
    client, samples = next(iter(summary.get("samples", {}).items()), (None, []))
    if not samples:
        return
    who = "all shards" if client == "-1" else f"client {client}"
    print(
        f"sample translations of the shared test set ({who}; every sentence: "
        f"{summary.get('translations', {}).get(client, 'translations.tsv')}):"
    )
    for source, reference, hypothesis in samples:
        print(f"  source     {source}\n  reference  {reference}\n  hypothesis {hypothesis}\n")


def _cmd_config(args: argparse.Namespace) -> int:
    import tomli_w

    if args.reference:
        from .config.reference import reference

        print(reference(), end="")
        return 0
    cfg = resolve_config(args)
    print(tomli_w.dumps(cfg.to_dict()), end="")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "kmeans":
        from .bench.kmeans_bench import main as bench_main

        return bench_main(args.rest)
    if args.what == "federation":
        from .bench.federation_bench import main as federation_main

        setup_logging(quiet=True)
        return federation_main(args.rest)
    if args.what == "scale":
        from .bench.scale_bench import main as scale_main

        return scale_main(args.rest)
    if args.what == "robustness":
        from .bench.robustness_bench import main as robustness_main

        setup_logging(quiet=True)
        return robustness_main(args.rest)
    if args.what == "dp-scale":
        from .bench.dp_scale_bench import main as dp_scale_main

        setup_logging(quiet=True)
        return dp_scale_main(args.rest)
    if args.what == "dp-noise":
        from .bench.dp_noise_bench import main as dp_noise_main

        setup_logging(quiet=True)
        return dp_noise_main(args.rest)
    if args.what == "dp-bands":
        from .bench.dp_bands_bench import main as dp_bands_main

        setup_logging(quiet=True)
        return dp_bands_main(args.rest)
    if args.what == "finetune":
        from .bench.finetune_bench import main as finetune_main

        setup_logging(quiet=True)
        return finetune_main(args.rest)
    if args.what == "dp-recipe":
        from .bench.dp_recipe_bench import main as dp_recipe_main

        setup_logging(quiet=True)
        return dp_recipe_main(args.rest)
    raise AssertionError(args.what)  # argparse restricts the choices


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


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that describe a problem with the input or the environment: printed without a traceback
    (set TRUSTFORMER_DEBUG=1 to see it). Every such error of the project derives from ``TrustformerError``."""
    from .errors import TrustformerError

    return (TrustformerError, FileNotFoundError, UnicodeDecodeError)


def version() -> str:
    """The installed distribution's version (``pip show trustformer``), else the package's ``__version__`` (a
    source tree on ``sys.path`` without an installed distribution)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("trustformer")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def command_of(argv: list[str]) -> str | None:
    """The subcommand of a command line (None: none, e.g. ``--help``): its first word (the top-level parser
    has no option but ``--help`` and ``--version``)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``trustformer`` parser. ``command``: the subcommand about to be parsed (:func:`command_of`). The
    deployment commands (``deploy``, ``attest``) come from ``trustformer.deploy``, which is imported only when
    ``command`` is None or not another known command: ``trustformer run`` (one process) never imports it."""
    parser = argparse.ArgumentParser(
        prog="trustformer",
        description="Privacy-preserving, communication-efficient federated training of Transformers.",
    )
    parser.add_argument("--version", action="version", version=f"trustformer {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    c = sub.add_parser("config", help="print the resolved configuration as TOML (a starting --config file)")
    add_config_options(c)
    c.add_argument(
        "--reference",
        action="store_true",
        help="print the reference of every key (type, default, meaning) as Markdown instead",
    )
    c.set_defaults(func=_cmd_config)
    b = sub.add_parser("bench", help="benchmarks (print measured figures side by side)")
    b.add_argument(
        "what",
        choices=[
            "kmeans",
            "federation",
            "scale",
            "robustness",
            "dp-scale",
            "dp-noise",
            "dp-bands",
            "dp-recipe",
            "finetune",
        ],
    )
    b.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark (see --help after it)")
    b.set_defaults(func=_cmd_bench)
    _reproduce_parser(sub)
    _report_parser(sub)
    from .attack.cli import add_attack_parser
    from .export.commands import add_predict_parser, add_translate_parser

    add_attack_parser(sub)
    add_translate_parser(sub)
    add_predict_parser(sub)
    if command is None or command not in sub.choices:  # a deployment command, or help, or an unknown one
        from .deploy.attest_cli import add_attest_parser
        from .deploy.cli import add_deploy_parser

        add_deploy_parser(sub)
        add_attest_parser(sub)
    return parser


def _show_warning(shown: Any) -> Any:
    """``warnings.showwarning`` for the command's duration: a deprecated configuration key is reported as one line,
    its message, like the command's errors (Python's format adds the file, line and source of the call, which is
    the command's own); every other warning as before."""
    from .config.run import ConfigDeprecationWarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ConfigDeprecationWarning):
            print(f"trustformer: warning: {message}", file=sys.stderr)
            return
        shown(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_of(argv)).parse_args(argv)
    try:
        with warnings.catch_warnings():  # restores the previous showwarning on the way out
            warnings.showwarning = _show_warning(warnings.showwarning)
            return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"trustformer: configuration error: {exc}", file=sys.stderr)
        return 2
    except _user_errors() as exc:
        if os.environ.get("TRUSTFORMER_DEBUG"):
            raise
        print(f"trustformer: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("trustformer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
