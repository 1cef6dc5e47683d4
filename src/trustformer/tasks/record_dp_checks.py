"""The every-run checks of record-level DP-SGD (``privacy.checks``, ``core/dp_checks.py``): what one call is watched
for, and the client's run so far tested against what the accountant charged."""

from __future__ import annotations

import math
import time

import torch

from ..config import RunConfig
from ..core import dp_checks
from ..core.banded_noise import sqrt_coefficients
from ..core.dpsgd import RecordDP


def finetune_under_dp(cfg: RunConfig) -> bool:
    """``privacy.finetune = "dp"``: the owner's fine-tuning after the last exchange is DP-SGD, charged to ε. By
    default it is plain training that spends nothing: the fine-tuned model never leaves the owner's machine."""
    return cfg.privacy.finetune == "dp"


def watch(
    cfg: RunConfig, dp: RecordDP, *, shares: int = 1, first_step: int = 0, records: int = 0
) -> dp_checks.StepChecks | None:
    """The checks' watcher of one DP-SGD call (``privacy.checks``), expecting what the accountant charges for:
    clipping at C, noise σ·C (each of the ``shares`` owners σ·C/√shares; banded: the recurrence's std at each of
    the owner's steps from ``first_step``, and draws from at most ⌈n/b⌉ of the owner's n = ``records``) and draws
    at rate q."""
    if not cfg.privacy.checks:
        return None
    return dp_checks.StepChecks(
        dp_checks.Mechanism(
            clip_norm=dp.clip_norm,
            noise_std=dp.noise_multiplier * dp.clip_norm / math.sqrt(shares),
            sample_rate=dp.sample_rate,
            coefficients=sqrt_coefficients(dp.bands) if dp.bands > 1 else (1.0,),
            first_step=first_step,
            pool=-(-records // dp.bands) if dp.bands > 1 and records else 0,
        )
    )


def check_run(
    cfg: RunConfig,
    optimizer: torch.optim.Optimizer,
    watched: dp_checks.StepChecks | None,
    out: dict[str, float],
    dp: RecordDP,
    *,
    charged_before: int,
    client: int | None,
) -> None:
    """Add the call ``watched`` to the client's run record (its optimizer's first parameter group, saved with its
    state), test the run so far against what the accountant charged (``out``), put the results in ``out`` and
    raise :class:`~trustformer.core.dp_checks.DPCheckError` if a check fails (``core/dp_checks.py``)."""
    if watched is None:
        return
    started = time.perf_counter()
    group = optimizer.param_groups[0]
    record = dp_checks.merge(group.get(dp_checks.RECORD_KEY) or dp_checks.new_record(charged_before), watched)
    group[dp_checks.RECORD_KEY] = record
    reported = dp_checks.Reported(
        steps=int(out["dp_steps"]),
        epsilon=float(out["record_epsilon"]),
        noise_multiplier=dp.noise_multiplier,
        sample_rate=dp.sample_rate,
        delta=dp.delta,
        bands=dp.bands,
        column_norm=dp.column_norm,
    )
    looks = cfg.federation.rounds + (1 if finetune_under_dp(cfg) else 0)
    results = dp_checks.evaluate(record, reported, clients=cfg.federation.clients, looks=looks)
    out.update(dp_checks.metrics(results))
    out["dpcheck_s"] = watched.seconds + time.perf_counter() - started
    dp_checks.raise_failures(results, client=client, step=reported.steps)


__all__ = ["check_run", "finetune_under_dp", "watch"]
