"""What ``summary.json`` says of a record-level DP run (``privacy``): each client's mechanism and ε, the checks in
every run (``core/dp_checks.py``) and what they cannot see, and under distributed noise what colluders learn."""

from __future__ import annotations

import math
from typing import Any

from ..config import RunConfig
from ..core import dp_checks
from ..core.dpsgd import RecordDP
from .record_dp import bands, distributed, share_count
from .record_dp_checks import finetune_under_dp


def _mechanism(reported: dict[str, Any], delta: float) -> RecordDP:
    """The mechanism a client's summary entry describes (for its ε under other threats)."""
    return RecordDP(
        noise_multiplier=reported["noise_multiplier"],
        clip_norm=1.0,
        expected_batch=1,
        sample_rate=reported["sample_rate"],
        delta=delta,
        bands=reported.get("bands", 1),
        column_norm=reported.get("column_norm", 1.0),
    )


def distributed_summary(cfg: RunConfig, per: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """What distributed noise guarantees, per threat (docs/privacy.md "Distributed noise"): against the server (and
    any owner, who sees only the released models) each owner's ε; against the server colluding with one owner,
    who removes its own share, the ε of the noise left, σ·√((k − 1)/k) for the k shares the clients insist on."""
    k, p = share_count(cfg), cfg.privacy
    colluding = {  # None: with one share, the owner who added it removes all the noise
        str(c): _mechanism(v, p.delta).epsilon(v["steps"], noise_scale=math.sqrt((k - 1) / k)) if k > 1 else None
        for c, v in sorted(per.items())
    }
    worst = [e for e in colluding.values() if e is not None]
    return {
        "shares": k,
        "dropout_tolerance": cfg.privacy.dropout_tolerance,
        "steps_per_round": 1,
        "noise_bands": p.noise_bands,
        **(
            {
                "banded_accounting": "b-min-sep sampling: DP-SGD at sigma / column_norm for ceil(steps / noise_bands) "
                "steps (Choquette-Choo et al. 2023, Thm. 4); the banded square root of the prefix sum (Kalinin & "
                "Lampert 2024)"
            }
            if p.noise_bands > 1
            else {}
        ),
        "epsilon_server_and_one_owner": max(worst) if worst else None,
        "epsilon_server_and_one_owner_by_client": colluding,
        "encoding": "continuous Gaussian shares, then secure aggregation's fixed point (secure.secagg_scale_bits)",
    }


def summary(cfg: RunConfig, records: list[dict[str, Any]], final: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``summary.json["privacy"]`` of a record-level run: per client the ε its DP-SGD steps spent (fine-tuning
    included under ``privacy.finetune = "dp"``), σ, q and steps, from what each client reported; ``epsilon`` is the
    largest. ``finetune`` says what the guarantee covers of the owners' fine-tuning. ``checks``: each client's
    ``privacy.checks`` after its last round (``core/dp_checks.py``)."""
    per: dict[int, dict[str, Any]] = {}
    for r in records:
        if "record_epsilon" in r and "client" in r:
            per[int(r["client"])] = {
                "epsilon": r["record_epsilon"],
                "noise_multiplier": r["dp_sigma"],
                "sample_rate": r["dp_sample_rate"],
                "steps": r["dp_steps"],
                "bands": r.get("dp_bands", 1),
                "column_norm": r.get("dp_column_norm", 1.0),
                **({"checks": dp_checks.from_metrics(r)} if "dpcheck_failed" in r else {}),
            }
    for client, metrics in final.items():
        tuned = metrics.get("finetune_record_epsilon")
        if tuned is not None and client in per:
            per[client]["epsilon"] = max(per[client]["epsilon"], tuned)
    p = cfg.privacy
    return {
        "unit": "record",
        "noise": p.noise,
        **(distributed_summary(cfg, per) if distributed(cfg) else {}),
        "epsilon": max((v["epsilon"] for v in per.values()), default=None),
        "target_epsilon": p.epsilon,
        "delta": p.delta,
        "clip_norm": p.clip_norm,
        "expected_batch": cfg.privacy.batch_size or cfg.train.batch_size,  # configured; each client at most its records
        "accountant": "opacus RDP (Mironov et al. 2019)",
        "clients": {str(c): per[c] for c in sorted(per)},
        "noise_source": p.noise_source,
        "private": p.noise_source == "os" and not p.audit_canaries,
        "audit_canaries": p.audit_canaries,
        "finetune": _finetune_statement(cfg),
        "checks": _checks_statement(cfg, per),
    }


def _checks_statement(cfg: RunConfig, per: dict[int, dict[str, Any]]) -> dict[str, Any] | str:
    """What ``privacy.checks`` checked, at what false-alarm rate, and whether every client passed."""
    if not cfg.privacy.checks:
        return "off (privacy.checks = false)"
    verdicts = [c["verdict"] for v in per.values() for c in v.get("checks", [])]
    return {
        "passed": bool(verdicts) and "fail" not in verdicts,
        "false_alarm_rate": dp_checks.RUN_ALPHA,
        "statistics": dict(dp_checks.WHAT),
        "alpha": "the statistical checks (sampling_rate, sampling_dispersion, noise) share the run's false-alarm "
        "rate, Bonferroni over clients x 3 checks x rounds (each round tests the run so far) x tensors (noise); "
        "steps, clipping, noise_fresh and accountant are exact up to rounding three orders below their thresholds",
        "not_seen": dp_checks.NOT_SEEN,
        "skipped_under_this_config": _skipped(cfg),
    }


def _skipped(cfg: RunConfig) -> list[str]:
    out = []
    if finetune_under_dp(cfg):
        out.append("DP fine-tuning is checked by the owner (a failure stops it) but not reported here")
    if bands(cfg) > 1:
        out.append(
            "noise_bands: the noise check tests each release's marginal std (the banded recurrence's); the "
            "correlation across rounds and the b-min-sep grouping are taken as built, and the accountant check "
            "recomputes the amplified mechanism (sigma / column norm, ceil(T / b) steps) as the RDP side does"
        )
    if distributed(cfg):
        out.append(
            "distributed noise: each owner checks its own share (std sigma C / sqrt(shares)); that the shares of "
            "the round add up to sigma C in the unmasked sum is secure aggregation's, not checked here"
        )
    return out


def _finetune_statement(cfg: RunConfig) -> str:
    if not cfg.federation.finetune_epochs:
        return "none"
    if finetune_under_dp(cfg):
        return "DP-SGD, charged to epsilon (privacy.finetune = 'dp'): the fine-tuned model may be published"
    return (
        "free (privacy.finetune = 'free'): plain training after the last exchange, charged nothing; epsilon covers "
        "everything that left each owner's machine, and the fine-tuned model must not leave it (its ft_* scores "
        "here are measured for the report)"
    )


__all__ = ["distributed_summary", "summary"]
