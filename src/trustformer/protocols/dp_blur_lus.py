"""DP-BLUR-LUS (Cheng et al. 2022, "Differentially private federated learning with local regularization and
sparsification"): user-level differential privacy (``dp.py``) around a top-k sparsified update
(``fedavg_topk.py`` without error feedback) whose clients

1. train with the bounded local update regulariser (BLUR) added to the loss,
   R(w) = (λ/2)·max(0, ‖w − W_global‖ − B)² (``privacy.blur_lambda``, ``privacy.blur_bound``;
   B = C by default), which keeps the update small before it is clipped;
2. sparsify the update (LUS): keep the ceil(keep·d) coordinates of Δ with the largest magnitude
   (``privacy.lus_keep``), zero the rest;
3. clip the kept values to ‖·‖ ≤ C and send them as ``indices`` (int32) and ``values`` (float32), which
   is what the bytes count.

The server sums the sparse updates and adds N(0, σ²C²) on the kept coordinates only (the union of
the clients' kept coordinates; ``privacy.lus_noise = "kept"``), so the global update stays sparse
and goes down as (indices, values); ``"dense"`` adds noise on every coordinate and sends a dense
update. With ``"kept"`` the positions of the kept coordinates are released as they are: the
accountant's ε covers the values, not which coordinates were kept.
"""

from __future__ import annotations

from ..config import RunConfig
from ..core.local_rules import blur_penalty
from .fedavg_topk import GLOBAL, FedAvgTopK
from .interface.base import ClientSession, FederatedProtocol, LocalStep, held_global
from .wrappers.dp import DifferentialPrivacy, dp_spec, record_level


def blur_local_step(bound: float, lam: float):
    """BLUR: minimise L(w) + (λ/2)·max(0, ‖w − W_global‖ − B)² with the run's optimizer."""

    def make(session: ClientSession) -> LocalStep:
        base = held_global(session, GLOBAL)
        names = [n for n, p in session.model.named_parameters() if p.requires_grad]
        anchors = [base[n] for n in names]
        smoothing = session.smoothing

        def step(model, optimizer, src, tgt):
            params = dict(model.named_parameters())
            optimizer.zero_grad(set_to_none=True)
            loss_sum, n_tokens = model.loss(src, tgt, label_smoothing=smoothing)
            objective = loss_sum / max(n_tokens, 1)
            if lam > 0:
                objective = objective + blur_penalty([params[n] for n in names], anchors, bound, lam)
            objective.backward()
            optimizer.step()
            return loss_sum.detach(), n_tokens  # the reported training loss is the data loss alone

        def penalty(model):  # under DP-SGD: data-independent, its gradient added after the noise (core/dpsgd.py)
            params = dict(model.named_parameters())
            return blur_penalty([params[n] for n in names], anchors, bound, lam)

        step.dp_form = {"penalty": penalty if lam > 0 else None}  # type: ignore[attr-defined]
        return step

    return make


def dp_blur_lus(cfg: RunConfig) -> FederatedProtocol:
    """Client level: user-level DP around the sparsified BLUR-trained update. Record level (``privacy.unit =
    "record"``): DP-SGD with the BLUR term added after the noise, then LUS sparsification (post-processing)."""
    p = cfg.privacy
    inner = FedAvgTopK(
        cfg,
        keep=p.lus_keep,
        error_feedback=False,
        local_step=blur_local_step(p.blur_bound or p.clip_norm, p.blur_lambda),
    )
    if p.unit == "record":
        return record_level(inner, SPEC)
    return DifferentialPrivacy(inner, p, spec=SPEC)


SPEC = dp_spec("dp-blur-lus", dp_blur_lus, "DP-FedAvg with a bounded-update regulariser and sparsified updates")

__all__ = ["blur_local_step", "dp_blur_lus"]
