"""The options every command that builds a run shares (``trustformer run``, ``config``, ``bench``, ``attack``,
``deploy``, ``attest``), how they resolve into a :class:`~trustformer.config.RunConfig` (:func:`resolve_config`;
:func:`run_config` also continues a checkpointed run, ``--resume``), and the commands' logging."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import warnings
from collections.abc import Collection
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
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="base settings: tiny (tests and smoke runs, seconds; its model is too small to translate, its "
        "translations blank or meaningless) | small (the CPU demo, minutes; the default) | paper (Table II, for a GPU)",
    )
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
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output folder (default: runs/<strategy>-<preset>-seed<seed>, then each setting that differs from the "
        "preset's defaults, e.g. -mode=secagg)",
    )
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


def resolve_config(args: argparse.Namespace, *, strategies: Collection[str] = ()) -> RunConfig:
    """The run configuration of the shared options: preset < ``--config`` < options < ``--set``. A protocol's
    section the options set (``--set trustformer.beta=0.3``) that neither the run's strategy nor one of
    ``strategies`` (those a sweep runs besides) reads is refused."""
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
    cfg = load_config(preset, args.config, overrides, used_by=strategies)
    if not cfg.out:
        with warnings.catch_warnings():  # the same keys again: their deprecation was reported once above
            warnings.simplefilter("ignore", ConfigDeprecationWarning)
            cfg = load_config(preset, args.config, {**overrides, "out": default_out(cfg)})
    return cfg


# keys the default folder's name holds in its stem, or that do not make a run another one
_NAMED = ("out", "seed", "preset", "task", "federation.strategy", "runtime.resume")
_SAFE = re.compile(r"[A-Za-z0-9._+-]{1,32}")
_LONGEST_SETTINGS = 120  # characters of settings in a folder's name; longer: their hash


def default_out(cfg: RunConfig) -> str:
    """The output folder of a run not given one: ``runs/[<task>-]<strategy>-<preset>-seed<seed>``, then every setting
    that differs from the preset's defaults as ``-key=value`` in the order of their dotted keys (the key's last part
    where no other option shares it; a value that is not a short plain word, by a hash of it; settings longer than
    120 characters in all, by ``settings=<hash>``). Deterministic, and runs whose settings differ get different
    folders: ``runs/fedavg-small-seed0`` (the demo), ``runs/fedavg-small-seed0-mode=secagg``."""
    task = "" if cfg.task == "translation" else f"{cfg.task}-"
    stem = f"{task}{cfg.federation.strategy}-{cfg.preset}-seed{cfg.seed}"
    changed = non_default_settings(cfg)
    if not changed:
        return os.path.join("runs", stem)
    labels = _setting_labels()
    settings = "-".join(f"{labels.get(key, key)}={_value_label(value)}" for key, value in changed.items())
    if len(settings) > _LONGEST_SETTINGS:
        settings = f"settings={_digest(changed)}"
    return os.path.join("runs", f"{stem}-{settings}")


def non_default_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that differ from its preset's defaults for its task (a protocol's own section: from
    the section's defaults), by dotted key in sorted order; the name's stem (strategy, preset, seed, task) and
    ``out`` left out."""
    import dataclasses

    from .registry import protocol_spec

    base = load_config(cfg.preset, None, {"task": cfg.task})
    base = dataclasses.replace(base, sections=tuple((n, protocol_spec(n).section()) for n, _ in cfg.sections))
    defaults = base.flat()
    return {
        key: value
        for key, value in sorted(cfg.flat().items())
        if key not in _NAMED and (key not in defaults or defaults[key] != value)
    }


def _setting_labels() -> dict[str, str]:
    """Each dotted key's label in a folder's name: its last part where no other option (of any protocol's section)
    has that last part, else the whole key (``train.lr``: ``image.lr`` is another option)."""
    import dataclasses

    from .registry import protocol_specs

    keys = list(RunConfig().flat())
    for spec in protocol_specs():
        if spec.section is not None:
            keys += [f"{spec.name}.{f.name}" for f in dataclasses.fields(spec.section)]
    leaves = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: leaf for key, leaf in zip(keys, leaves, strict=True) if leaves.count(leaf) == 1}


def _value_label(value: Any) -> str:
    """A value as a folder name shows it: a number or plain word as written (``8``, ``1e-05``, ``secagg``, ``true``),
    a list of them joined by ``+``; anything else (a path, a fault) by a hash of it."""
    if isinstance(value, list):
        words = [_plain(v) for v in value]
        joined = "+".join(w for w in words if w is not None)
        if value and None not in words and all("+" not in w for w in words if w) and len(joined) <= 32:
            return joined
        return _digest(value)
    word = _plain(value)
    return _digest(value) if word is None else word


def _plain(value: Any) -> str | None:
    """A number, boolean or short plain word as written; None for anything else."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        short = format(value, "g")
        return short if float(short) == value else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and _SAFE.fullmatch(value):
        return value
    return None


def _digest(value: Any) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()[:8]


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
    "default_out",
    "float_list",
    "int_list",
    "str_list",
    "interrupted_advice",
    "non_default_settings",
    "refuse_existing_run",
    "resolve_config",
    "run_config",
    "setup_logging",
    "why_not_resumable",
]
