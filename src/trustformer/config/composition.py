"""Which protocols (``federation.strategy``) compose with which options: :func:`check_composition`, every check of
a run configuration that depends on its strategy. It reads the protocol's spec (``protocols/interface/spec.py``: what it
refuses and why, where its payload travels, its tasks, its own section and checks) and names no protocol."""

from __future__ import annotations

from typing import Protocol

from ..registry import PROTOCOLS, protocol_spec
from .checks import ConfigError, check_in_range
from .faults import MODEL_POISON_KINDS, PAYLOAD_FAULTS, Fault

STRATEGIES: tuple[str, ...] = tuple(PROTOCOLS)  # every registered protocol (trustformer/registry.py)


UPDATE_RULES = ("fltrust", "flame", "clip_noise", "rlr")
"""``robust.aggregator`` values that work on each client's whole-model update (payload minus the global model)."""


def _refusal(strategy: str, composition: str) -> str | None:
    """Why ``strategy`` does not take ``composition`` (its spec's ``refuses``), or None when it does."""
    return protocol_spec(strategy).refuses.get(composition)


def server_sees_each_update(strategy: str) -> bool:
    """Whether the server of ``strategy`` receives each client's update (so a defence can bound or rank it)."""
    return _refusal(strategy, "defences") is None


# What check_composition reads of a RunConfig (config/run.py, which calls it: typed structurally, so that this
# module imports no section).
class _Federation(Protocol):
    @property
    def strategy(self) -> str: ...
    @property
    def clients(self) -> int: ...
    @property
    def agg_every(self) -> int: ...
    @property
    def payload_bits(self) -> int: ...
    @property
    def payload_rounding(self) -> str: ...
    @property
    def download_bits(self) -> int: ...
    @property
    def clients_per_round(self) -> int: ...
    @property
    def restart_wait_s(self) -> float: ...
    def fault_plan(self) -> list[Fault]: ...


class _Secure(Protocol):
    @property
    def mode(self) -> str: ...
    @property
    def secagg_threshold(self) -> int: ...


class _Robust(Protocol):
    @property
    def bound(self) -> str: ...
    @property
    def aggregator(self) -> str: ...
    @property
    def trim_fraction(self) -> float: ...
    @property
    def byzantine(self) -> int: ...
    @property
    def multikrum_keep(self) -> int: ...
    @property
    def root_finetune(self) -> int: ...


class _Privacy(Protocol):
    @property
    def noise(self) -> str: ...
    @property
    def dropout_tolerance(self) -> int: ...
    @property
    def noise_bands(self) -> int: ...


class RunView(Protocol):
    """The parts of a :class:`~trustformer.config.RunConfig` the composition checks read."""

    @property
    def task(self) -> str: ...
    @property
    def federation(self) -> _Federation: ...
    @property
    def secure(self) -> _Secure: ...
    @property
    def robust(self) -> _Robust: ...
    @property
    def privacy(self) -> _Privacy: ...


def check_composition(cfg: RunView) -> None:
    """Every strategy-dependent check of a run configuration whose sections each passed their own validation
    (``RunConfig.validate`` calls it last): ConfigError naming the options that do not compose."""
    fed = cfg.federation
    spec = protocol_spec(fed.strategy)
    if spec.tasks is not None and cfg.task not in spec.tasks:
        raise ConfigError(
            f"federation.strategy = {fed.strategy!r} needs task = "
            f"{' or '.join(repr(t) for t in spec.tasks)}, not {cfg.task!r}: "
            f"{_refusal(fed.strategy, 'other_tasks') or spec.summary}"
        )
    _check_coding_and_sampling(fed)
    _check_faults(fed)
    if fed.agg_every != 1 and _refusal(fed.strategy, "agg_every"):
        raise ConfigError(
            f"federation.agg_every = {fed.agg_every} does not apply to federation.strategy = "
            f"{fed.strategy!r}: {_refusal(fed.strategy, 'agg_every')}; set 1"
        )
    _check_secure_aggregation(cfg.secure, fed)
    _check_distributed_noise(cfg)
    _check_robust(cfg.robust, fed, cfg.secure.mode)
    _check_root_finetune(cfg.robust, fed)
    _check_root_data(cfg.robust, cfg.task)
    if spec.check is not None:  # the protocol's own checks of the whole configuration
        spec.check(cfg)


def _check_coding_and_sampling(fed: _Federation) -> None:
    """Payload coding and client sampling: the protocols that take them."""
    if fed.payload_bits != 32 and _refusal(fed.strategy, "coding"):
        raise ConfigError(
            f"federation.payload_bits = {fed.payload_bits} does not apply to federation.strategy "
            f"= {fed.strategy!r}: {_refusal(fed.strategy, 'coding')}; set 32"
        )
    if fed.payload_bits != 32 and fed.payload_rounding == "nearest" and _refusal(fed.strategy, "nearest_rounding"):
        raise ConfigError(
            f"federation.payload_rounding = 'nearest' does not apply to federation.strategy = {fed.strategy!r}: "
            f"{_refusal(fed.strategy, 'nearest_rounding')}; set 'stochastic'"
        )
    if fed.download_bits != 32:
        spec = protocol_spec(fed.strategy)
        why = _refusal(fed.strategy, "coding") or (
            "what it sends down is an update on coordinates that change every round, not a global state every "
            "client holds"
            if spec.payload_is_update
            else None
        )
        if why or not spec.exchanges:
            raise ConfigError(
                f"federation.download_bits = {fed.download_bits} does not apply to federation.strategy = "
                f"{fed.strategy!r}: {why or 'it sends nothing down'}; set 32"
            )
    if fed.clients_per_round and _refusal(fed.strategy, "client_sampling"):
        raise ConfigError(
            f"federation.clients_per_round does not apply to federation.strategy = "
            f"{fed.strategy!r}: {_refusal(fed.strategy, 'client_sampling')}; set it to 0"
        )


def _check_faults(fed: _Federation) -> None:
    """Injected faults: what the strategy sends, and in the reply to which message."""
    spec = protocol_spec(fed.strategy)
    for fault in fed.fault_plan():
        if fault.poisons:
            why = _refusal(fed.strategy, "model_poisoning")
            if fault.kind in MODEL_POISON_KINDS and why:
                raise ConfigError(
                    f"federation.faults: {fault.text!r}: kind {fault.kind} poisons what a client "
                    f"sends, which federation.strategy = {fed.strategy!r} cannot carry: {why}"
                )
            continue
        if fault.kind in PAYLOAD_FAULTS and (not spec.exchanges or fault.round % fed.agg_every):
            raise ConfigError(
                f"federation.faults: {fault.text!r}: kind {fault.kind} corrupts the payload, but "
                f"round {fault.round} exchanges none (federation.strategy = {fed.strategy!r}, "
                f"federation.agg_every = {fed.agg_every})"
            )
        if fault.kind in PAYLOAD_FAULTS and fault.message != spec.payload_message:
            raise ConfigError(
                f"federation.faults: {fault.text!r}: kind {fault.kind} corrupts the payload, which "
                f"federation.strategy = {fed.strategy!r} sends in its reply to "
                f"{spec.payload_message} (name it: message=…)"
            )


def _check_secure_aggregation(secure: _Secure, fed: _Federation) -> None:
    """Secure aggregation needs a mean-of-payloads protocol, two clients and a threshold they can meet. No secure
    mode takes a message sent again after a restart: the channel refuses it (its nonce or step is spent)."""
    if secure.mode != "none" and fed.restart_wait_s > 0:
        raise ConfigError(
            f"federation.restart_wait_s = {fed.restart_wait_s} sends a message again to a node that restarted, and "
            f"secure.mode = {secure.mode!r} refuses a message it was sent before (a replay to its channel): set "
            "federation.restart_wait_s = 0 (a restarted client is dropped from that round) or secure.mode = 'none'"
        )
    if secure.mode not in ("secagg", "tee+secagg"):
        return
    why = _refusal(fed.strategy, "secure_aggregation")
    if why:
        raise ConfigError(
            f"secure.mode = {secure.mode!r} cannot carry federation.strategy = {fed.strategy!r}: "
            f"{why}; use secure.mode = 'tee' (sealed payloads, attested master)"
        )
    if protocol_spec(fed.strategy).mean_weighting is None:
        means = [
            s
            for s in STRATEGIES
            if protocol_spec(s).mean_weighting is not None and not _refusal(s, "secure_aggregation")
        ]
        raise ConfigError(
            f"secure.mode = {secure.mode!r} does not support federation.strategy = {fed.strategy!r}: "
            f"secure aggregation needs an aggregate that is a mean of the payloads "
            f"({', '.join(means)})"
        )
    if fed.clients < 2:
        raise ConfigError(f"secure.mode = {secure.mode!r} needs federation.clients >= 2, got {fed.clients}")
    if fed.payload_bits != 32:
        raise ConfigError(
            f"secure.mode = {secure.mode!r} cannot carry coded payloads (federation.payload_bits = "
            f"{fed.payload_bits}): each client codes its payload on a grid of its own (scale and "
            "offset per row), and masked codes of different grids cannot be summed; set "
            "federation.payload_bits = 32"
        )
    if secure.secagg_threshold:
        check_in_range("secure.secagg_threshold", secure.secagg_threshold, 2, fed.clients)


def _check_distributed_noise(cfg: RunView) -> None:
    """Distributed noise: a protocol whose aggregate sums the shares, one step per exchange, coverable dropouts."""
    p, fed = cfg.privacy, cfg.federation
    if p.noise != "distributed":
        return
    if not protocol_spec(fed.strategy).sums_noise_shares:
        takes = [s for s in STRATEGIES if protocol_spec(s).sums_noise_shares]
        raise ConfigError(
            f"privacy.noise = 'distributed' does not compose with federation.strategy = {fed.strategy!r}: its "
            "payload is not linear in the owner's DP-SGD step, so the sum would release each owner's "
            f"under-noised step through the nonlinearity; use {' or '.join(takes)}, or privacy.noise = 'local'"
        )
    if cfg.robust.aggregator == "rlr":
        raise ConfigError(
            "robust.aggregator = 'rlr' does not compose with privacy.noise = 'distributed': the clients' sign vectors "
            "are summed beside the payloads without noise, so the sum would release the signs of each owner's "
            "under-noised step; use privacy.noise = 'local', or another robust.aggregator"
        )
    if fed.agg_every != 1:
        raise ConfigError(
            f"privacy.noise = 'distributed' needs federation.agg_every = 1 (got {fed.agg_every}): each round is "
            "one DP-SGD step whose noise is complete only in the sum, and a step between exchanges would build "
            "on an under-noised one"
        )
    participants = fed.clients_per_round or fed.clients
    if p.noise_bands > 1 and (participants != fed.clients or p.dropout_tolerance):
        raise ConfigError(
            f"privacy.noise_bands = {p.noise_bands} needs every owner in every round (federation.clients_per_round "
            f"= 0, privacy.dropout_tolerance = 0; got {fed.clients_per_round} and {p.dropout_tolerance}): each "
            "owner correlates its noise share with its own earlier shares, and the sum is the banded noise only "
            "when every owner adds its share every round"
        )
    if p.dropout_tolerance >= participants:
        raise ConfigError(
            f"privacy.dropout_tolerance = {p.dropout_tolerance} must be below the {participants} participants "
            "of a round (federation.clients_per_round or federation.clients)"
        )


def _check_robust(robust: _Robust, fed: _Federation, secure_mode: str) -> None:
    """An explicit defence must be one the server can apply; Krum and trimming need enough clients."""
    explicit = [
        f"robust.{k} = {v!r}"
        for k, v in (("bound", robust.bound), ("aggregator", robust.aggregator))
        if v not in ("auto", "none", "mean")
    ]
    if not explicit:
        return
    why = _refusal(fed.strategy, "defences")
    if why:
        raise ConfigError(
            f"{explicit[0]} does not apply to federation.strategy = {fed.strategy!r}: {why}; leave it at its default"
        )
    secure_rlr = robust.aggregator == "rlr" and robust.bound in ("auto", "none") and not robust.root_finetune
    if secure_mode not in ("none", "tee") and not secure_rlr:
        raise ConfigError(
            f"{explicit[0]} cannot run under secure.mode = {secure_mode!r}: secure aggregation hides "
            "each update from the server, which sees only their sum, so it can neither bound nor "
            "rank them (only honest clients' own clipping holds); use secure.mode = 'tee' or "
            "'none', or robust.aggregator = 'rlr' (its signs are summed securely too) with robust.bound = 'none'"
        )
    if robust.aggregator in UPDATE_RULES and protocol_spec(fed.strategy).estimator != "model":
        raise ConfigError(
            f"robust.aggregator = {robust.aggregator!r} does not apply to federation.strategy = {fed.strategy!r}: "
            "it works on each client's update (payload minus the global model), which the server can form only "
            "where each payload is a whole model (fedavg, fedprox)"
        )
    why = _refusal(fed.strategy, "robust_rule")
    if robust.aggregator != "mean" and why:
        raise ConfigError(
            f"robust.aggregator = {robust.aggregator!r} does not apply to federation.strategy = {fed.strategy!r}: {why}"
        )
    n = fed.clients_per_round or fed.clients
    if robust.aggregator == "trimmed_mean" and int(robust.trim_fraction * n) < 1:
        raise ConfigError(
            f"robust.trim_fraction = {robust.trim_fraction} trims int({robust.trim_fraction} x {n}) = 0 "
            f"clients from each end of a round of {n}: nothing would be trimmed; set it to at "
            f"least {1 / n:.3g}"
        )
    if robust.aggregator in ("krum", "multikrum") and n < 2 * robust.byzantine + 3:
        raise ConfigError(
            f"robust.aggregator = {robust.aggregator!r} tolerates robust.byzantine = {robust.byzantine} "
            f"malicious clients only with at least 2f + 3 = {2 * robust.byzantine + 3} clients per "
            f"round, and a round has {n}"
        )
    if robust.aggregator == "multikrum" and robust.multikrum_keep > n:
        raise ConfigError(f"robust.multikrum_keep = {robust.multikrum_keep} exceeds the {n} clients of a round")


ROOT_DATA_TASKS = ("translation",)  # the tasks whose corpus holds pairs no client has (RunTask.population_pool)


def _check_root_data(robust: _Robust, task: str) -> None:
    """FLTrust and the clean fine-tuning pass train on root data no client holds, which only some tasks have."""
    option = (
        "robust.aggregator = 'fltrust'"
        if robust.aggregator == "fltrust"
        else f"robust.root_finetune = {robust.root_finetune}"
        if robust.root_finetune
        else ""
    )
    if option and task not in ROOT_DATA_TASKS:
        raise ConfigError(
            f"{option} needs root data no client holds, which task = {task!r} lacks (it has: "
            f"{', '.join(ROOT_DATA_TASKS)}); choose another robust.aggregator or set robust.root_finetune = 0"
        )


def _check_root_finetune(robust: _Robust, fed: _Federation) -> None:
    """The fine-tuning pass on root data trains the round's aggregate: a whole model, which the server holds in clear
    (under secure aggregation too: it unmasks the mean, the model it then fine-tunes)."""
    if robust.root_finetune and protocol_spec(fed.strategy).estimator != "model":
        models = [s for s in STRATEGIES if protocol_spec(s).estimator == "model"]
        raise ConfigError(
            f"robust.root_finetune = {robust.root_finetune} does not apply to federation.strategy = "
            f"{fed.strategy!r}: the server trains the round's aggregate on its root data, which it can only where "
            f"each payload is a whole model ({', '.join(models)}); set 0"
        )
