"""`trustformer bench dp-recipe`: the levers of record-level DP training, swept at one ε from the public start, on
the frontier's setting (``bench federation``'s rows, so every row has the same columns and references).

Every row is public + FedAvg of LoRA adapters (``--rank``) under record-level DP-SGD at ``--epsilon`` (δ = 1e-5),
with one lever changed from the baseline (the recipe before the sweep: Poisson batches of 256 at the run's learning
rate, ``RECIPE_BEFORE_SWEEP``; the benchmark's record rows now run the ``lr×4`` row's recipe as
``privacy.batch_size = 1024`` with ``privacy.lr_scale = 4``):

- ``B=1024``, ``B=full``: larger Poisson batches and fewer noisy steps (Li et al. 2022; De et al. 2022);
- ``lr×0.5``, ``lr×4``: the learning rate, at the larger batch (a DP step needs its own);
- ``recipe``: the winner as the benchmark runs it (``RECORD_DP``): ``lr×4`` on the DP steps only
  (``privacy.lr_scale``), the free fine-tuning at the run's own rate;
- ``C=0.1``, ``C=2``: the clip norm;
- ``adam-bc``: DP-AdamBC, the noise's variance out of Adam's second moment (``privacy.adam_correction``);
- ``ffa``: FFA-LoRA, only the adapters' B trains (``model.lora_train = "b"``);
- ``r4``: a lower rank;
- ``distributed``: the noise added once over secure aggregation (``privacy.noise = "distributed"``);
- ``--combine``: rows of several levers at once (``'B=1024+adam-bc'``).

The table is ``bench federation``'s: ``pgain`` is the share of the public-start gap closed (public + training
alone = 0, public + FedAvg = 1), beside BLEU, own-data loss after free fine-tuning, ε and bytes. ``--rounds``
defaults to 5 (the sweep's cheap setting); carry the winners to the 10 rounds of the benchmark with ``bench
federation --row``. ``--levers`` picks a subset.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from .federation_bench import main as federation_main
from .federation_plan import PUBLIC, RECIPE_BEFORE_SWEEP, RECORD_DP

LEVERS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "B=1024": {"privacy.batch_size": 1024},
    "B=full": {"privacy.batch_size": -1},  # -1: the client's whole shard (data.client_size)
    "lr×0.5": {"privacy.batch_size": 1024, "train.lr": 0.5},  # train.lr values here: factors of the run's lr
    "lr×4": {"privacy.batch_size": 1024, "train.lr": 4.0},
    "recipe": {k: RECORD_DP[k] for k in ("privacy.batch_size", "privacy.lr_scale")},  # lr×4 on the DP steps only
    "C=0.1": {"privacy.clip_norm": 0.1},
    "C=2": {"privacy.clip_norm": 2.0},
    "adam-bc": {"privacy.adam_correction": True},
    "ffa": {"model.lora_train": "b"},
    "r4": {"model.lora_rank": 4, "model.lora_alpha": 8.0},
    "distributed": {"privacy.noise": "distributed", "secure.mode": "secagg"},
}
"""Each lever's options on top of the baseline (module docstring)."""


def lever_options(names: list[str], *, lr: float, client_size: int) -> dict[str, Any]:
    """The options of the levers ``names`` together (later ones win), with the learning-rate factors applied to
    ``lr`` and a full batch as ``client_size``."""
    options: dict[str, Any] = {}
    for name in names:
        if name not in LEVERS:
            raise argparse.ArgumentTypeError(f"unknown lever {name!r}: choose from {', '.join(LEVERS)}")
        options.update(LEVERS[name])
    if "train.lr" in options:
        options["train.lr"] = options["train.lr"] * lr
    if options.get("privacy.batch_size") == -1:
        options["privacy.batch_size"] = client_size
    return options


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trustformer bench dp-recipe",
        description="The levers of record-level DP training swept at one ε from the public start (module "
        "docstring of trustformer.bench.dp_recipe_bench; docs/privacy.md).",
    )
    p.add_argument("--epsilon", type=float, default=8.0, help="ε of every row (δ = 1e-5; default: 8)")
    p.add_argument("--rank", type=int, default=16, help="the LoRA rank of the baseline (default: 16)")
    p.add_argument("--levers", default=",".join(LEVERS), help=f"levers to sweep (default: all: {', '.join(LEVERS)})")
    p.add_argument("--combine", action="append", default=[], help="a row of several levers, e.g. 'B=1024+adam-bc'")
    p.add_argument("--rounds", type=int, default=5, help="rounds of every run (default: 5, the sweep's setting)")
    p.add_argument("--preset", default="small", help="preset (default: small)")
    p.add_argument("--seeds", default="0", help="seeds (default: 0)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (default: 2)")
    p.add_argument("--out", default="runs/bench-dp-recipe", help="output folder")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any option, for every row")
    p.add_argument("--reuse", action="store_true", help="reuse finished runs (bench federation --reuse)")
    return p.parse_args(argv)


def federation_argv(args: argparse.Namespace, *, lr: float, client_size: int) -> list[str]:
    """The ``bench federation`` command line of the sweep: one ``--row`` per lever and combination."""
    base = {
        **PUBLIC,
        **RECORD_DP,
        **RECIPE_BEFORE_SWEEP,
        "privacy.epsilon": args.epsilon,
        "model.adapters": "lora",
        "model.lora_rank": args.rank,
        "model.lora_alpha": 2.0 * args.rank,
        "federation.strategy": "fedavg",
    }
    rows = [[name] for name in args.levers.split(",") if name.strip()] + [c.split("+") for c in args.combine]
    argv = ["--preset", args.preset, "--rounds", str(args.rounds), "--seeds", args.seeds, "--jobs", str(args.jobs)]
    argv += ["--public", "--no-dp", "--no-secagg", "--no-attacks", "--out", args.out]
    labels = []
    for names in rows:
        values = {**base, **lever_options([n.strip() for n in names], lr=lr, client_size=client_size)}
        label = f"public + lora r{args.rank} dp ε={args.epsilon:g} {'+'.join(n.strip() for n in names)}"
        labels.append(label)
        argv += ["--row", f"{label}: " + " ".join(f"{k}={_value(v)}" for k, v in values.items())]
    argv += ["--only", ",".join(["public + local", "public + fedavg", *labels])]
    for item in args.set:
        argv += ["--set", item]
    if args.json:
        argv += ["--json", args.json]
    if args.reuse:
        argv.append("--reuse")
    return argv


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    from trustformer.config import load_config

    args = parse_args(argv)
    cfg = load_config(args.preset, None, {})
    client_size = cfg.data.client_size or 3000
    if args.preset == "small":
        client_size = 3000  # the benchmark's setting (bench federation's DEFAULT_SETTING)
    command = federation_argv(args, lr=cfg.train.lr, client_size=client_size)
    print("trustformer bench federation " + shlex.join(command), flush=True)
    return federation_main(command)


__all__ = ["LEVERS", "federation_argv", "lever_options", "main"]
