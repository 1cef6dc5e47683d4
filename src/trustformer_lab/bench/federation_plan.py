"""The runs of ``trustformer bench federation`` (module docstring of :mod:`trustformer.bench.federation_bench`):
the benchmark's setting and options, and the planned rows — the default grid, ``--row``, ``--public`` and
``--record-dp``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trustformer.config import ConfigError, parse_override

DEFAULT_SETTING: dict[str, Any] = {
    "data.partition": "domain",
    "data.client_size": 3000,
    "data.own_test_size": 300,
    "federation.clients": 3,
    "federation.rounds": 10,
}
"""The benchmark's non-IID setting ("domain-3x3000"), applied on top of the ``small`` preset."""

BENCH_OPTIONS: dict[str, Any] = {
    "eval.meteor": False,
    "eval.bertscore": False,
    "federation.finetune_epochs": 1,
    "runtime.threads": 1,
}
"""Every run: test loss and BLEU only (no METEOR / BERTScore), one epoch of fine-tuning, one torch thread."""

TINY_SETTING: dict[str, Any] = {"data.partition": "domain", "data.own_test_size": 20}


@dataclass
class BenchRun:
    """One configuration of the benchmark (one seed)."""

    label: str
    overrides: dict[str, Any]
    seed: int
    beta: float | None = None
    deciding: bool = True  # run with every seed of --seeds
    kind: str = "run"  # "run": a federation; "public-model": the public model alone, scored without training

    @property
    def folder(self) -> str:
        name = "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in self.label.replace("β=", "beta"))
        return f"{name}-seed{self.seed}"


def plan_runs(
    betas: list[float],
    widths: list[int],
    seeds: list[int],
    memberships: list[str] | None = None,
    *,
    dp: bool = True,
    secagg: bool = True,
) -> list[BenchRun]:
    """The benchmark's runs (module docstring), deciding runs once per seed; ``widths`` are the coded runs'
    ``federation.payload_bits``."""
    plans: list[tuple[str, dict[str, Any], float | None, bool]] = [
        ("local", {"federation.strategy": "local"}, None, True),
        ("fedavg", {"federation.strategy": "fedavg"}, None, True),
        *(
            (f"fedavg {bits}-bit", {"federation.strategy": "fedavg", "federation.payload_bits": bits}, None, True)
            for bits in widths
        ),
    ]
    for beta in betas:
        modes: list[str] | list[None] = memberships or [None]
        for mode in modes:
            name = f"trustformer β={beta:g}" + (f" {mode}" if mode else "")
            base = {
                "federation.strategy": "trustformer",
                "trustformer.beta": beta,
                **({"trustformer.memberships": mode} if mode else {}),
            }
            plans.append((name, base, beta, True))
            plans += [(f"{name} {bits}-bit", {**base, "federation.payload_bits": bits}, beta, True) for bits in widths]
            if secagg:
                plans.append((f"{name} +secagg", {**base, "secure.mode": "secagg"}, beta, False))
        every = math.ceil(1 / beta - 1e-9)
        plans.append(
            (f"fedavg every {every}", {"federation.strategy": "fedavg", "federation.agg_every": every}, beta, True)
        )
        plans.append(
            (
                f"top-k {beta / 2:g}",
                {"federation.strategy": "fedavg-topk", "fedavg-topk.keep": beta / 2},
                beta,
                True,
            )
        )
    if secagg:
        plans.append(("fedavg +secagg", {"federation.strategy": "fedavg", "secure.mode": "secagg"}, None, False))
    if dp:
        plans += [(s, {"federation.strategy": s}, None, False) for s in ("dp-fedavg", "dp-fedsam", "dp-blur-lus")]
    unique = [plan for i, plan in enumerate(plans) if plan[0] not in {p[0] for p in plans[:i]}]  # βs sharing ⌈1/β⌉
    return [
        BenchRun(label, overrides, seed, beta, deciding)
        for label, overrides, beta, deciding in unique
        for seed in (seeds if deciding else seeds[:1])
    ]


def plan_extra_rows(rows: list[str], seeds: list[int]) -> list[BenchRun]:
    """``--row 'LABEL: key=value ...'``: a row of any protocol and options, run with every seed, or with those of
    its own ``seeds=0,1`` (each one of ``--seeds``)."""
    plans = []
    for text in rows:
        label, sep, options = text.partition(":")
        items = options.split()
        own = [item.partition("=")[2] for item in items if item.startswith("seeds=")]
        overrides = dict(parse_override(item) for item in items if not item.startswith("seeds="))
        if not sep or not label.strip() or not overrides:
            raise ConfigError(
                f"--row {text!r}: expected 'LABEL: key=value ...', e.g. "
                "'fedprox μ=0.1: federation.strategy=fedprox fedprox.mu=0.1' (seeds=0 runs it with seed 0 only)"
            )
        row_seeds = seeds
        if own:
            try:
                row_seeds = [int(x) for x in own[-1].split(",") if x.strip()]
            except ValueError:
                row_seeds = []
            if not row_seeds or not set(row_seeds) <= set(seeds):
                raise ConfigError(f"--row {text!r}: seeds={own[-1]} must name some of --seeds {seeds}")
        plans += [BenchRun(label.strip(), overrides, seed) for seed in row_seeds]
    return plans


PUBLIC = {"train.init": "public"}
SCRATCH = {"train.init": "scratch", "train.public_data": "", "model.adapters": "none"}
PUBLIC_PREFIX = "public"


def plan_public_runs(seeds: list[int], ranks: list[int], widths: list[int], betas: list[float]) -> list[BenchRun]:
    """The public-start rows (``--public``): the public model alone (scored, never trained on client data); public
    + training alone; public + FedAvg of the full model; public + FedAvg of LoRA adapters at each rank of ``ranks``,
    at 32 bits and at each width of ``widths``; public + Trustformer at each β over the full model and over the
    adapters of the largest rank."""
    lora = {**PUBLIC, "model.adapters": "lora"}
    plans: list[tuple[str, dict[str, Any], float | None, str]] = [
        ("public model", {**PUBLIC, "federation.strategy": "local"}, None, "public-model"),
        ("public + local", {**PUBLIC, "federation.strategy": "local"}, None, "run"),
        ("public + fedavg", {**PUBLIC, "federation.strategy": "fedavg"}, None, "run"),
    ]
    adapters = {rank: {**lora, "model.lora_rank": rank, "model.lora_alpha": 2.0 * rank} for rank in ranks}
    ranked = sorted(ranks, reverse=True)
    # the cheap rows that decide the targets first (the coded ones), then at 32 bits, then Trustformer
    plans += [
        (
            f"public + fedavg lora r{rank} {bits}-bit",
            {**adapters[rank], "federation.strategy": "fedavg", "federation.payload_bits": bits},
            None,
            "run",
        )
        for bits in widths
        for rank in ranked
    ]
    for beta in betas:
        tf = {"federation.strategy": "trustformer", "trustformer.beta": beta}
        plans += (
            [(f"public + trustformer β={beta:g} lora r{ranked[0]}", {**adapters[ranked[0]], **tf}, beta, "run")]
            if ranks
            else []
        )
    plans += [
        (f"public + fedavg lora r{rank}", {**adapters[rank], "federation.strategy": "fedavg"}, None, "run")
        for rank in ranked
    ]
    for beta in betas:
        plans.append(
            (
                f"public + trustformer β={beta:g}",
                {**PUBLIC, "federation.strategy": "trustformer", "trustformer.beta": beta},
                beta,
                "run",
            )
        )
    return [
        BenchRun(label, overrides, seed, beta, True, kind) for label, overrides, beta, kind in plans for seed in seeds
    ]


DOWN = " · down "
"""The label of a coded-download row: its base row's label, then this, then the width (``fedavg 2-bit · down 4``)."""


def plan_download_runs(
    downloads: list[int],
    seeds: list[int],
    *,
    bits: list[int],
    beta: float,
    ranks: list[int],
    public: bool,
) -> list[BenchRun]:
    """The coded-download rows (``--download-bits``), each at 32 bits (the base row) and at every width of
    ``downloads``: FedAvg at the narrowest upload width, Trustformer β at the widest and, with ``public``, public +
    FedAvg of LoRA adapters at each rank of ``ranks`` at the widest. The width a target is stated at runs with every
    seed: 2 for FedAvg (both ways ≤ 0.08×), 4 for Trustformer and LoRA (≤ 0.08× and ≤ 0.03× down); the others once."""
    narrow, wide = min(bits), max(bits)
    bases: list[tuple[str, dict[str, Any], float | None, int]] = [
        (f"fedavg {narrow}-bit", {"federation.strategy": "fedavg", "federation.payload_bits": narrow}, None, 2),
        (
            f"trustformer β={beta:g} {wide}-bit",
            {"federation.strategy": "trustformer", "trustformer.beta": beta, "federation.payload_bits": wide},
            beta,
            4,
        ),
    ]
    if public:
        bases += [
            (
                f"public + fedavg lora r{rank} {wide}-bit",
                {
                    **PUBLIC,
                    "model.adapters": "lora",
                    "model.lora_rank": rank,
                    "model.lora_alpha": 2.0 * rank,
                    "federation.strategy": "fedavg",
                    "federation.payload_bits": wide,
                },
                None,
                4,
            )
            for rank in sorted(ranks, reverse=True)
        ]
    runs = []
    for label, overrides, b, deciding in bases:
        runs += [BenchRun(label, overrides, seed, b, False) for seed in seeds[:1]]
        for down in downloads:
            row = f"{label}{DOWN}{down}"
            values = {**overrides, "federation.download_bits": down}
            runs += [
                BenchRun(row, values, seed, b, down == deciding) for seed in (seeds if down == deciding else seeds[:1])
            ]
    return runs


RECORD_DP: dict[str, Any] = {
    "privacy.unit": "record",
    "privacy.delta": 1e-5,
    "privacy.batch_size": 1024,
    "privacy.lr_scale": 4.0,
}
"""Every record-level DP row: DP-SGD with δ = 1e-5 (below 1/records) and the best recipe of ``trustformer bench
dp-recipe`` at ε = 8: Poisson batches of 1,024 pairs at 4 × the run's learning rate (docs/privacy.md)."""

RECIPE_BEFORE_SWEEP: dict[str, Any] = {"privacy.batch_size": 256, "privacy.lr_scale": 1.0}
"""The record-level recipe before the sweep (Poisson batches of 256 at the run's learning rate): the sweep's baseline
and the paper's DP reading."""

PAPER_DP_READING: dict[str, Any] = {
    "privacy.unit": "record",
    "privacy.epsilon": 1.0,
    "privacy.delta": 1e-3,
    **RECIPE_BEFORE_SWEEP,
}
"""The DP baselines' record-level reading at the paper's ε = 1 and δ = 1e-3 (per-record clip C = 0.5)."""


def plan_record_dp_runs(
    epsilons: list[float],
    seeds: list[int],
    *,
    public: bool,
    lora_rank: int,
    beta: float = 0.5,
    bits: int = 2,
    paper: bool = True,
) -> list[BenchRun]:
    """Record-level DP rows (``--record-dp``): per ε, FedAvg, FedAvg at ``bits`` and Trustformer β from scratch and
    (``public``) from the public model with LoRA adapters of ``lora_rank`` (and FedAvg of the full public model);
    the largest ε's rows run with every seed. ``paper``: the three DP baselines' record-level reading."""
    lora = {**PUBLIC, "model.adapters": "lora", "model.lora_rank": lora_rank, "model.lora_alpha": 2.0 * lora_rank}
    bases: list[tuple[str, dict[str, Any], float | None]] = [
        ("fedavg", {"federation.strategy": "fedavg"}, None),
        (f"fedavg {bits}-bit", {"federation.strategy": "fedavg", "federation.payload_bits": bits}, None),
        (f"trustformer β={beta:g}", {"federation.strategy": "trustformer", "trustformer.beta": beta}, beta),
    ]
    if public:  # first: DP is known to work best from a public start (Li et al. 2022; Yu et al. 2022)
        bases = (
            [(f"public + {name} lora r{lora_rank}", {**lora, **values}, b) for name, values, b in bases]
            + [("public + fedavg", {**PUBLIC, "federation.strategy": "fedavg"}, None)]
            + bases
        )
    top = max(epsilons, default=None)
    runs = [
        BenchRun(f"{name} dp ε={eps:g}", {**values, **RECORD_DP, "privacy.epsilon": eps}, seed, b, eps == top)
        for eps in sorted(epsilons, reverse=True)
        for name, values, b in bases
        for seed in (seeds if eps == top else seeds[:1])
    ]
    if paper:
        runs += [
            BenchRun(f"{s} record ε=1", {"federation.strategy": s, **PAPER_DP_READING}, seeds[0], None, False)
            for s in ("dp-fedavg", "dp-fedsam", "dp-blur-lus")
        ]
    # the rows that decide the verdict first: the first base (FedAvg's) at every ε, then the paper's reading
    first = [r for r in runs if r.label.startswith(f"{bases[0][0]} dp ")]
    paper_rows = [r for r in runs if r.label.endswith(" record ε=1")][:1]
    return first + paper_rows + [r for r in runs if r not in first and r not in paper_rows]


__all__ = [
    "BENCH_OPTIONS",
    "DEFAULT_SETTING",
    "PAPER_DP_READING",
    "PUBLIC",
    "PUBLIC_PREFIX",
    "RECIPE_BEFORE_SWEEP",
    "RECORD_DP",
    "SCRATCH",
    "TINY_SETTING",
    "DOWN",
    "BenchRun",
    "plan_download_runs",
    "plan_extra_rows",
    "plan_public_runs",
    "plan_record_dp_runs",
    "plan_runs",
]
