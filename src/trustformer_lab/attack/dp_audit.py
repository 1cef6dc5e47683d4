"""`trustformer attack audit`: does a record-level DP run keep the ε it reports? An audit in one training run.

The run plants ``privacy.audit_canaries`` = m gradient canaries in client 0's DP-SGD (Nasr et al. 2023, "Tight
auditing of differentially private machine learning": canaries in gradient space, which show even when a model
learns too little for text canaries to show anything). Canary i is a record whose gradient is a spike on one
coordinate; it is in the data with probability ½ (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1)
training run"). An included canary takes every step a record takes (``core/dpsgd.py``): the records' own Poisson
draw at their rate, Opacus' per-record clipping of its gradient row, the noise and the division by B. A bug in any
of those steps (a sampler that draws more often than the accountant assumes, a clip above C, noise below σ·C on
some tensors, an accountant fed the wrong rate or steps) then reaches the canaries. The coordinates and the coin
flips derive from the run seed, so the auditor knows them (an audit run is not private for its canaries).

The auditor is the server, with what it holds: its estimate of client 0's trained model at every exchange
(``attack/reconstruct.py``, under the run's protocol and secure mode) minus the global model it had sent. A
canary's gradient pushes its coordinate down, so its score is the total descent of that coordinate over the
run. ``attack/audit.py:one_run_epsilon_lower_bound`` turns the scores and coin flips into ε_lb at 95%
confidence: a run whose DP holds has ε_lb ≤ ε (a false alarm in at most 5% of honest runs), and a run whose true ε
is well above the reported one shows ε_lb > ε. :func:`honest_benchmark` measures both sides of that on honest runs:
how often an audit fails one, and how close ε_lb comes to ε.

What one run can resolve is limited (docs/privacy.md "Auditing the guarantee"): m canaries at δ bound ε_lb below
what the mechanism spends, the client's Adam normalises each coordinate's steps (two steps of Adam keep little more
than the first step's sign), and the server sees a round's local steps only as their sum, so the audit of
subsampled steps (q < 1) is looser than that of full batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trustformer.config import RunConfig, load_config
from trustformer.tasks.dp_canaries import AUDITED_CLIENT
from trustformer.tasks.run import load_task

from .audit import clopper_pearson, one_run_epsilon_lower_bound
from .harness import observed_run
from .scoring import server_estimates


def canary_scores(cfg: RunConfig, initial: dict, exchanges, protocol) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """(score per canary, its coin flip, its groupings: parameter group and kind): how far each canary's
    coordinate moved the way the canary pushes it (descent for a canary gradient of + sign), in the server's view
    of the audited client's updates, summed over the exchanges."""
    task: Any = load_task(cfg)  # the translation task: it plants the canaries
    canaries = task.audit_canaries()
    if canaries is None:
        raise ValueError("the audit needs privacy.audit_canaries > 0 (and privacy.unit = 'record')")
    scores = np.zeros(len(canaries.names))
    for _ex, estimates, before, _estimator in server_estimates(cfg, initial, exchanges, protocol):
        if AUDITED_CLIENT not in estimates:
            continue  # not sampled, or dropped, this round
        estimate = estimates[AUDITED_CLIENT]
        for i, (name, flat) in enumerate(zip(canaries.names, canaries.coordinates, strict=True)):
            sign = canaries.signs[i] if canaries.signs else 1.0
            scores[i] += sign * float(before[name].flatten()[flat] - estimate[name].flatten()[flat])
    return scores, np.asarray(canaries.included, dtype=bool), [canaries.groups, canaries.kinds]


def audit(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` in this process and audit its record-level guarantee in that one run."""
    if cfg.privacy.unit != "record" or not cfg.privacy.audit_canaries:
        raise ValueError("the audit needs privacy.unit = 'record' and privacy.audit_canaries > 0")
    run = observed_run(cfg)
    scores, included, groupings = canary_scores(cfg, run.initial, run.exchanges, run.protocol)
    privacy = run.summary.get("privacy") or {}
    reported = privacy.get("epsilon")  # the group guess sets that cannot exceed it are not tried (attack/audit.py)
    target = float(reported) if reported is not None else cfg.privacy.epsilon
    bound = one_run_epsilon_lower_bound(scores, included, cfg.privacy.delta, groupings=groupings, target=target)
    return {
        "epsilon": privacy.get("epsilon"),
        "mechanism": (privacy.get("clients") or {}).get(str(AUDITED_CLIENT)),  # σ, q, steps and ε of client 0
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
        "delta_slack": 2 * len(scores) * cfg.privacy.delta,  # Theorem 5.2's 2mδ: near 1, no ε_lb can show
    }


def _with(cfg: RunConfig, values: dict[str, Any]) -> RunConfig:
    return load_config(cfg.preset, None, {**cfg.flat(), **values})


def honest_benchmark(
    cfg: RunConfig,
    seeds: int,
    epsilons: Sequence[float] = (),
    *,
    plain: bool = True,
    progress: Callable[[str], None] | None = None,
    auditor: Callable[[RunConfig], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The audit on honest runs: for each ε (``epsilons``, default the configured one) ``seeds`` audits of ``cfg``
    at that ε, seeds ``cfg.seed``, ``cfg.seed`` + 1, … (each its own data order, canary coins and, unless the
    configuration says otherwise, noise from the operating system). Per ε: how many fail (ε_lb > ε; at 95%
    confidence at most 5% of honest runs may, and ``failure_rate_upper95`` is the Clopper-Pearson bound on the rate),
    ε_lb / ε (its tightness; Steinke et al. 2023 report ε_lb ≈ 1.8 at ε = 4 in their white-box CIFAR-10 audit), and
    the wall time of an audit against that of the same run without canaries (``plain``: one run, seed ``cfg.seed``,
    the federation alone). ``auditor``: the audit of one run (default :func:`audit`, record level; the client-level
    one is ``attack/client_dp_audit.py:audit``)."""
    from trustformer.engine.inprocess import run_in_process

    run_audit = auditor or audit
    rows, canaries = [], cfg.privacy.audit_canaries
    for eps in epsilons or (cfg.privacy.epsilon,):
        results, audit_s = [], []
        for i in range(seeds):
            folder = Path(cfg.out) / f"eps-{eps:g}" / f"seed-{cfg.seed + i}"
            started = time.perf_counter()
            result = run_audit(_with(cfg, {"privacy.epsilon": eps, "seed": cfg.seed + i, "out": str(folder)}))
            canaries = result["canaries"]
            audit_s.append(time.perf_counter() - started)
            results.append(result)
            if progress is not None:
                progress(f"ε = {eps:g} seed {cfg.seed + i}: ε {result['epsilon']:.3f}, ε_lb {result['epsilon_lb']:.3f}")
        plain_s = None
        if plain:
            folder = Path(cfg.out) / f"eps-{eps:g}" / "plain"
            started = time.perf_counter()
            run_in_process(_with(cfg, {"privacy.epsilon": eps, "privacy.audit_canaries": 0, "out": str(folder)}))
            plain_s = time.perf_counter() - started
        lbs = np.asarray([r["epsilon_lb"] for r in results])
        spent = np.asarray([r["epsilon"] for r in results])
        # the release view fails a run on its conformance too (attack/release_audit.py)
        failures = sum(bool(lb > e) or r.get("verdict") == "fail" for lb, e, r in zip(lbs, spent, results, strict=True))
        rows.append(
            {
                "epsilon": eps,
                "epsilon_spent_mean": float(spent.mean()),
                "seeds": seeds,
                "failures": failures,
                "failure_rate": failures / seeds,
                "failure_rate_upper95": clopper_pearson(failures, seeds, 0.95, "upper"),
                "epsilon_lb_mean": float(lbs.mean()),
                "epsilon_lb_max": float(lbs.max()),
                "ratio_mean": float((lbs / spent).mean()),
                "ratio_max": float((lbs / spent).max()),
                "audit_s_mean": float(np.mean(audit_s)),
                "plain_s": plain_s,
                "epsilon_lb": lbs.tolist(),
            }
        )
    return {
        "preset": cfg.preset,
        "canaries": canaries,
        "delta": cfg.privacy.delta,
        "strategy": cfg.federation.strategy,
        "rows": rows,
    }


def format_benchmark(bench: dict[str, Any]) -> str:
    """The benchmark's table (markdown)."""
    lines = [
        f"honest runs, preset {bench['preset']}, {bench['canaries']} canaries, δ = {bench['delta']:g}, "
        f"{bench['strategy']}",
        "",
        "| ε | seeds | failures (ε_lb > ε) | failure rate, 95% upper | ε_lb mean | ε_lb max | ε_lb/ε mean | ε_lb/ε max "
        "| audit s | plain run s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bench["rows"]:
        plain = f"{r['plain_s']:.1f}" if r["plain_s"] is not None else "—"
        lines.append(
            f"| {r['epsilon_spent_mean']:.3f} | {r['seeds']} | {r['failures']} | {r['failure_rate_upper95']:.2f} | "
            f"{r['epsilon_lb_mean']:.3f} | {r['epsilon_lb_max']:.3f} | {r['ratio_mean']:.3f} | {r['ratio_max']:.3f} | "
            f"{r['audit_s_mean']:.1f} | {plain} |"
        )
    return "\n".join(lines)


__all__ = ["audit", "canary_scores", "format_benchmark", "honest_benchmark"]
