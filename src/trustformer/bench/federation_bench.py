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
  just these (with the four references).

Measured per row: test loss and BLEU on the shared test set and on each client's own held-out data (its
domains), the **gain retained** (X − local) / (FedAvg − local) on each of the four, upload and download bytes
per client per round relative to FedAvg's, what the server recovers of the clients' models (``attack
reconstruct``) and its **membership advantage** on their data (``attack membership``: the best server score's
AUC − 0.5, and its TPR at 1% FPR). The **Pareto front** of (gain on pooled test loss ↑, upload ↓, advantage ↓)
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
import math
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from ..cli_options import add_config_options, resolve_config
from ..config import ConfigError, RunConfig, build_config, load_config, parse_override

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
        for mode in memberships or [None]:
            name = f"trustformer β={beta:g}" + (f" {mode}" if mode else "")
            base = {
                "federation.strategy": "trustformer",
                "federation.beta": beta,
                **({"federation.memberships": mode} if mode else {}),
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
                {"federation.strategy": "fedavg-topk", "federation.topk_keep": beta / 2},
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
    """``--row 'LABEL: key=value ...'``: a row of any protocol and options, run with every seed."""
    plans = []
    for text in rows:
        label, sep, options = text.partition(":")
        overrides = dict(parse_override(item) for item in options.split())
        if not sep or not label.strip() or not overrides:
            raise ConfigError(
                f"--row {text!r}: expected 'LABEL: key=value ...', e.g. "
                "'fedprox μ=0.1: federation.strategy=fedprox fedprox.mu=0.1'"
            )
        plans += [BenchRun(label.strip(), overrides, seed) for seed in seeds]
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
        tf = {"federation.strategy": "trustformer", "federation.beta": beta}
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
                {**PUBLIC, "federation.strategy": "trustformer", "federation.beta": beta},
                beta,
                "run",
            )
        )
    return [
        BenchRun(label, overrides, seed, beta, True, kind) for label, overrides, beta, kind in plans for seed in seeds
    ]


RECORD_DP: dict[str, Any] = {"privacy.unit": "record", "privacy.delta": 1e-5, "privacy.batch_size": 256}
"""Every record-level DP row: DP-SGD with δ = 1e-5 (below 1/records) and an expected Poisson batch of 256 pairs
(large batches are what make DP-SGD's noise small against the signal; Li et al. 2022)."""

PAPER_DP_READING: dict[str, Any] = {
    "privacy.unit": "record",
    "privacy.epsilon": 1.0,
    "privacy.delta": 1e-3,
    "privacy.batch_size": 256,
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
        (f"trustformer β={beta:g}", {"federation.strategy": "trustformer", "federation.beta": beta}, beta),
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


# ------------------------------------------------------------------------------ one run


def _load(values: dict[str, Any]) -> RunConfig:
    return load_config(values["preset"], None, {k: v for k, v in values.items() if k != "preset"})


def finished(cfg: RunConfig) -> dict[str, Any] | None:
    """The measurements an earlier invocation left for exactly this configuration (``--reuse``), or None."""
    done = Path(cfg.out) / "bench.json"
    if not done.exists():
        return None
    previous = json.loads(done.read_text(encoding="utf-8"))
    try:  # read through today's defaults: a run measured before an option existed ran with its default
        config = build_config(previous.get("config") or {}).to_dict()
    except ConfigError:
        return None
    return previous if config == cfg.to_dict() else None


def run_one(values: dict[str, Any], reuse: bool, kind: str = "run") -> dict[str, Any]:
    """One benchmark run in this process (a worker's job): the federation under the attack harness, then what the
    server learns. Returns the run's measurements (and writes them to ``<out>/bench.json``)."""
    from ..attack.lira import REFERENCE_MODELS
    from ..attack.membership import membership
    from ..attack.reconstruct import observed_run, run_attack

    cfg = _load(values)
    if reuse and (previous := finished(cfg)) is not None:
        return previous
    if kind == "public-model":
        return _public_model_alone(cfg)
    started = time.perf_counter()
    run = observed_run(cfg)
    # training alone: the server holds nothing, and each LiRA reference model would repeat a whole training; LiRA's
    # check on true local models is the exchanging rows' true-local view (and `attack membership`)
    lira = REFERENCE_MODELS if run.protocol.spec.exchanges else 0
    result = {
        "config": cfg.to_dict(),
        "summary": _summary_fields(run.summary),
        "wall_s": time.perf_counter() - started,
        "attack": _attack_fields(run_attack(run.cfg, run)),
        "membership": membership(run, reference_models=lira),
    }
    (Path(cfg.out) / "bench.json").write_text(json.dumps(result, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    return result


def _public_model_alone(cfg: RunConfig) -> dict[str, Any]:
    """The public model as every client would use it without federating or training: its scores on the shared
    test set and on each client's own held-out data, no bytes, and the membership attack's loss score on it (no
    client's data reached it, so this is the attack's floor: the advantage the data's own structure gives)."""
    from ..attack.membership import CANDIDATES, summarize
    from ..core.shared import derive_seed
    from ..tasks.run import load_task

    started = time.perf_counter()
    task = load_task(cfg)
    model = task.initial_model().eval()
    clients = range(cfg.federation.clients)
    test_loss, bleu = task.test_loss(model), task.quick_scores(model)["bleu"]
    own = [task.own_metrics(model, c) for c in clients]
    per_client = {}
    for c in clients:
        members, non_members = task.membership_candidates(c, CANDIDATES, derive_seed(cfg.seed, "mia", c))
        per_client[c] = tuple([-x for x in task.example_losses(model, pool)] for pool in (members, non_members))
    loss = summarize(per_client, derive_seed(cfg.seed, "mia-bootstrap"))
    n = len(own)
    summary = {
        "test_loss": [test_loss] * n,
        "bleu": [bleu] * n,
        "own_test_loss": [o.get("own_test_loss") for o in own],
        "own_bleu": [o.get("own_bleu") for o in own],
        "bytes": {"up_per_client_per_round": 0.0, "down_per_client_per_round": 0.0},
        "public_model": task.public().report if hasattr(task, "public") else {},
    }
    result = {
        "config": cfg.to_dict(),
        "summary": summary,
        "wall_s": time.perf_counter() - started,
        "attack": {"recovered_fraction_mean": 0.0, "relative_error_mean": math.nan, "initial_error_mean": math.nan},
        "membership": {
            "server": {"loss": loss},
            "server_sees": "nothing (the public model alone)",
            "advantage": {
                "score": "loss",
                "auc_minus_half": loss["auc_mean"] - 0.5,
                "tpr_at_1pct_fpr": loss["tpr_at_0.01_fpr_mean"],
                "auc_ci95": loss["auc_mean_ci95"],
            },
        },
    }
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out) / "bench.json").write_text(json.dumps(result, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    return result


def run_configs(cfg: RunConfig, runs: list[BenchRun]) -> list[tuple[dict[str, Any], RunConfig]]:
    """Every run's option values (a worker's job) and configuration, validated before the first one trains: a
    value one run cannot take (say a β the privacy floor refuses) is reported at once, naming the run, not after
    an hour of the others."""
    jobs = []
    for run in runs:
        values = {**cfg.flat(), **run.overrides, "seed": run.seed, "out": str(Path(cfg.out) / run.folder)}
        try:
            jobs.append((values, _load(values)))
        except ConfigError as exc:
            raise ConfigError(f"benchmark run '{run.label}' (seed {run.seed}): {exc}") from exc
    return jobs


def _summary_fields(summary: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "test_loss",
        "bleu",
        "own_test_loss",
        "own_bleu",
        "ft_test_loss",
        "ft_bleu",
        "ft_own_test_loss",
        "ft_own_bleu",
        "finetune_s",
        "bytes",
        "samples",
        "time_s",
        "privacy",
    )
    return {k: summary[k] for k in keys if k in summary}


def _attack_fields(attack: dict[str, Any]) -> dict[str, Any]:
    return {k: attack[k] for k in ("recovered_fraction_mean", "relative_error_mean", "initial_error_mean")}


# ------------------------------------------------------------------------------ the table


def gain_retained(value: float, local: float, fedavg: float, *, higher_is_better: bool = False) -> float:
    """(L_local − L) / (L_local − L_fedavg) for a loss, (B − B_local) / (B_fedavg − B_local) for a score; NaN when
    FedAvg is no better than training alone."""
    gap = (fedavg - local) if higher_is_better else (local - fedavg)
    gain = (value - local) if higher_is_better else (local - value)
    return gain / gap if gap > 0 else math.nan


METRICS = (
    ("loss", "test_loss", False),
    ("bleu", "bleu", True),
    ("own_loss", "own_test_loss", False),
    ("own_bleu", "own_bleu", True),
)


def _mean(values: list[float | None]) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.fmean(values) if values else math.nan


def table(runs: list[BenchRun], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per label (seeds averaged, their spread kept), plus a ``+ fine-tuning`` row per label."""
    by_label: dict[str, list[tuple[BenchRun, dict[str, Any]]]] = {}
    for run, result in zip(runs, results):
        by_label.setdefault(run.label, []).append((run, result))
    rows = []
    for label, group in by_label.items():
        for tuned in (False, True):
            if tuned and label in ("local", "public model"):  # nothing to fine-tune after / scored untrained
                continue
            rows.append(_row(label + (" + fine-tuning" if tuned else ""), group, tuned))
    local, fedavg = rows[0], next(r for r in rows if r["run"] == "fedavg")
    up, down = fedavg["up_bytes"], fedavg["down_bytes"]
    for row in rows:
        for name, _key, higher in METRICS:  # per seed against local and FedAvg of the same seed, then averaged
            row[f"gain_{name}_per_seed"] = [
                gain_retained(v, lv, fv, higher_is_better=higher)
                for v, lv, fv in zip(row[f"{name}_per_seed"], local[f"{name}_per_seed"], fedavg[f"{name}_per_seed"])
            ]
            spread = row[f"gain_{name}_per_seed"]
            row[f"gain_{name}"] = _mean(spread)
            row[f"gain_{name}_spread"] = (max(spread) - min(spread)) / 2 if len(spread) > 1 else math.nan
        row["upload_vs_fedavg"] = row["up_bytes"] / up if up else math.nan
        row["download_vs_fedavg"] = row["down_bytes"] / down if down else math.nan
    public_refs = [next((r for r in rows if r["run"] == name), None) for name in ("public + local", "public + fedavg")]
    if all(public_refs):  # the public-start references: public + training alone = 0, public + FedAvg = 1
        p_local, p_fedavg = public_refs
        for row in rows:
            for name, _key, higher in METRICS:
                per_seed = [
                    gain_retained(v, lv, fv, higher_is_better=higher)
                    for v, lv, fv in zip(
                        row[f"{name}_per_seed"], p_local[f"{name}_per_seed"], p_fedavg[f"{name}_per_seed"]
                    )
                ]
                row[f"pgain_{name}_per_seed"] = per_seed
                row[f"pgain_{name}"] = _mean(per_seed)
    mark_pareto(rows, "gain_loss", "pareto")
    mark_pareto(rows, "gain_own_loss", "pareto_own")
    return rows


def _row(label: str, group: list[tuple[BenchRun, dict[str, Any]]], tuned: bool) -> dict[str, Any]:
    run0, first = group[0]
    row: dict[str, Any] = {
        "run": label,
        "strategy": first["config"]["federation"]["strategy"],
        "beta": run0.beta,
        "overrides": run0.overrides,
        "seeds": [r.seed for r, _ in group],
        "wall_s": _mean([res["wall_s"] for _, res in group]),
    }
    prefix = "ft_" if tuned else ""
    for name, key, _higher in METRICS:
        per_seed = [_mean(res["summary"].get(prefix + key) or [math.nan]) for _, res in group]
        row[f"{name}_per_seed"] = per_seed
        row[name] = _mean(per_seed)
        row[f"{name}_spread"] = (max(per_seed) - min(per_seed)) / 2 if len(per_seed) > 1 else math.nan
    bytes_ = first["summary"]["bytes"]
    row["up_bytes"], row["down_bytes"] = bytes_["up_per_client_per_round"], bytes_["down_per_client_per_round"]
    mia = [res["membership"].get("advantage") or {} for _, res in group]
    row["mia_advantage"] = _mean([m.get("auc_minus_half") for m in mia])
    row["mia_advantage_per_seed"] = [m.get("auc_minus_half") for m in mia]
    row["mia_tpr_1pct"] = _mean([m.get("tpr_at_1pct_fpr") for m in mia])
    row["mia_score"] = mia[0].get("score")
    row["mia_ci95"] = mia[0].get("auc_ci95")
    row["true_local_auc"] = _mean([_best(res["membership"].get("true-local", {})) for _, res in group])
    row["epsilon"] = _mean([(res["summary"].get("privacy") or {}).get("epsilon") for _, res in group])
    row["epsilon_lb"] = _mean([(res["membership"].get("audit") or {}).get("epsilon_lb") for _, res in group])
    row["recovered"] = _mean([res["attack"]["recovered_fraction_mean"] for _, res in group])
    row["relative_error"] = _mean([res["attack"]["relative_error_mean"] for _, res in group])
    row["samples"] = (first["summary"].get("samples") or {}).get("0", [])[:2]
    return row


def _best(view: dict[str, Any]) -> float:
    return max((s["auc_mean"] for s in view.values()), default=math.nan)


def _tolerance(rows: list[dict[str, Any]], key: str) -> float:
    """The typical seed-to-seed spread of ``key`` (median over the rows run with several seeds)."""
    spreads = [r[f"{key}_spread"] for r in rows if not math.isnan(r.get(f"{key}_spread", math.nan))]
    return statistics.median(spreads) if spreads else 0.0


def mark_pareto(rows: list[dict[str, Any]], gain_key: str, flag: str) -> None:
    """``row[flag]``: no other row is at least as good on gain (↑), upload (↓) and membership advantage (↓) and
    better on one, beyond the seed-to-seed spread (a smaller difference is a tie); ``row[flag + "_by"]`` names
    the rows that dominate it."""
    gain_tol = _tolerance(rows, gain_key)
    adv_tol = 0.02  # membership AUC: differences below this are within its bootstrap noise at n = 300
    for row in rows:
        dominated_by = []
        for other in rows:
            if other is row or any(math.isnan(other[k]) for k in (gain_key, "upload_vs_fedavg", "mia_advantage")):
                continue
            no_worse = (
                other[gain_key] >= row[gain_key] - gain_tol
                and other["upload_vs_fedavg"] <= row["upload_vs_fedavg"] * 1.02
                and other["mia_advantage"] <= row["mia_advantage"] + adv_tol
            )
            better = (
                other[gain_key] > row[gain_key] + gain_tol
                or other["upload_vs_fedavg"] < row["upload_vs_fedavg"] * 0.98
                or other["mia_advantage"] < row["mia_advantage"] - adv_tol
            )
            if no_worse and better:
                dominated_by.append(other["run"])
        row[flag] = not dominated_by and not math.isnan(row[gain_key])
        row[flag + "_by"] = dominated_by


def format_table(rows: list[dict[str, Any]]) -> str:
    public = any("pgain_loss" in r for r in rows)
    head = (
        f"{'run':<40} {'loss':>6} {'±':>5} {'BLEU':>5} {'own':>6} {'gain':>5} {'±':>4} {'gBLEU':>5} {'g own':>5} "
        + (f"{'pgain':>5} {'pgown':>5} " if public else "")
        + f"{'up':>6} {'down':>5} {'MIA':>5} {'TPR1%':>5} {'ε':>5} {'ε_lb':>5} {'rec.':>6} {'front':>5}"
    )
    lines = [head, "-" * len(head)]

    def num(value: float, width: int, digits: int) -> str:
        if value is None or math.isnan(value):
            return f"{'n/a':>{width}}"
        for shown in range(digits, -1, -1):  # fewer digits, then powers of ten: a diverged run keeps the columns
            text = f"{value:>{width}.{shown}f}"
            if len(text) <= width:
                return text
        return f"{value:>{width}.0e}"

    for r in rows:
        front = ("*" if r["pareto"] else "") + ("†" if r["pareto_own"] else "")
        lines.append(
            f"{r['run']:<40} {num(r['loss'], 6, 3)} {num(r['loss_spread'], 5, 3)} {num(r['bleu'], 5, 1)} "
            f"{num(r['own_loss'], 6, 3)} {num(r['gain_loss'], 5, 2)} {num(r['gain_loss_spread'], 4, 2)} "
            f"{num(r['gain_bleu'], 5, 2)} {num(r['gain_own_loss'], 5, 2)} "
            + (
                f"{num(r.get('pgain_loss', math.nan), 5, 2)} {num(r.get('pgain_own_loss', math.nan), 5, 2)} "
                if public
                else ""
            )
            + f"{num(r['upload_vs_fedavg'], 6, 3)} "
            f"{num(r['download_vs_fedavg'], 5, 2)} {num(r['mia_advantage'], 5, 3)} "
            f"{num(r['mia_tpr_1pct'], 5, 3)} {num(r.get('epsilon', math.nan), 5, 2)} "
            f"{num(r.get('epsilon_lb', math.nan), 5, 2)} {num(r['recovered'], 6, 4)} {front:>5}"
        )
    lines.append(
        "loss: mean test loss on the shared test set (± half the seed range); own: on each client's own "
        "held-out "
        "data; gain / gBLEU / g own: gain retained over training alone (FedAvg = 1) on pooled loss, pooled "
        "BLEU, own-data loss; "
        + (
            "pgain / pgown: the same on pooled and own-data loss against the "
            "public-start references (public + local = 0, public + fedavg = 1); "
            if public
            else ""
        )
        + "up / down: bytes per client per round / FedAvg's; MIA: the server's membership "
        "advantage (AUC − 0.5 of its best score, LiRA included); TPR1%: its TPR at 1% FPR; ε: the DP "
        "guarantee the run reports (record level: the largest client's); ε_lb: the attack's empirical lower "
        "bound on ε (Clopper-Pearson, 95%); rec.: weights it recovers "
        "exactly; front: * on the Pareto front of (gain, up, MIA), † with own-data gain"
    )
    return "\n".join(lines)


def figure(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """The frontier: gain retained against upload (log), the server's membership advantage as colour; the front
    ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 6), sharey=False)
    shown = [r for r in rows if not math.isnan(r["upload_vs_fedavg"]) and r["upload_vs_fedavg"] > 0]
    scatter = None
    for ax, key, flag, title in (
        (axes[0], "gain_loss", "pareto", "shared test set"),
        (axes[1], "gain_own_loss", "pareto_own", "each client's own data"),
    ):
        points = [r for r in shown if not math.isnan(r[key])]
        ax.set_title(
            f"gain on {title}\nred ring: Pareto front"
            + (
                "; DP runs (far below) sit on the bottom edge"
                if any(r["run"].startswith("dp-") for r in points)
                else ""
            ),
            fontsize=9,
        )
        if not points:  # no gain to show: FedAvg and training alone tie on this measure, or it was not measured
            ax.text(0.5, 0.5, "gain undefined (FedAvg ≈ training alone)", ha="center", transform=ax.transAxes)
            continue
        low, high = -0.6, max([1.4] + [r[key] + 0.1 for r in points])
        clipped = [max(low + 0.05, r[key]) for r in points]  # far below training alone (the DP runs): at the edge
        scatter = ax.scatter(
            [r["upload_vs_fedavg"] for r in points],
            clipped,
            c=[r["mia_advantage"] for r in points],
            cmap="viridis_r",
            vmin=0,
            vmax=max([0.3] + [r["mia_advantage"] for r in points if not math.isnan(r["mia_advantage"])]),
            s=60,
            edgecolors=["red" if r[flag] else "none" for r in points],
            linewidths=1.8,
        )
        for r, y in zip(points, clipped):
            finetuned, dp = r["run"].endswith(" + fine-tuning"), r["run"].startswith("dp-")
            if not r[flag] and (finetuned or dp):  # named: the front, and runs before fine-tuning but DP's
                continue
            text = r["run"].replace(" + fine-tuning", " +ft") + (f" ({r[key]:.0f})" if r[key] < low else "")
            ax.annotate(text, (r["upload_vs_fedavg"], y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.set_ylim(low, high)
        ax.set_xscale("log")
        ax.axhline(1.0, color="grey", lw=0.6, ls="--")
        ax.axhline(0.0, color="grey", lw=0.6, ls=":")
        ax.set_xlabel("upload per client per round / FedAvg's (log)")
        ax.set_ylabel("gain retained over training alone (test loss)")
    if scatter is not None:
        fig.colorbar(scatter, ax=axes, label="server's membership advantage (AUC − 0.5)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


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
        "--row",
        action="append",
        default=[],
        metavar="'LABEL: key=value ...'",
        help="add a row of any protocol, decided with every seed: its label, a colon, then its options "
        "as space-separated key=value (e.g. 'fedprox μ=0.1: federation.strategy=fedprox "
        "fedprox.mu=0.1'); repeatable",
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
    return resolve_config(args)


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
    runs += plan_extra_rows(args.row, seeds)
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
    if args.only:
        wanted = {x.strip() for x in args.only.split(",") if x.strip()}
        keep = {"local", "fedavg", *wanted}
        if PUBLIC_PREFIX in wanted:
            keep |= {"public + local", "public + fedavg"}  # the public-start references (pgain)
        runs = [
            r
            for r in runs
            if r.label in keep
            or (PUBLIC_PREFIX in wanted and r.label.startswith(PUBLIC_PREFIX))
            or ("dp" in wanted and (" dp ε=" in r.label or " record ε=" in r.label))
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
        results = [finished(run_cfg) for _, run_cfg in jobs]
        if reused := sum(r is not None for r in results):
            print(f"reusing {reused} finished runs from {out}", file=sys.stderr, flush=True)
    todo = [i for i, r in enumerate(results) if r is None]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_one, jobs[i][0], False, runs[i].kind): i for i in todo}
        for done, future in enumerate(as_completed(futures), start=1):
            i = futures[future]
            results[i] = r = future.result()
            elapsed = time.perf_counter() - started
            print(
                f"[{done}/{len(todo)}] {runs[i].label} (seed {runs[i].seed}): test loss "
                f"{_mean(r['summary']['test_loss']):.3f} · BLEU {_mean(r['summary']['bleu']):.2f} · "
                f"{r['wall_s']:.0f} s · elapsed {elapsed / 60:.1f} min · ETA "
                f"{elapsed / done * (len(todo) - done) / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
    rows = table(runs, results)
    print(format_table(rows))
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
