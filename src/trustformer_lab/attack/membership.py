"""`trustformer attack membership`: what an honest-but-curious server learns about the clients' **data**.

The command runs a federation in this process (the real round loop, as ``attack reconstruct`` does) and, for
every client k, decides for candidate examples whether they were in k's training data, from exactly what the
server holds under the protocol and ``secure.mode``: its estimate of k's model after local training at the
last exchange (``attack/reconstruct.py``: the model itself for FedAvg, the global model plus the update for the
update-sending protocols, the reference shifted by the centroids for Trustformer, the aggregate alone under
secure aggregation, the public initial model when nothing is exchanged).

Candidates (``--candidates`` per side, default 300): **members**, a seeded sample of k's training examples;
**non-members**, as many examples of the same distribution that no client trained on — translation: pairs of
k's own domains held out of its data (``data.own_test_size``), so the attack cannot win by recognising a
domain; image tasks: test images with the members' class counts. The count is capped by k's shard and its
held-out pairs: TPR at a low FPR needs many non-members (1/n is the lowest FPR resolved), so where the data
allow, set ``data.own_test_size`` ≥ 1000 and ``candidates`` ≥ 1000.

Scores (higher = more likely a member), each a per-example loss L of a model:

- ``loss``: −L_estimate(x) (Yeom et al. 2018);
- ``calibrated-initial``: L_initial(x) − L_estimate(x), the public initial model as the reference (Carlini et
  al. 2022's difficulty calibration, Watson et al. 2022);
- ``calibrated-global``: L_global(x) − L_estimate(x), the global model the server sent before the last exchange
  as the reference (what the example did to *this* client's model beyond the consensus);
- ``lira`` (``server`` and ``true-local`` models only): offline LiRA (Carlini et al. 2022, ``attack/lira.py``),
  x's statistic under the model against a Gaussian fitted to it under ``reference_models`` (default 8; 0: none)
  models the server trains itself on halves of a population pool no candidate is in, the way the target was
  trained: one round of local training from the global model it sent before the last exchange, or, when
  nothing is exchanged, every round from the initial model. Translation only (the image tasks hold no
  population apart from the candidates); cached in ``lira-cache/`` beside the run's output folder.

Reported per client and as the mean over clients: **AUC** (Mann-Whitney), **TPR at 1% and 0.1% FPR** (the ROC's
best TPR at an FPR at most that; with n non-members the lowest FPR resolved is 1/n), the number of candidates,
and a 95% bootstrap interval of the mean AUC (candidates resampled within each client). Reference rows: the
same scores on the client's **true** locally trained model (what anyone holding it could do) and on the model the
client **ends with** (what every client receives at the end). The server's advantage is its best score's mean
AUC − 0.5 and TPR at 1% FPR.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from trustformer.config import RunConfig
from trustformer.core.shared import Tensors, assign_tensors, derive_seed
from trustformer.tasks.run import load_task

from .audit import epsilon_lower_bound
from .harness import ObservedRun, observed_run
from .lira import REFERENCE_MODELS, offline_scores, reference_models, statistic
from .scoring import server_estimates

CANDIDATES = 300  # members (and as many non-members) per client
FPRS = (0.01, 0.001)
BOOTSTRAP = 200
SCORES = ("loss", "calibrated-initial", "calibrated-global", "lira")
LIRA_VIEWS = ("server", "true-local")  # the final model was not trained the way the reference models are


# ------------------------------------------------------------------------------ statistics


def auc(members: Sequence[float] | np.ndarray, non_members: Sequence[float] | np.ndarray) -> float:
    """P(score of a member > score of a non-member) + ½ P(tie): the ROC's area (Mann-Whitney U)."""
    a, b = np.asarray(members, dtype=np.float64), np.asarray(non_members, dtype=np.float64)
    if not len(a) or not len(b):
        return math.nan
    ranks = _ranks(np.concatenate([a, b]))
    return float((ranks[: len(a)].sum() - len(a) * (len(a) + 1) / 2) / (len(a) * len(b)))


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def tpr_at_fpr(members: Sequence[float], non_members: Sequence[float], fpr: float) -> float:
    """The highest true-positive rate of a threshold whose false-positive rate is at most ``fpr``."""
    a, b = np.sort(np.asarray(members, dtype=np.float64)), np.asarray(non_members, dtype=np.float64)
    if not len(a) or not len(b):
        return math.nan
    allowed = int(math.floor(fpr * len(b) + 1e-9))  # non-members that may score above the threshold
    above = np.sort(b)[::-1]
    threshold = above[allowed] if allowed < len(above) else -np.inf  # members must score strictly above it
    return float((a > threshold).mean())


def summarize(per_client: dict[int, tuple[list[float], list[float]]], seed: int) -> dict[str, Any]:
    """AUC and TPRs per client and their means, with a bootstrap interval of the mean AUC."""
    clients = sorted(per_client)
    out: dict[str, Any] = {
        "clients": clients,
        "candidates": [len(per_client[c][0]) for c in clients],
        "auc": [auc(*per_client[c]) for c in clients],
    }
    for fpr in FPRS:
        out[f"tpr_at_{fpr:g}_fpr"] = [tpr_at_fpr(*per_client[c], fpr) for c in clients]
    for key in [k for k in out if k not in ("clients", "candidates")]:
        out[f"{key}_mean"] = float(np.mean(out[key])) if out[key] else math.nan
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(BOOTSTRAP):
        values = []
        for c in clients:
            m, n = np.asarray(per_client[c][0]), np.asarray(per_client[c][1])
            values.append(auc(m[rng.integers(0, len(m), len(m))], n[rng.integers(0, len(n), len(n))]))
        draws.append(float(np.mean(values)))
    out["auc_mean_ci95"] = [float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))] if draws else None
    return out


# ------------------------------------------------------------------------------ models


def _module(task, tensors: Tensors) -> torch.nn.Module:
    model = task.initial_model()
    if not set(tensors) <= {n for n, p in model.named_parameters() if p.requires_grad}:
        from trustformer.models.adapters import has_adapters, merged

        if has_adapters(model):  # a saved model of a LoRA run: its adapters merged into plain weights
            model = merged(model)
    assign_tensors(model, {n: t.to(next(model.parameters()).device) for n, t in tensors.items()})
    return model.eval()


def _final_models(run: ObservedRun) -> dict[int, Tensors]:
    """The model each client ends with, from the folders the run saved its distinct final models in."""
    from trustformer.export import load_image_model, load_translation_model

    out = {}
    for client, folder in (run.summary.get("models") or {}).items():
        path = Path(run.cfg.out) / folder
        model = load_translation_model(path)[0] if run.cfg.task == "translation" else load_image_model(path)[0]
        out[int(client)] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return out


class _Lira:
    """Offline LiRA's reference statistics for the candidates of each client (``attack/lira.py``): reference
    models trained from ``start`` for ``rounds`` rounds on halves of a pool twice a client's shard."""

    def __init__(self, run: ObservedRun, task, before: Tensors, n_models: int, last_round: int) -> None:
        cfg = run.cfg
        self.task, self.cfg, self.n_models = task, cfg, n_models
        exchanged = bool(run.protocol.spec.exchanges)
        self.start, self.rounds = (before, 1) if exchanged else (run.initial, cfg.federation.rounds)
        self.rounds_before = last_round - 1 if exchanged else 0  # the target's rounds before its last one
        self.models: dict[int, list[Tensors]] = {}  # by pool size
        self.info: dict[str, Any] = {
            "reference_models": n_models,
            "rounds": self.rounds,
            "start": "global model before the last exchange" if exchanged else "initial",
            "pool": {},
        }

    def reference(self, client: int, members, non_members) -> np.ndarray:
        """(reference models × candidates) statistics, members first."""
        cfg, task = self.cfg, self.task
        pool = task.population_pool(2 * len(task.shard(client)), derive_seed(cfg.seed, "lira-pool"))
        if len(pool) not in self.models:
            self.models[len(pool)] = reference_models(
                task,
                cfg,
                self.start,
                pool,
                n_models=self.n_models,
                rounds=self.rounds,
                seed=derive_seed(cfg.seed, "lira"),
                cache_dir=Path(cfg.out).resolve().parent / "lira-cache",
                rounds_before=self.rounds_before,
            )
        self.info["pool"][str(client)] = len(pool)
        rows = []
        for tensors in self.models[len(pool)]:
            model = _module(task, tensors)
            rows.append(
                statistic(task.name, task.example_losses(model, members) + task.example_losses(model, non_members))
            )
        return np.stack(rows)


def _lira(
    run: ObservedRun, task, before: Tensors, n_models: int, last_round: int
) -> tuple[_Lira | None, dict[str, Any]]:
    if n_models < 1:
        return None, {"skipped": "reference_models = 0"}
    try:
        task.population_pool(1, 0)
    except NotImplementedError as exc:
        return None, {"skipped": str(exc)}
    lira = _Lira(run, task, before, n_models, last_round)
    return lira, lira.info


def membership(
    run: ObservedRun, *, candidates: int = CANDIDATES, reference_models: int = REFERENCE_MODELS
) -> dict[str, Any]:
    """The membership attack on an observed run (see the module docstring); ``reference_models``: LiRA's
    (0: no ``lira`` score)."""
    cfg = run.cfg
    task = load_task(cfg)
    *_, last = server_estimates(cfg, run.initial, run.exchanges, run.protocol)
    ex, estimates, before, _estimator = last
    lira, lira_info = _lira(run, task, before, reference_models, ex.round)
    final = _final_models(run)
    views = {"server": estimates, "true-local": ex.trained, "final": final}
    initial_model, global_model = _module(task, run.initial), _module(task, before)
    per_view: dict[str, dict[str, dict[int, tuple[list[float], list[float]]]]] = {
        v: {s: {} for s in SCORES} for v in views
    }
    for client in sorted(ex.trained):
        members, non_members = task.membership_candidates(client, candidates, derive_seed(cfg.seed, "mia", client))
        pools = (members, non_members)
        reference = {
            "calibrated-initial": [task.example_losses(initial_model, p) for p in pools],
            "calibrated-global": [task.example_losses(global_model, p) for p in pools],
        }
        lira_reference = lira.reference(client, members, non_members) if lira is not None else None
        for view, models in views.items():
            if client not in models:
                continue
            model = _module(task, models[client])
            losses = [task.example_losses(model, p) for p in pools]
            per_view[view]["loss"][client] = ([-x for x in losses[0]], [-x for x in losses[1]])
            for score, (ref_m, ref_n) in reference.items():
                per_view[view][score][client] = (
                    [r - x for r, x in zip(ref_m, losses[0], strict=True)],
                    [r - x for r, x in zip(ref_n, losses[1], strict=True)],
                )
            if lira_reference is not None and view in LIRA_VIEWS:
                # a 1-D array of statistics, which offline_scores reads with np.asarray like a sequence
                observed = cast("Sequence[float]", statistic(task.name, losses[0] + losses[1]))
                z = offline_scores(observed, lira_reference).tolist()
                per_view[view]["lira"][client] = (z[: len(losses[0])], z[len(losses[0]) :])
    seed = derive_seed(cfg.seed, "mia-bootstrap")
    result: dict[str, Any] = {
        view: {score: summarize(per_client, seed) for score, per_client in scores.items() if per_client}
        for view, scores in per_view.items()
    }
    server = result.get("server", {})
    best = max(server, key=lambda s: server[s]["auc_mean"]) if server else None
    result["advantage"] = (
        {
            "score": best,
            "auc_minus_half": server[best]["auc_mean"] - 0.5,
            "tpr_at_1pct_fpr": server[best]["tpr_at_0.01_fpr_mean"],
            "auc_ci95": server[best]["auc_mean_ci95"],
        }
        if best
        else None
    )
    result["round"] = ex.round
    result["lira"] = lira_info
    if is_private(cfg):  # the audit of the guarantee by this attack (attack/audit.py)
        result["audit"] = audit_from_scores(per_view["server"], cfg.privacy.delta)
        result["audit"]["epsilon"] = (run.summary.get("privacy") or {}).get("epsilon")
    result["server_sees"] = (
        "nothing"
        if not run.protocol.spec.exchanges
        else "aggregate only"
        if cfg.secure.mode in ("secagg", "tee+secagg")
        else "every payload"
    )
    return result


def is_private(cfg: RunConfig) -> bool:
    """A run with a DP guarantee: record-level DP-SGD, or a client-level DP baseline."""
    return cfg.privacy.unit == "record" or cfg.federation.strategy.startswith("dp-")


def audit_from_scores(scores: dict[str, dict[int, tuple[list[float], list[float]]]], delta: float) -> dict[str, Any]:
    """ε_lb from the attack's ROC (Jagielski et al. 2020; Nasr et al. 2021): per score, members and non-members of
    every client pooled (each is one record), the best threshold's Clopper-Pearson bound; the best score's."""
    best: dict[str, Any] = {"epsilon_lb": 0.0, "score": None}
    for score, per_client in scores.items():
        members = [x for c in per_client for x in per_client[c][0]]
        non_members = [x for c in per_client for x in per_client[c][1]]
        if not members or not non_members:
            continue
        bound = epsilon_lower_bound(members, non_members, delta)
        if best["score"] is None or bound["epsilon_lb"] > best["epsilon_lb"]:
            best = {**bound, "score": score}
    return best


def run_membership(
    cfg: RunConfig, *, candidates: int = CANDIDATES, reference_models: int = REFERENCE_MODELS
) -> dict[str, Any]:
    """Run ``cfg`` in this process and attack the membership of every client's data."""
    run = observed_run(cfg)
    result = membership(run, candidates=candidates, reference_models=reference_models)
    result.update(
        strategy=cfg.federation.strategy,
        secure=cfg.secure.mode,
        wall_s=run.wall_s,
        test_loss=run.summary.get("test_loss"),
    )
    return result


# ------------------------------------------------------------------------------ the command's table


TABLE_NOTE = (
    "mean over clients at the last exchange; model: server = its estimate from what it holds, true-local = "
    "the client's trained model, final = the model it ends with"
)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    head = f"{'run':<40} {'model':<11} {'score':<19} {'AUC':>6} {'95% CI':>13} {'TPR@1%':>7} {'TPR@0.1%':>8} {'n':>5}"
    lines = [head, "-" * len(head)]
    for r in results:
        for view in ("server", "true-local", "final"):
            for score, s in r.get(view, {}).items():
                ci = s.get("auc_mean_ci95") or [math.nan, math.nan]
                lines.append(
                    f"{r['run']:<40} {view:<11} {score:<19} {s['auc_mean']:>6.3f} "
                    f"{ci[0]:>6.3f}–{ci[1]:<6.3f} {s['tpr_at_0.01_fpr_mean']:>7.3f} "
                    f"{s['tpr_at_0.001_fpr_mean']:>8.3f} {min(s['candidates']):>5}"
                )
    return "\n".join(lines)


def sweep(
    cfg: RunConfig,
    runs,
    *,
    candidates: int = CANDIDATES,
    reference_models: int = REFERENCE_MODELS,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Every planned run (``attack reconstruct``'s plan), attacked, one after the other."""
    import time

    from trustformer.config import load_config

    from .reconstruct import run_folder

    results, started = [], time.perf_counter()
    for i, planned in enumerate(runs, start=1):
        run_cfg = load_config(
            cfg.preset, None, {**cfg.flat(), **planned.overrides, "out": str(Path(cfg.out) / run_folder(planned.label))}
        )
        result = run_membership(run_cfg, candidates=candidates, reference_models=reference_models)
        result.update(run=planned.label, overrides=planned.overrides)
        results.append(result)
        if progress:
            elapsed = time.perf_counter() - started
            adv = result["advantage"] or {}
            print(
                f"[{i}/{len(runs)}] {planned.label}: server AUC {0.5 + adv.get('auc_minus_half', math.nan):.3f} "
                f"· {result['wall_s']:.0f} s · ETA {elapsed / i * (len(runs) - i) / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
    return results


def write_json(path: str | Path, cfg: RunConfig, results: Sequence[dict[str, Any]], command: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"command": command, "setting": cfg.to_dict(), "runs": list(results)}
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False, allow_nan=True) + "\n", encoding="utf-8")


__all__ = ["auc", "format_table", "membership", "run_membership", "summarize", "sweep", "tpr_at_fpr", "write_json"]
