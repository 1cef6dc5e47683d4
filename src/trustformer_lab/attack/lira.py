"""Offline LiRA: the likelihood-ratio membership attack with reference models trained on no candidate (Carlini,
Chien, Nasr, Song, Terzis & Tramèr 2022, "Membership inference attacks from first principles", IEEE S&P, §IV and
Algorithm 1, offline variant).

The server trains N reference models itself, each on a seeded random half of a **population pool**: data no client
trained on and no membership candidate is (translation: the corpus's public split, ``TranslationTask.
population_pool``; the pool is twice a client's shard, so a half is as large as the data the target trained on).
Every reference model is trained the way the attacked model was, from what the server knows
(``membership.membership`` picks it): from the global model it sent before the last exchange, one round of local
training (the round the target client did), or, when nothing is exchanged (``local``), from the initial model
for every round of the run. Each candidate x then has N OUT statistics φ_j(x), fitted by a Gaussian N(μ_x, σ²);
the attacked model's statistic φ(x) scores

    z(x) = (φ(x) − μ_x) / σ            (higher = member; the offline one-sided test Λ = Φ(z) is monotone in z)

with σ one value pooled over every candidate when N < 64 ("global variance", which the paper recommends for few
reference models), else each candidate's own.

The statistic (Carlini et al. §IV-C, "logit scaling"): image classification, the logit of the true class's
probability p = e^{−L}, φ = log p − log(1 − p); translation, a pair's mean token log-likelihood −L (already
roughly Gaussian); other tasks −L.

Reference models are cached by :func:`reference_models` in ``<cache_dir>/<key>.pt`` (``membership`` passes
``lira-cache/`` beside the run's output folder), the key a hash of the configuration (without its output and
runtime options), the start model, the pool, N and the rounds, so the rows of a sweep that share a setting train
them once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trustformer.config import RunConfig
from trustformer.core.shared import Tensors, assign_tensors, derive_seed, trainable_tensors

REFERENCE_MODELS = 8
GLOBAL_SIGMA_BELOW = 64  # fewer reference models than this: one σ pooled over the candidates (Carlini et al. §VI-A)
CACHE_VERSION = 1


# ------------------------------------------------------------------------------ statistics and score


def statistic(task_name: str, losses: Sequence[float]) -> np.ndarray:
    """Carlini et al.'s per-example statistic from its loss L: the logit-scaled confidence
    log p − log(1 − p), p = e^{−L}, for image classification (cross-entropy); −L otherwise (translation: the
    pair's mean token log-likelihood)."""
    loss = np.asarray(losses, dtype=np.float64)
    if task_name != "image-classification":
        return -loss
    loss = np.maximum(loss, 1e-12)  # p = 1 exactly would be an infinite logit
    return -loss - np.log(-np.expm1(-loss))


def offline_scores(observed: Sequence[float], reference: np.ndarray, *, sigma: str = "auto") -> np.ndarray:
    """Offline LiRA's z = (φ_obs − μ_x) / σ per candidate x (Carlini et al. Algorithm 1, offline): ``reference``
    is (N models × candidates) of OUT statistics, μ_x their mean per candidate; ``sigma``: "global" (one σ, the
    pooled within-candidate standard deviation), "per-example" (each candidate's own), or "auto" (global when
    N < 64)."""
    obs = np.asarray(observed, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[1] != len(obs) or ref.shape[0] < 1:
        raise ValueError(f"reference must be (models, {len(obs)}); got {ref.shape}")
    n_models = ref.shape[0]
    mode = ("global" if n_models < GLOBAL_SIGMA_BELOW else "per-example") if sigma == "auto" else sigma
    mu = ref.mean(axis=0)
    if n_models == 1:
        scale = np.ones_like(mu)  # no spread to estimate: the calibrated difference itself
    elif mode == "global":
        scale = np.full_like(mu, np.sqrt(((ref - mu) ** 2).sum() / (ref.shape[1] * (n_models - 1))))
    elif mode == "per-example":
        scale = ref.std(axis=0, ddof=1)
    else:
        raise ValueError(f"sigma must be 'auto', 'global' or 'per-example'; got {sigma!r}")
    return (obs - mu) / np.maximum(scale, 1e-12)


# ------------------------------------------------------------------------------ reference models


def _half(pool: Any, indices: np.ndarray) -> Any:
    return pool.subset(indices) if hasattr(pool, "subset") else [pool[int(i)] for i in indices]


def _steps_per_round(task: Any, start_tensors: Tensors, half: Any, seed: int) -> int:
    """The optimizer steps one round of local training takes on ``half`` (one throwaway round)."""
    model = task.initial_model()
    assign_tensors(model, {n: t.to(next(model.parameters()).device) for n, t in start_tensors.items()})
    return int(task.train_local(model, task.new_optimizer(model), half, seed=seed)["steps"])


def train_reference_models(
    task: Any, start_tensors: Tensors, pool: Any, *, n_models: int, rounds: int, seed: int, rounds_before: int = 0
) -> list[Tensors]:
    """``n_models`` reference models, model j trained from ``start_tensors`` on a seeded random half of ``pool``:
    ``rounds`` calls of ``task.train_local`` with one optimizer (its schedule and moments carry over between
    rounds, as a client's do). ``rounds_before``: the attacked model's rounds before these, so the learning-rate
    schedule starts where the target's did (measured by one throwaway round). Returns each model's trainable
    tensors (on the CPU)."""
    out, offset = [], 0
    for j in range(n_models):
        rng = np.random.default_rng(derive_seed(seed, "lira-half", j))
        half = _half(pool, np.sort(rng.permutation(len(pool))[: len(pool) // 2]))
        if rounds_before and j == 0:
            offset = rounds_before * _steps_per_round(task, start_tensors, half, derive_seed(seed, "lira-probe"))
        model = task.initial_model()
        assign_tensors(model, {n: t.to(next(model.parameters()).device) for n, t in start_tensors.items()})
        optimizer = task.new_optimizer(model)
        optimizer.param_groups[0]["steps_before"] = offset
        for r in range(rounds):
            task.train_local(model, optimizer, half, seed=derive_seed(seed, "lira-train", j, r))
        out.append({n: t.cpu() for n, t in trainable_tensors(model).items()})
    return out


def _digest_tensors(tensors: Tensors) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cache_key(
    cfg: RunConfig, start_tensors: Tensors, pool: Any, *, n_models: int, rounds: int, seed: int, rounds_before: int = 0
) -> str:
    """What the reference models depend on: the configuration without ``out`` and ``runtime.*`` (but its device),
    the start model's bytes, the pool (its size and, for a list, its content), N, the rounds and the seed."""
    settings = {
        k: v for k, v in cfg.flat().items() if k != "out" and (k == "runtime.device" or not k.startswith("runtime."))
    }
    pool_id = hashlib.sha256(repr(pool).encode()).hexdigest() if isinstance(pool, list) else ""
    body = json.dumps(
        {
            "v": CACHE_VERSION,
            "config": settings,
            "start": _digest_tensors(start_tensors),
            "pool": [len(pool), pool_id],
            "n": n_models,
            "rounds": rounds,
            "seed": seed,
            "rounds_before": rounds_before,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()[:24]


def reference_models(
    task: Any,
    cfg: RunConfig,
    start_tensors: Tensors,
    pool: Any,
    *,
    n_models: int,
    rounds: int,
    seed: int,
    cache_dir: str | Path | None = None,
    rounds_before: int = 0,
) -> list[Tensors]:
    """:func:`train_reference_models`, read from or written to ``<cache_dir>/<cache_key>.pt`` when given."""
    path = None
    if cache_dir is not None:
        key = cache_key(
            cfg, start_tensors, pool, n_models=n_models, rounds=rounds, seed=seed, rounds_before=rounds_before
        )
        path = Path(cache_dir) / f"{key}.pt"
        if path.exists():
            return torch.load(path, map_location="cpu", weights_only=True)
    models = train_reference_models(
        task, start_tensors, pool, n_models=n_models, rounds=rounds, seed=seed, rounds_before=rounds_before
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".pt.tmp")
        torch.save(models, tmp)
        tmp.replace(path)
    return models


__all__ = ["REFERENCE_MODELS", "cache_key", "offline_scores", "reference_models", "statistic", "train_reference_models"]
