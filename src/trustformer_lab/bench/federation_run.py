"""One run of ``trustformer bench federation``: its configuration, the federation under the attack harness (or the
public model alone) and the measurements it leaves in ``<out>/bench.json`` (``--reuse`` reads them back)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, cast

from trustformer.config import ConfigError, RunConfig, build_config, load_config

from .federation_plan import BenchRun


def _load(values: dict[str, Any]) -> RunConfig:
    return load_config(values["preset"], None, {k: v for k, v in values.items() if k != "preset"})


def finished(cfg: RunConfig, attacks: bool = True) -> dict[str, Any] | None:
    """The measurements an earlier invocation left for exactly this configuration (``--reuse``), or None; one
    measured with ``--no-attacks`` is not taken where the attacks are wanted."""
    done = Path(cfg.out) / "bench.json"
    if not done.exists():
        return None
    previous = json.loads(done.read_text(encoding="utf-8"))
    if attacks and not previous.get("attacks", True):
        return None
    try:  # read through today's defaults: a run measured before an option existed ran with its default
        config = build_config(previous.get("config") or {}).to_dict()
    except ConfigError:
        return None
    return previous if comparable(config) == comparable(cfg.to_dict()) else None


RECORD_DP_ONLY = ("batch_size", "lr_scale")
"""Privacy options only record-level DP-SGD reads (their defaults changed with its recipe sweep)."""


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A configuration as ``--reuse`` compares it: without record-level DP, the options only it reads are left out
    (a run measured before their defaults changed ran the same)."""
    privacy = config.get("privacy") or {}
    if privacy.get("unit") == "record":
        return config
    return {**config, "privacy": {k: v for k, v in privacy.items() if k not in RECORD_DP_ONLY}}


def run_one(values: dict[str, Any], reuse: bool, kind: str = "run", attacks: bool = True) -> dict[str, Any]:
    """One benchmark run in this process (a worker's job): the federation under the attack harness, then what the
    server learns (``attacks``; without, the federation alone). Returns the run's measurements (and writes them to
    ``<out>/bench.json``), with its curve: (round, mean shared-test loss, cumulative bytes up + down)."""
    from trustformer.engine.inprocess import run_in_process

    from ..attack.harness import observed_run, run_attack
    from ..attack.lira import REFERENCE_MODELS
    from ..attack.membership import membership

    cfg = _load(values)
    if reuse and (previous := finished(cfg, attacks)) is not None:
        return previous
    if kind == "public-model":
        return _public_model_alone(cfg)
    started = time.perf_counter()
    if attacks:
        run = observed_run(cfg)
        # training alone: the server holds nothing, and each LiRA reference model would repeat a whole training;
        # LiRA's check on true local models is the exchanging rows' true-local view (and `attack membership`)
        lira = REFERENCE_MODELS if run.protocol.spec.exchanges else 0
        summary, wall_s = run.summary, time.perf_counter() - started
        attack, member = _attack_fields(run_attack(run.cfg, run)), membership(run, reference_models=lira)
    else:
        summary = run_in_process(cfg)
        wall_s = time.perf_counter() - started
        attack, member = {k: math.nan for k in ATTACK_FIELDS}, {}
    result = {
        "config": cfg.to_dict(),
        "attacks": attacks,
        "summary": _summary_fields(summary),
        "curve": curve(Path(cfg.out) / "metrics.jsonl"),
        "wall_s": wall_s,
        "attack": attack,
        "membership": member,
    }
    (Path(cfg.out) / "bench.json").write_text(json.dumps(result, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    return result


def _public_model_alone(cfg: RunConfig) -> dict[str, Any]:
    """The public model as every client would use it without federating or training: its scores on the shared
    test set and on each client's own held-out data, no bytes, and the membership attack's loss score on it (no
    client's data reached it, so this is the attack's floor: the advantage the data's own structure gives)."""
    from trustformer.core.shared import derive_seed
    from trustformer.tasks.run import load_task

    from ..attack.membership import CANDIDATES, summarize

    started = time.perf_counter()
    task = load_task(cfg)
    model = task.initial_model().eval()
    clients = range(cfg.federation.clients)
    test_loss, bleu = task.test_loss(model), task.quick_scores(model)["bleu"]
    own = [task.own_metrics(model, c) for c in clients]
    per_client: dict[int, tuple[list[float], list[float]]] = {}
    for c in clients:
        members, non_members = task.membership_candidates(c, CANDIDATES, derive_seed(cfg.seed, "mia", c))
        per_client[c] = cast(  # two pools, two lists
            "tuple[list[float], list[float]]",
            tuple([-x for x in task.example_losses(model, pool)] for pool in (members, non_members)),
        )
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
        "server_time_s",
        "rounds",
        "privacy",
    )
    return {k: summary[k] for k in keys if k in summary}


def curve(metrics: Path) -> list[list[float]]:
    """[round, mean shared-test loss over the clients scored that round, cumulative bytes up + down of all clients]
    after every round of ``metrics.jsonl``."""
    if not metrics.exists():
        return []
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [r for r in records if "event" not in r and "round" in r]
    points, total = [], 0
    for rnd in sorted({int(r["round"]) for r in records}):
        these = [r for r in records if int(r["round"]) == rnd]
        total += sum(int(r.get("bytes_up", 0)) + int(r.get("bytes_down", 0)) for r in these)
        losses = [float(r["test_loss"]) for r in these if r.get("test_loss") is not None]
        if losses:
            points.append([rnd, sum(losses) / len(losses), total])
    return points


ATTACK_FIELDS = ("recovered_fraction_mean", "relative_error_mean", "initial_error_mean")


def _attack_fields(attack: dict[str, Any]) -> dict[str, Any]:
    return {k: attack[k] for k in ATTACK_FIELDS}


__all__ = ["ATTACK_FIELDS", "curve", "finished", "run_configs", "run_one"]
