"""The ``trustformer`` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from .config import PRESETS, STRATEGIES, ConfigError, RunConfig, load_config, parse_override


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="train one federation (in one process) and write metrics.jsonl and summary.json",
        description="Train a Transformer across several clients. Options override --config, "
        "which overrides --preset.",
    )
    _add_config_options(p)
    p.add_argument("--quiet", action="store_true", help="only warnings and the final line")
    p.set_defaults(func=_cmd_run)


def _add_config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=list(PRESETS), default="small", help="base settings (default: small)")
    p.add_argument("--config", metavar="FILE", help="TOML file with any run option (see README)")
    p.add_argument("--strategy", choices=STRATEGIES, help="federated protocol")
    p.add_argument("--rounds", type=int, help="training rounds (local epochs)")
    p.add_argument("--clients", type=int, help="number of data owners")
    p.add_argument("--seed", type=int, help="seed of every random choice")
    p.add_argument("--data", metavar="FILE.tsv", help="own corpus: UTF-8 lines 'source<TAB>target'")
    p.add_argument("--out", metavar="DIR", help="output folder (default: runs/<strategy>-<preset>-seed<seed>)")
    p.add_argument("--beta", type=float, help="trustformer: clusters per layer as a fraction of its rows")
    p.add_argument("--agg-every", type=int, help="exchange every N rounds (the paper's Agg_fr)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other option by its dotted key, e.g. --set train.lr=3e-4 (repeatable)")


def resolve_config(args: argparse.Namespace) -> RunConfig:
    overrides: dict[str, Any] = {
        "federation.strategy": args.strategy,
        "federation.rounds": args.rounds,
        "federation.clients": args.clients,
        "federation.beta": args.beta,
        "federation.agg_every": args.agg_every,
        "seed": args.seed,
        "out": args.out,
    }
    if args.data:
        overrides["data.source"] = "tsv"
        overrides["data.path"] = args.data
    for item in args.set:
        key, value = parse_override(item)
        overrides[key] = value
    cfg = load_config(args.preset, args.config, overrides)
    if not cfg.out:
        cfg = load_config(args.preset, args.config, {
            **overrides, "out": os.path.join("runs", f"{cfg.federation.strategy}-{cfg.preset}-seed{cfg.seed}")
        })
    return cfg


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    _setup_logging(quiet=args.quiet or not cfg.runtime.progress)
    from .runtime.inprocess import run_in_process

    summary = run_in_process(cfg)
    if args.quiet:
        print(f"test loss {summary['test_loss']} · BLEU {summary['bleu']} · {cfg.out}/summary.json")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import tomli_w

    cfg = resolve_config(args)
    print(tomli_w.dumps(cfg.to_dict()), end="")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "kmeans":
        from .bench.kmeans_bench import main as bench_main

        return bench_main(args.rest)
    raise AssertionError(args.what)  # argparse restricts the choices


def _setup_logging(*, quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger("trustformer")
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    root.propagate = False
    logging.getLogger("flwr").setLevel(logging.WARNING)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that describe a problem with the input or the environment: printed without a traceback
    (set TRUSTFORMER_DEBUG=1 to see it)."""
    from .app import FederationError
    from .data.corpus import CorpusUnavailableError
    from .data.tokenizer import TokenizerUnavailableError
    from .wire import PayloadError
    from .workload import DataError

    return (CorpusUnavailableError, TokenizerUnavailableError, FederationError, PayloadError, DataError,
            FileNotFoundError, UnicodeDecodeError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trustformer",
        description="Privacy-preserving, communication-efficient federated training of Transformers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    c = sub.add_parser("config", help="print the resolved configuration as TOML (a starting --config file)")
    _add_config_options(c)
    c.set_defaults(func=_cmd_config)
    b = sub.add_parser("bench", help="benchmarks (print measured figures side by side)")
    b.add_argument("what", choices=["kmeans"])
    b.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark (see --help after it)")
    b.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    args = build_parser().parse_args(argv)
    try:
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
