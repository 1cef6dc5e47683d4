"""The ``trustformer`` command."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Collection
from typing import Any

from .cli_options import (
    add_config_options,
    check_out_folder,
    interrupted_advice,
    refuse_existing_run,
    resolve_config,
    run_config,
    setup_logging,
)
from .config import ConfigError


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
    from .tasks.dp_advice import dp_advice

    check_metrics(cfg)  # before any training, not after it
    if advice := dp_advice(cfg):
        print(f"trustformer: note: {advice}", file=sys.stderr)
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


PLUGIN_GROUP = "trustformer.commands"
"""Entry points that add subcommands: each names a function taking the subparsers (the experiments add theirs this
way; ``pyproject.toml``)."""


def _plugin_commands(command: str | None, builtin: Collection[str]) -> list[Any]:
    """The entry points of :data:`PLUGIN_GROUP` to load: ``command``'s alone where it is one of them, none for a
    built-in command (``trustformer run`` imports no experiment), every one for help or another command."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=PLUGIN_GROUP))
    chosen = [e for e in found if e.name == command]
    return chosen if chosen else [] if command in builtin else found


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
    from .export.commands import add_predict_parser, add_translate_parser

    add_translate_parser(sub)
    add_predict_parser(sub)
    for plugin in _plugin_commands(command, set(sub.choices)):  # the experiments (bench, reproduce, report, attack)
        plugin.load()(sub)
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
