"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: stochastic controlled averaging for federated learning", Alg. 1):
FedAvg whose clients correct every local gradient by the drift of their data, g_i(y) − c_i + c.

State on both sides: the server holds the control variate c (``control``, checkpointed with the run), each client
its own c_i (its protocol state, stored with the client). A client sends its model y_i and Δc_i = c_i⁺ − c_i; the
server returns x = Σ (n_i/n) y_i (FedAvg's mean, η_g = 1) and c ← c + (|S|/N)·Σ (n_i/n) Δc_i (line 17), which
every client keeps beside x. Both are one weighted mean of the payloads, so secure aggregation computes them unseen;
|S|/N is ``federation.clients_per_round`` over the clients (1 without sampling).

c_i⁺ is option II of line 12, c_i − c + (x − y_i)/(K η_l), which with plain SGD equals the mean of the K raw
(uncorrected) minibatch gradients the client took. That mean is what a client keeps here, so the control variate
means the same with the task's Adam, whose steps are not η_l·g. Record-level DP is refused: Δc_i is a mean of
raw gradients, released unclipped and unnoised.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..config import ConfigError, RunConfig
from ..core.aggregation import weighted_mean
from ..core.shared import LocalStep, clipped_gradients
from ..wire import TensorSpec, spec_of
from .fedavg import FedAvg
from .interface.base import Aggregated, ClientSession, Phases, ServerStart, Tensors, assign_tensors, trainable_tensors
from .interface.parts import LocalTraining
from .interface.spec import ProtocolSpec

CONTROL = "control/"  # payload: Δc_i of each trainable tensor; aggregate: c
C_I, C, GRAD_SUM, STEPS = "scaffold/c_i/", "scaffold/c/", "scaffold/grad_sum/", "scaffold/steps"  # client state


def _check(cfg: RunConfig) -> None:
    if cfg.privacy.unit == "record":
        raise ConfigError(
            "federation.strategy = 'scaffold' sends Δc_i, a mean of the owner's raw gradients, which record-level "
            "DP-SGD does not clip or noise; set privacy.unit = 'client' or use federation.strategy = 'fedavg'"
        )
    if cfg.robust.root_finetune:
        raise ConfigError(
            f"robust.root_finetune = {cfg.robust.root_finetune} does not apply to federation.strategy = 'scaffold': "
            "the server would train c, the control variate beside the model, as weights; set robust.root_finetune = 0"
        )


def with_controls(tensors: Tensors) -> Tensors:
    """The trainable tensors and, beside each, its control variate's slot (zeros): a payload's or aggregate's layout."""
    return {**tensors, **{CONTROL + n: torch.zeros_like(t) for n, t in tensors.items()}}


def corrected_step(session: ClientSession) -> LocalStep:
    """The task's plain step on g_i(y) − c_i + c (Alg. 1, line 10), the raw gradient clipped as the task's step clips
    it; the raw gradients are summed into the client's state for c_i⁺."""
    state, clip = session.protocol_state, session.grad_clip
    names = [n for n, p in session.model.named_parameters() if p.requires_grad]
    shift = {n: state.get(C + n, 0.0) - state.get(C_I + n, 0.0) if C + n in state else None for n in names}

    def step(model, optimizer, src, tgt):
        loss_sum, count = clipped_gradients(model, optimizer, src, tgt, session.smoothing, clip)
        for name, p in model.named_parameters():
            if name not in shift or p.grad is None:
                continue
            raw = p.grad.detach()
            state[GRAD_SUM + name] = state.get(GRAD_SUM + name, torch.zeros_like(raw)) + raw
            if shift[name] is not None:
                p.grad.add_(shift[name].to(p.grad.dtype))
        state[STEPS] = state.get(STEPS, torch.zeros(())) + 1
        optimizer.step()
        return loss_sum, count

    return step


class Scaffold(FedAvg, LocalTraining):
    spec = ProtocolSpec(
        name="scaffold",
        factory=lambda cfg: Scaffold(cfg),
        check=_check,
        mean_weighting="examples",
        aggregate_kind=None,  # a model and a control variate: a server optimizer would step c as if it were weights
        refuses={
            "defences": "the update bound and robust rules would treat Δc_i as weights of the model",
            "model_poisoning": "the faults poison the whole payload, Δc_i included, which no paper attack does",
        },
        summary="FedAvg with control variates c (server) and c_i (clients) that correct client drift (2020)",
    )
    state_attrs = ("control",)  # c, the server's control variate (FedAvg's latest beside it)
    start_attrs = ("clients",)  # N (server_begin)
    control: Tensors | None = None
    clients = 0

    def server_begin(self, start: ServerStart) -> None:
        self.clients = start.clients

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        return spec_of(with_controls(initial))

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        return spec_of(with_controls(trainable_tensors(session.model)))

    def catch_up_specs(self, session: ClientSession) -> list[TensorSpec]:
        return [spec_of(with_controls(trainable_tensors(session.model)))]

    def local_step(self, session: ClientSession) -> LocalStep | None:
        return corrected_step(session)

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        """y_i and Δc_i = c_i⁺ − c_i, c_i⁺ the mean raw gradient since the last exchange (option II)."""
        state, model = session.protocol_state, trainable_tensors(session.model)
        steps = float(state.pop(STEPS, torch.zeros(())))
        payload = dict(model)
        for name, y in model.items():
            raw_sum = state.pop(GRAD_SUM + name, None)
            old = state.get(C_I + name, torch.zeros_like(y))
            new = raw_sum / steps if raw_sum is not None and steps > 0 else old
            payload[CONTROL + name], state[C_I + name] = new - old, new.detach().clone()
        return payload, {}

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        started = time.perf_counter()
        mean = weighted_mean(payloads, [float(n) for n in num_examples])
        k = self.cfg.federation.clients_per_round
        share = min(k, self.clients) / self.clients if k and self.clients else 1.0  # |S| / N
        control = self.control or {n: torch.zeros_like(t) for n, t in mean.items() if n.startswith(CONTROL)}
        self.control = {n: c + share * mean[n].to(c.dtype) for n, c in control.items()}
        out = {**{n: t for n, t in mean.items() if not n.startswith(CONTROL)}, **self.control}
        return Aggregated(out, {"aggregate_s": time.perf_counter() - started})

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        started = time.perf_counter()
        assign_tensors(session.model, {n: t for n, t in aggregate.items() if not n.startswith(CONTROL)})
        for name, c in aggregate.items():
            if name.startswith(CONTROL):
                session.protocol_state[C + name.removeprefix(CONTROL)] = c.detach().clone()
        return {"apply_s": time.perf_counter() - started}


SPEC = Scaffold.spec

__all__ = ["Scaffold", "corrected_step", "with_controls"]
