"""The options every command that builds a run shares (``trustformer run``, ``config``, ``bench``, ``attack``,
``deploy``, ``attest``), how they resolve into a :class:`~trustformer.config.RunConfig` (:func:`resolve_config`;
:func:`run_config` also continues a checkpointed run, ``--resume``), and the commands' logging."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from .config import PRESETS, SECURE_MODES, STRATEGIES, TASKS, ConfigError, RunConfig, load_config, parse_override
from .config.run import ConfigDeprecationWarning

# options of add_config_options that --resume replaces with the checkpointed run's configuration
RUN_OPTIONS = (
    "preset",
    "strategy",
    "rounds",
    "clients",
    "seed",
    "data",
    "out",
    "beta",
    "agg_every",
    "config",
    "secure",
)


def add_config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=list(PRESETS), default=None, help="base settings (default: small)")
    p.add_argument("--config", metavar="FILE", help="TOML file with any run option (docs/configuration.md)")
    p.add_argument(
        "--task", choices=TASKS, help="learning task (default: translation); the preset's values follow the task"
    )
    p.add_argument("--strategy", choices=STRATEGIES, help="federated protocol")
    p.add_argument("--rounds", type=int, help="training rounds (local epochs)")
    p.add_argument("--clients", type=int, help="number of data owners")
    p.add_argument("--seed", type=int, help="seed of every random choice")
    p.add_argument("--data", metavar="FILE.tsv", help="own corpus: UTF-8 lines 'source<TAB>target[<TAB>domain]'")
    p.add_argument(
        "--public-data",
        metavar="FILE.tsv",
        help="start from a model pretrained on these public pairs ('source<TAB>target' lines) instead of "
        "random weights (shorthand for --set train.init=public --set train.public_data=FILE.tsv)",
    )
    p.add_argument("--out", metavar="DIR", help="output folder (default: runs/<strategy>-<preset>-seed<seed>)")
    p.add_argument("--beta", type=float, help="trustformer: clusters per layer as a fraction of its rows")
    p.add_argument("--agg-every", type=int, help="exchange every N rounds (the paper's Agg_fr)")
    p.add_argument(
        "--secure",
        choices=SECURE_MODES,
        metavar="MODE",
        help="secure exchange: none | tee (attested aggregator, sealed payloads; TEE emulated in "
        "software) | secagg (secure aggregation) | tee+secagg (shorthand for --set secure.mode=MODE)",
    )
    p.add_argument(
        "--engine",
        choices=("inprocess", "simulation"),
        help="what runs the apps: inprocess (one process, the default) | simulation (Flower's Simulation "
        "Engine on Ray; shorthand for --set runtime.engine=ENGINE)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other option by its dotted key, e.g. --set train.lr=3e-4 (repeatable)",
    )


def resolve_config(args: argparse.Namespace) -> RunConfig:
    """The run configuration of the shared options: preset < ``--config`` < options < ``--set``."""
    overrides: dict[str, Any] = {
        "task": getattr(args, "task", None),
        "federation.strategy": args.strategy,
        "federation.rounds": args.rounds,
        "federation.clients": args.clients,
        "trustformer.beta": args.beta,
        "federation.agg_every": args.agg_every,
        "secure.mode": getattr(args, "secure", None),
        "runtime.engine": getattr(args, "engine", None),
        "seed": args.seed,
        "out": args.out,
    }
    if args.data:
        overrides["data.source"] = "tsv"
        overrides["data.path"] = args.data
    if getattr(args, "public_data", None):
        overrides["train.init"] = "public"
        overrides["train.public_data"] = args.public_data
    for item in args.set:
        key, value = parse_override(item)
        overrides[key] = value
    preset = args.preset or "small"
    cfg = load_config(preset, args.config, overrides)
    if not cfg.out:
        task = "" if cfg.task == "translation" else f"{cfg.task}-"
        with warnings.catch_warnings():  # the same keys again: their deprecation was reported once above
            warnings.simplefilter("ignore", ConfigDeprecationWarning)
            cfg = load_config(
                preset,
                args.config,
                {
                    **overrides,
                    "out": os.path.join("runs", f"{task}{cfg.federation.strategy}-{cfg.preset}-seed{cfg.seed}"),
                },
            )
    return cfg


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's configuration: from the options (:func:`resolve_config`), or (``--resume DIR``, ``trustformer
    run`` and ``trustformer deploy server|local``) from DIR's checkpoint, ``--set`` changing operational
    settings only."""
    if not getattr(args, "resume", None):
        return resolve_config(args)
    from .runtime.checkpoint import read_checkpoint, resume_config

    given = [f"--{name.replace('_', '-')}" for name in RUN_OPTIONS if getattr(args, name, None) is not None]
    if given:
        raise ConfigError(
            f"--resume continues the checkpointed run with its own configuration; drop {', '.join(given)}"
        )
    overrides: dict[str, Any] = dict(parse_override(item) for item in args.set)
    cfg = resume_config(args.resume, overrides)
    done = read_checkpoint(args.resume).round
    if done >= cfg.federation.rounds and (Path(args.resume) / "summary.json").exists():
        raise ConfigError(
            f"--resume {args.resume}: that run already finished (all {cfg.federation.rounds} "
            "round(s) and summary.json); nothing to resume — start a new run with another --out"
        )
    return cfg


def setup_logging(*, quiet: bool) -> None:
    """Progress lines on stderr (only warnings when ``quiet``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger("trustformer")
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    root.propagate = False
    logging.getLogger("flwr").setLevel(logging.WARNING)


def check_out_folder(out: str) -> None:
    """The output folder (``--out``, the configuration's ``out``) must be a folder or a path that can become one:
    a regular file at it or at any folder above it would stop the run only when it first writes there, after the
    data has loaded, with a bare ``FileExistsError`` / ``NotADirectoryError``. Refuse it at once, naming it."""
    folder = Path(out)
    for path in (folder, *folder.parents):
        if path.is_dir():
            return
        if path.exists() or path.is_symlink():
            what = "a file, not a folder" if path.is_file() else "not a folder"
            if path == folder:
                problem = f"{folder} is {what} (a run writes its outputs into a folder)"
            else:
                problem = f"{folder} lies under {path}, which is {what}, so it cannot be created"
            raise ConfigError(f"--out (out): {problem}; choose another folder with --out DIR")


def refuse_existing_run(out: str) -> None:
    """A new run into a folder that holds a run (finished, or checkpointed and interrupted) would replace its
    summary, metrics and model without a word: refuse, naming the options that say what to do (``--resume``
    only for an interrupted run that can be resumed: :func:`why_not_resumable`)."""
    folder = Path(out)
    summary, checkpoint = folder / "summary.json", folder / "checkpoint.json"
    if summary.exists():
        raise ConfigError(
            f"{folder} holds a finished run ({summary.name}, its metrics and model): choose another folder with "
            "--out DIR, or pass --overwrite to replace it"
        )
    if checkpoint.exists():
        reason = why_not_resumable(folder)
        if reason:
            raise ConfigError(
                f"{folder} holds an interrupted run ({checkpoint.name}) that cannot be resumed: {reason}; choose "
                "another folder with --out DIR, or pass --overwrite to replace it"
            )
        raise ConfigError(
            f"{folder} holds an interrupted run ({checkpoint.name}): continue it with 'trustformer run --resume "
            f"{folder}', choose another folder with --out DIR, or pass --overwrite to replace it"
        )


def why_not_resumable(folder: str | Path) -> str | None:
    """Why the interrupted run checkpointed in ``folder`` cannot be continued in one process (``trustformer run
    --resume``), read from its checkpoint's recorded configuration; None when it can."""
    from .runtime.checkpoint import CheckpointError, resume_config
    from .runtime.node import keeps_state_on_disk

    try:
        cfg = resume_config(folder)
    except (CheckpointError, ConfigError) as exc:
        return f"its checkpoint cannot be read back ({exc})"
    if not keeps_state_on_disk(cfg):
        store = cfg.runtime.store
        chosen = "" if store == "memory" else ", which chose memory for it (runtime.memory_budget_mb)"
        return (
            f"its clients kept their state in memory (runtime.store = {store}{chosen}), which ended with it "
            "(--set runtime.store=disk makes a run resumable)"
        )
    return None


def interrupted_advice(cfg: Any) -> str:
    """What to do after Ctrl-C: resume, or why the run cannot be resumed."""
    from .runtime.checkpoint import CheckpointError, read_checkpoint
    from .runtime.node import keeps_state_on_disk

    if not cfg.runtime.checkpoint:
        return "it cannot be resumed: runtime.checkpoint = false"
    if not keeps_state_on_disk(cfg):
        return (
            "it cannot be resumed: its clients kept their state in memory (runtime.store = memory), which ended "
            "with it; --set runtime.store=disk makes a run resumable"
        )
    try:
        done = read_checkpoint(cfg.out).round
    except CheckpointError:
        return "it completed no round, so there is nothing to resume: start it again"
    return f"it completed {done} round(s); continue it with: trustformer run --resume {cfg.out}"


def float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas, e.g. 0.1,0.5,0.9") from None


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers separated by commas, e.g. 1,2,5,10") from None


def str_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


__all__ = [
    "RUN_OPTIONS",
    "add_config_options",
    "check_out_folder",
    "float_list",
    "int_list",
    "str_list",
    "interrupted_advice",
    "refuse_existing_run",
    "resolve_config",
    "run_config",
    "setup_logging",
    "why_not_resumable",
]
