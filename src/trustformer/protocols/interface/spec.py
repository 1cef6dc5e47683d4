"""What a protocol declares about itself, in one place: its module's ``SPEC``, a :class:`ProtocolSpec`.

The configuration checks (``config/composition.py``), the attacks, the runtime and the docs read the spec; none
of them names a protocol. A protocol is registered by one line in ``trustformer/registry.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The compositions a protocol may refuse (keys of ProtocolSpec.refuses), with the option each one is set by.
COMPOSITIONS: dict[str, str] = {
    "coding": "federation.payload_bits",  # coded uploads (protocols/wrappers/coding.py)
    # coded uploads rounded to nearest: biased, so it needs error feedback on coordinates that mean the same thing
    "nearest_rounding": "federation.payload_rounding",
    "client_sampling": "federation.clients_per_round",
    "secure_aggregation": "secure.mode",  # pairwise-masked sums (secure/secagg.py)
    "defences": "robust.bound / robust.aggregator",  # an update bound, a robust rule (wrappers/robust.py)
    "robust_rule": "robust.aggregator",  # a robust rule only (the bound may still apply)
    "model_poisoning": "federation.faults",  # a client poisoning what it sends (scale, sign_flip, noise)
    "agg_every": "federation.agg_every",  # exchanging every k-th round only
    "other_tasks": "task",  # a task outside ProtocolSpec.tasks (the reason says why it needs its own)
}

AGGREGATE_KINDS = ("model", "update", None)  # ProtocolSpec.aggregate_kind: a global model, an update of it, neither


@dataclass(frozen=True)
class ProtocolSpec:
    """A protocol's declaration.

    ``name`` is its ``federation.strategy``; ``factory`` builds it from a ``RunConfig``. ``refuses`` maps each
    composition of :data:`COMPOSITIONS` the protocol does not take to the reason, which the configuration error
    quotes. ``section`` is its own configuration section, ``[<name>]`` (a frozen dataclass with defaults and a
    ``validate()``), read as ``cfg.section(<name>)``. ``check`` runs the protocol's own checks of a whole
    configuration (raising ``ConfigError``). ``tasks``: the tasks it runs on (None: every task).

    How it behaves on the wire: ``exchanges`` (False: local and centralized references); ``payload_message``, the
    message whose reply carries its payload (FedPC: ``train.payload``, asked for after the ``train`` reports);
    ``evaluates_after_train`` (a ``train`` reply of an exchange round carries a test evaluation: Phong);
    ``mean_weighting``, ``"examples"`` or ``"uniform"`` when the aggregate is that mean of the payloads, which
    secure aggregation can compute without seeing them (None otherwise); ``informs_left_out`` (clients a round
    leaves out still receive its aggregate: the DP baselines' Poisson sampling); ``payload_is_update`` (the
    payload's floats are an update centered on 0, not a model or centroids: the robust bound centers it on 0).

    ``pools_data``: one node trains on the union of every shard (the centralized reference).

    ``aggregate_kind``: what its aggregate is, which says whether a server optimizer (``federation.server_optimizer``,
    ``wrappers/server_optimizer.py``) can step with it: ``"model"`` (the global model every client adopts, which the
    server may hold: FedAvg), ``"update"`` (an update of the global model every client holds, dense or sparse, which
    every client adds to it: FedAvg of updates, top-k, the DP baselines); None: neither (centroids, a model passed
    from client to client, nothing), so a server optimizer is refused.

    ``sums_noise_shares``: its aggregate is a mean of payloads linear in the client's one DP-SGD step from the
    global model (a model, an update), so the shares of distributed noise (``privacy.noise = "distributed"``) add
    up in it to the mechanism's noise. Opt-in: a protocol whose payload is not linear in that step (centroids, a
    top-k selection) would release each owner's under-noised step through the nonlinearity.

    ``estimator``: how the server estimates a client's model from what it sees (``attack/reconstruct.py``):
    ``"model"`` (the payload is the model), ``"update"`` (the last global model plus the dense or sparse update),
    ``"centroids"`` (rows shifted to the client's centroids), ``"none"`` (the server receives nothing); None: the
    reconstruction attack does not cover it. ``variants(cfg, levels, memberships)``: the runs a sweep's
    ``--betas`` / ``--memberships`` make of it, as (label, overrides) (None: the protocol as configured);
    ``run_fields(cfg)``: the options that tell its runs apart in an attack's result.
    """

    name: str
    factory: Callable[[Any], Any]
    summary: str = ""
    refuses: Mapping[str, str] = field(default_factory=dict)
    section: type | None = None
    # keys that moved into its section: old dotted key -> key in the section, still read for one release
    renamed: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[Any], None] | None = None
    tasks: tuple[str, ...] | None = None
    exchanges: bool = True
    payload_message: str = "train"
    evaluates_after_train: bool = False
    mean_weighting: str | None = None
    informs_left_out: bool = False
    payload_is_update: bool = False
    pools_data: bool = False
    sums_noise_shares: bool = False
    aggregate_kind: str | None = None
    estimator: str | None = "model"
    variants: (
        Callable[[Any, Sequence[float] | None, Sequence[str] | None], list[tuple[str, dict[str, Any]]] | None] | None
    ) = None
    run_fields: Callable[[Any], dict[str, Any]] | None = None

    # derived: the ``train`` reply carries only a report; the server asks for payloads with ``train.payload``
    payload_on_request: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        unknown = set(self.refuses) - set(COMPOSITIONS)
        if unknown:
            raise ValueError(
                f"protocol {self.name!r} refuses unknown compositions {sorted(unknown)} "
                f"(known: {', '.join(COMPOSITIONS)})"
            )
        if self.aggregate_kind not in AGGREGATE_KINDS:
            raise ValueError(
                f"protocol {self.name!r}: aggregate_kind = {self.aggregate_kind!r} is not one of {AGGREGATE_KINDS}"
            )
        object.__setattr__(self, "payload_on_request", self.payload_message != "train")


__all__ = ["AGGREGATE_KINDS", "COMPOSITIONS", "ProtocolSpec"]
