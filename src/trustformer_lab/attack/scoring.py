"""The reconstruction attack's figures: the server's estimates of every exchange (:func:`server_estimates`), scored
against the clients' true trained models (relative L2 error, fraction of weights recovered)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from trustformer.config import RunConfig
from trustformer.protocols.interface.base import Tensors

from .estimators import estimator_of
from .run_observer import Exchange

TOLERANCE = 1e-6  # a weight counts as recovered when |estimate − true| <= this
SECAGG_MODES = ("secagg", "tee+secagg")


def score(estimate: Tensors, true: Tensors) -> tuple[float, float]:
    """(relative L2 error, fraction of weights within :data:`TOLERANCE`) over every trainable weight."""
    names = list(true)
    diff = torch.cat([(estimate[n].double() - true[n].double()).reshape(-1) for n in names])
    norm = torch.cat([true[n].double().reshape(-1) for n in names]).norm()
    error = float(diff.norm() / norm) if norm > 0 else float(diff.norm())
    return error, float((diff.abs() <= TOLERANCE).double().mean())


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def server_estimates(cfg: RunConfig, initial: Tensors, exchanges: Sequence[Exchange], protocol: Any):
    """Per exchange, oldest first: (the exchange, the server's estimate of every client's trained model from what
    it holds, the global model the server held before it). Under secure aggregation every client is estimated
    from the aggregate, as if it had sent it; a client dropped from a round has no estimate there."""
    estimator = estimator_of(cfg)(cfg, initial, protocol)
    secagg = cfg.secure.mode in SECAGG_MODES
    for ex in sorted(exchanges, key=lambda e: e.round):
        estimator.begin(ex.round)
        before = {n: t.clone() for n, t in estimator.global_model.items()}
        estimates = {}
        for client in sorted(ex.trained):
            if secagg:
                if ex.aggregate is None:
                    raise RuntimeError(f"round {ex.round}: no aggregate was sent")
                estimates[client] = estimator.estimate(ex.aggregate)
            elif ex.received is not None and client in ex.received:
                estimates[client] = estimator.estimate(ex.received[client])
        yield ex, estimates, before, estimator
        if ex.aggregate is not None:
            estimator.advance(ex.aggregate)


def attack(cfg: RunConfig, initial: Tensors, exchanges: Sequence[Exchange], protocol: Any) -> dict[str, Any]:
    """The server's estimates of every exchange, scored against the clients' true trained models."""
    secagg = cfg.secure.mode in SECAGG_MODES
    rounds, estimator = [], None
    for ex, estimates, _before, estimator in server_estimates(cfg, initial, exchanges, protocol):  # noqa: B007 (read after the loop: the last one)
        clients = sorted(ex.trained)
        errors, recovered, initial_errors = [], [], []
        for client in clients:
            if client not in estimates:
                continue  # dropped this round: the server received nothing from it
            error, fraction = score(estimates[client], ex.trained[client])
            errors.append(error)
            recovered.append(fraction)
            initial_errors.append(score(initial, ex.trained[client])[0])
        rounds.append(
            {
                "round": ex.round,
                "clients": clients,
                "relative_error": errors,
                "recovered_fraction": recovered,
                "relative_error_mean": _mean(errors),
                "recovered_fraction_mean": _mean(recovered),
                "initial_error_mean": _mean(initial_errors),
            }
        )
    if not rounds:
        raise RuntimeError("the run had no exchange round: nothing to attack")
    assert estimator is not None  # the loop ran (rounds is not empty), so it set the estimator
    last = rounds[-1]
    return {
        "rounds": rounds,
        "headline": "last exchange round",
        "clients": last["clients"],
        "relative_error": last["relative_error"],
        "recovered_fraction": last["recovered_fraction"],
        "relative_error_mean": last["relative_error_mean"],
        "recovered_fraction_mean": last["recovered_fraction_mean"],
        "initial_error_mean": last["initial_error_mean"],
        "relative_error_mean_over_rounds": _mean([r["relative_error_mean"] for r in rounds]),
        "recovered_fraction_mean_over_rounds": _mean([r["recovered_fraction_mean"] for r in rounds]),
        "memberships_source": estimator.memberships_source,
        "server_sees": ("nothing" if not protocol.spec.exchanges else "aggregate only" if secagg else "every payload"),
    }


__all__ = ["SECAGG_MODES", "TOLERANCE", "attack", "score", "server_estimates"]
