"""`trustformer attack audit`: does a record-level DP run keep the ε it reports? An audit in one training run.

The run plants ``privacy.audit_canaries`` = m gradient canaries in client 0's DP-SGD (Nasr et al. 2023, "Tight
auditing of differentially private machine learning": canaries in gradient space, which show even when a model
learns too little for text canaries to show anything). Canary i is a record whose gradient is a spike on one
coordinate; it is in the data with probability ½ (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1)
training run"), Poisson-sampled, clipped and noised like every other record. The coordinates and the coin
flips derive from the run seed, so the auditor knows them (an audit run is not private for its canaries).

The auditor is the server, with what it holds: its estimate of client 0's trained model at every exchange
(``attack/reconstruct.py``, under the run's protocol and secure mode) minus the global model it had sent. A
canary's gradient pushes its coordinate down, so its score is the total descent of that coordinate over the
run. ``attack/audit.py:one_run_epsilon_lower_bound`` turns the scores and coin flips into ε_lb at 95%
confidence: a run whose DP holds has ε_lb ≤ ε, and a run whose noise is too small shows ε_lb > ε.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import RunConfig
from ..tasks.record_dp import AUDITED_CLIENT
from ..tasks.run import load_task
from .audit import one_run_epsilon_lower_bound
from .harness import observed_run
from .scoring import server_estimates


def canary_scores(cfg: RunConfig, initial: dict, exchanges, protocol) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """(score per canary, its coin flip, its groupings: parameter group and kind): how far each canary's
    coordinate moved the way the canary pushes it (descent for a canary gradient of + sign), in the server's view
    of the audited client's updates, summed over the exchanges."""
    canaries = load_task(cfg).audit_canaries()
    if canaries is None:
        raise ValueError("the audit needs privacy.audit_canaries > 0 (and privacy.unit = 'record')")
    scores = np.zeros(len(canaries.names))
    for _ex, estimates, before, _estimator in server_estimates(cfg, initial, exchanges, protocol):
        if AUDITED_CLIENT not in estimates:
            continue  # not sampled, or dropped, this round
        estimate = estimates[AUDITED_CLIENT]
        for i, (name, flat) in enumerate(zip(canaries.names, canaries.coordinates)):
            sign = canaries.signs[i] if canaries.signs else 1.0
            scores[i] += sign * float(before[name].flatten()[flat] - estimate[name].flatten()[flat])
    return scores, np.asarray(canaries.included, dtype=bool), [canaries.groups, canaries.kinds]


def audit(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` in this process and audit its record-level guarantee in that one run."""
    if cfg.privacy.unit != "record" or not cfg.privacy.audit_canaries:
        raise ValueError("the audit needs privacy.unit = 'record' and privacy.audit_canaries > 0")
    run = observed_run(cfg)
    scores, included, groupings = canary_scores(cfg, run.initial, run.exchanges, run.protocol)
    bound = one_run_epsilon_lower_bound(scores, included, cfg.privacy.delta, groupings=groupings)
    privacy = run.summary.get("privacy") or {}
    return {
        "epsilon": privacy.get("epsilon"),
        "target_epsilon": cfg.privacy.epsilon,
        "delta": cfg.privacy.delta,
        "epsilon_lb": bound["epsilon_lb"],
        "canaries": len(scores),
        "included": int(included.sum()),
        "guesses": bound.get("guesses"),
        "correct": bound.get("correct"),
        "k": bound.get("k"),
        "group": bound.get("group"),
        "groups": len(set(groupings[0])),
        "kinds": len(set(groupings[1])),
        "tried": bound.get("tried"),
        "strategy": cfg.federation.strategy,
        "secure": cfg.secure.mode,
        "test_loss": run.summary.get("test_loss"),
        "wall_s": run.wall_s,
    }


__all__ = ["audit", "canary_scores"]
