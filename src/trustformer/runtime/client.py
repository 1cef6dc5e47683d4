"""The client's side of every round: its view of the run, its saved session, and the message handlers.

A handler loads the client's state (``runtime/store.py``: the snapshot at the point of the round loop the
message starts from), runs the task (local training, test loss, final metrics) and the protocol's client
hooks, saves the state and replies. Handlers see plain records only: the secure channel's client mod
(``secure/mod.py``) opens what arrives sealed before a handler runs and seals or masks its reply after.

- ``train``: local training; then the protocol's payload (exchange rounds), or a test evaluation;
- ``train.payload``: the payload the server asks for after training (FedPC's pilot model or ternary vector);
- ``train.apply``: apply the server's aggregate, then evaluate on the shared test set;
- ``evaluate``: the final evaluation (test loss and the task's scores);
- ``query``: which client (data partition) this node is.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..config import CONFIG_KEY, DATA_POISON_KINDS, RunConfig, parse_run_config, run_config_of
from ..core.poisoning import poisoned_model
from ..core.shared import ALL_SHARDS, assign_tensors, derive_seed, trainable_tensors
from ..errors import UncheckedConfigError
from ..export import export_model, model_fingerprint
from ..protocols import ProtocolObserver, active_observer, make_protocol
from ..protocols.interface.base import ClientSession, FederatedProtocol
from ..protocols.wrappers.robust import provide_root_training
from ..secure.mod import SecureClient
from ..tasks.run import RunTask, initial_tensors, load_task
from ..wire import FederationError, PayloadError, from_array_record, payload_bytes, spec_of, to_array_record
from . import diagnostics
from .attacker import AttackerView, Constraint, constrained_step, constraint_of, honest_samples, poisoned_update
from .node import (
    DEPLOYED_PROCESSES,
    client_id,
    client_store,
    node_setting,
    process_setup,
    release_memory_store,
)
from .root_training import root_training
from .store import ROUND_END, TRAINED, ClientState, DiskStore, MemoryStore

log = logging.getLogger(__name__)
# FLTrust's server update (robust.aggregator = "fltrust"): the task's training on root data, handed to the defences
# here because every process the apps run in (app.py) imports this module and the protocols import no task
provide_root_training(root_training)

# --------------------------------------------------------------------------------------- the client's view


@dataclass(frozen=True)
class ClientEnv:
    """What a client node knows: the run config, its partition, the task, its training shard and its state store."""

    cfg: RunConfig
    client: int
    task: RunTask  # tasks/run.py: TranslationTask or ImageRunTask
    protocol: FederatedProtocol
    store: MemoryStore | DiskStore
    shard: Any  # the client's training examples, in the task's own form
    diagnostics: bool = False  # simulation only: report fedavg_distance (needs every client's weights)
    load_s: float = 0.0  # seconds this message spent building the client's data (every message, deployed)
    startup_s: float = 0.0  # deployed: seconds from the start of this message's ClientApp process to here
    created: float = 0.0  # perf_counter when this view was built

    def timings(self, msg: Message) -> dict[str, float]:
        """The per-message overheads a reply reports: ``load_s``; from a ClientApp process of its own also
        ``startup_s`` and ``deliver_s`` (from the message's creation on the server to this process's start)."""
        if not self.startup_s:
            return {"load_s": self.load_s}
        started_at = time.time() - (time.perf_counter() - self.created) - self.startup_s
        return {
            "load_s": self.load_s,
            "startup_s": self.startup_s,
            "deliver_s": max(0.0, started_at - msg.metadata.created_at),
        }

    @property
    def key(self) -> str:
        return "all" if self.client == ALL_SHARDS else f"client-{self.client}"

    def initial(self):
        return initial_tensors(self.cfg)


_node_protocols: dict[RunConfig, tuple[ProtocolObserver | None, FederatedProtocol]] = {}


def node_protocol(cfg: RunConfig) -> FederatedProtocol:
    """The protocol object of this node's run, built once per run (and active observer), not once per message.
    Client hooks keep a client's state in its session (``protocol_state``), never on the object, so the clients
    one process hosts share it."""
    observer = active_observer()
    held = _node_protocols.get(cfg)
    if held is None or held[0] is not observer:
        if len(_node_protocols) >= 8:  # a long-lived SuperNode process serving many runs
            _node_protocols.clear()
        held = _node_protocols[cfg] = (observer, make_protocol(cfg, observer))
    return held[1]


def client_env(context: Context) -> ClientEnv:
    """The client's view of the run. Node config: ``partition-id``; optional ``state-dir`` (state on
    disk, under ``<state-dir>/<run key>/``), ``train-file`` (a TSV of the client's own training pairs
    instead of its shard of the configured corpus), ``output-dir`` (translations), ``diagnostics``
    (simulation only)."""
    started = time.perf_counter()
    cfg = config_of(context)
    process_setup(cfg)
    client = client_id(context)
    task, shard = _client_data(cfg, client, str(context.node_config.get("train-file", "")))
    return ClientEnv(
        cfg=cfg,
        client=client,
        task=task,
        protocol=node_protocol(cfg),
        store=client_store(cfg, context),
        shard=shard,
        diagnostics=bool(context.node_config.get("diagnostics", False)),
        load_s=time.perf_counter() - started,
        startup_s=_process_age_s(started),
        created=started,
    )


def secure_view(context: Context) -> SecureClient:
    """What the secure channel's client mod needs to know about this client."""
    cfg = config_of(context)
    client = client_id(context)
    store = client_store(cfg, context)
    key = f"{'all' if client == ALL_SHARDS else f'client-{client}'}.secure"

    def load() -> dict[str, torch.Tensor]:
        stored = store.load(key)
        return dict(stored.protocol) if stored is not None else {}

    def save(state: dict[str, torch.Tensor]) -> None:
        store.save(key, ClientState(model={}, optimizer={}, protocol=state, rounds_done=0))

    def layout():
        protocol = node_protocol(cfg)
        return protocol.expected_payload(initial_tensors(cfg)), protocol.spec.mean_weighting

    return SecureClient(
        cfg=cfg,
        client=client,
        run_id=int(context.run_id),
        node_config=context.node_config,
        load_state=load,
        save_state=save,
        payload_layout=layout,
        diagnostics=bool(context.node_config.get("diagnostics", False)),
    )


def _process_age_s(now: float) -> float:
    """Seconds since this process started, at ``now`` (perf_counter), in a process Flower started for
    one message; 0 elsewhere (or where /proc is missing)."""
    if Path(sys.argv[0]).name not in DEPLOYED_PROCESSES:
        return 0.0
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    age_now = uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    return max(0.0, age_now - (time.perf_counter() - now))


_poisoning = lru_cache(maxsize=64)(lambda fed, client: fed.poisoning(client))  # a client's fault, parsed once


def config_of(context: Context) -> RunConfig:
    """The run's configuration, parsed once per process and text (``run_config_of`` says what is missing)."""
    text = context.run_config.get(CONFIG_KEY)
    return parse_run_config(text) if isinstance(text, str) else run_config_of(context.run_config)


@lru_cache(maxsize=16)
def _client_data(cfg: RunConfig, client: int, train_file: str = ""):
    """The run's task and the client's training shard (translation: its encoded pairs, or those of
    its own ``train_file``; see the task's ``shard``). A data-poisoning client (``federation.faults``:
    backdoor, shuffled_targets) poisons its own shard, seeded from the run seed."""
    task = load_task(cfg)
    fault = cfg.federation.poisoning(client)
    if fault is not None and fault.kind in DATA_POISON_KINDS:
        return task, task.poisoned_shard(
            client, train_file, fault.kind, fault.share, seed=derive_seed(cfg.seed, "poison", client)
        )
    return task, task.shard(client, train_file)


def poison_trained_model(env: ClientEnv, session: ClientSession, view: AttackerView | None, run_id: int = 0) -> None:
    """A model-poisoning client (``federation.faults``: scale, sign_flip, noise; alie, min_max, min_sum and a
    boosted backdoor craft theirs from the honest updates they see, ``runtime/attacker.py``) replaces what it
    trained by ``start + g(trained − start)`` before the protocol builds its payload (``core/poisoning.py``)."""
    if view is None:
        return
    fault = _poisoning(env.cfg.federation, env.client)
    assert fault is not None
    log.warning(
        "client %s · round %d · poisoning its update (federation.faults: %s)", env.client, session.round, fault.kind
    )
    trained, start = trainable_tensors(session.model), view.start
    if fault.crafts:
        own = {n: trained[n].detach().cpu() - start[n].detach().cpu() for n in start}
        update = poisoned_update(env.cfg, fault, env.client, session.round, run_id, own, view)
        assign_tensors(session.model, {n: start[n] + update[n].to(start[n].device) for n in start})
        return
    assign_tensors(
        session.model,
        poisoned_model(
            start,
            trained,
            fault.kind,
            factor=fault.factor,
            seed=derive_seed(env.cfg.seed, "poison", env.client, session.round),
        ),
    )


def _constraint(env: ClientEnv, session: ClientSession, exchange: bool, view: AttackerView | None) -> Constraint | None:
    """A constrained backdoor's constraint this round (``pgd=yes``, ``mask=R``; ``runtime/attacker.py``)."""
    fault = _poisoning(env.cfg.federation, env.client)
    if not exchange or fault is None or not fault.hits(session.round):
        return None
    return constraint_of(env.cfg, fault, session, view)


def _poison_start(env: ClientEnv, session: ClientSession, exchange: bool, optimizer: Any = None) -> AttackerView | None:
    """What a model-poisoning client knows before it trains this round: the model it starts from and, for a
    crafting kind, its honest updates on parts of its data (None: it sends an honest payload)."""
    fault = _poisoning(env.cfg.federation, env.client)
    if not exchange or fault is None or not fault.poisons_model or not fault.hits(session.round):
        return None
    refusal = env.protocol.spec.refuses.get("model_poisoning")
    if refusal:  # refused at load (config/composition.py)
        raise UncheckedConfigError(
            f"federation.faults: {fault.text!r} poisons what a client sends, which federation.strategy = "
            f"{env.cfg.federation.strategy!r} cannot carry: {refusal}"
        )
    samples = honest_samples(env, session, optimizer, fault) if fault.crafts and fault.cap else []
    return AttackerView(trainable_tensors(session.model), samples)


# --------------------------------------------------------------------------------------- the session


class SavedOptimizerState:
    """An optimizer's saved state, passed through unchanged by a message that does not train (building
    a torch optimizer imports torch._dynamo: about 1.7 s in every fresh ClientApp process)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def open_session(
    env: ClientEnv, rnd: int, upto: tuple[int, int], *, train: bool = True
) -> tuple[ClientSession, torch.optim.Optimizer | SavedOptimizerState]:
    """Rebuild the client's model, optimizer and protocol state as saved at or before the point ``upto``
    (round, TRAINED | ROUND_END) of the round loop; none saved yet: the shared initial model.
    ``train=False``: the optimizer's saved state is kept as it is, without building an optimizer."""
    model = env.task.initial_model()
    state = env.store.load(env.key, upto=upto)
    optimizer: torch.optim.Optimizer | SavedOptimizerState
    if train or state is None:
        optimizer = env.protocol.training().client_optimizer(model, env.client) or env.task.new_optimizer(model)
    else:
        optimizer = SavedOptimizerState(state.optimizer)
    protocol_state: dict[str, torch.Tensor] = {}
    if state is not None:
        model.load_state_dict(state.model)
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer.load_state_dict(state.optimizer)
        protocol_state = dict(state.protocol)
    session = ClientSession(
        cfg=env.cfg,
        client=env.client,
        round=rnd,
        model=model,
        num_examples=len(env.shard),
        label_smoothing=env.task.label_smoothing,
        grad_clip=env.task.grad_clip,
        initial_tensors=env.initial,
        protocol_state=protocol_state,
        diagnostics=env.diagnostics,
    )
    return session, optimizer


def save_session(
    env: ClientEnv, session: ClientSession, optimizer: torch.optim.Optimizer | SavedOptimizerState, at: int
) -> None:
    """Save the client's state as snapshot (session.round, ``at``): TRAINED or ROUND_END."""
    env.store.save(
        env.key,
        ClientState(
            model=session.model.state_dict(),
            optimizer=optimizer.state_dict(),
            protocol=session.protocol_state,
            rounds_done=session.round,
        ),
        at=(session.round, at),
    )


def _evaluate_into(env: ClientEnv, session: ClientSession, metrics: dict[str, Any]) -> None:
    started = time.perf_counter()
    metrics["test_loss"] = env.task.test_loss(session.model)
    metrics.update(env.task.round_metrics(session.model))
    metrics["eval_s"] = time.perf_counter() - started


# --------------------------------------------------------------------------------------- handlers


def train(msg: Message, context: Context) -> Message:
    """Local training; then the protocol's payload (exchange rounds) or a test evaluation."""
    env = client_env(context)
    config: Mapping[str, Any] = msg.content["config"]  # a ConfigRecord; Flower types its values as a union
    rnd, exchange = int(config["round"]), bool(config["exchange"])
    session, optimizer = open_session(env, rnd, upto=(rnd - 1, ROUND_END))
    metrics: dict[str, Any] = {
        "client": env.client,
        "round": rnd,
        "num_examples": session.num_examples,
        **env.timings(msg),
    }
    protocol, training = env.protocol, env.protocol.training()
    if "model" in msg.content:  # the model to start from: a catch-up after missed exchanges, Phong's sequence
        catching_up = protocol.catching_up()
        specs = catching_up.catch_up_specs(session)
        what = "model from the server"
        incoming = from_array_record(
            cast(ArrayRecord, msg.content["model"]), specs[0] if len(specs) == 1 else None, what=what
        )
        if len(specs) > 1 and not any(spec_of(incoming) == spec for spec in specs):
            raise PayloadError(f"{what}: its arrays match none of the {len(specs)} layouts the protocol expects")
        metrics.update(catching_up.client_start_from(session, incoming))
    start = _poison_start(env, session, exchange, optimizer)
    constraint = _constraint(env, session, exchange, start)
    metrics.update(
        env.task.train_local(
            session.model,
            cast(torch.optim.Optimizer, optimizer),  # open_session with train=True builds one
            env.shard,
            seed=derive_seed(env.cfg.seed, "train", env.client, rnd),
            client=env.client,
            step=constrained_step(session, constraint) if constraint else training.local_step(session),
            **training.train_options(session),
        )
    )
    poison_trained_model(env, session, start, int(context.run_id))
    if constraint is not None:  # what it sends stays inside the constraint, boost included
        trained = trainable_tensors(session.model)
        update = constraint.apply({n: trained[n].detach() - constraint.start[n] for n in constraint.start})
        assign_tensors(session.model, {n: constraint.start[n] + update[n] for n in constraint.start})
    training.client_trained(session, metrics)
    content = RecordDict()
    if exchange and env.diagnostics:
        diagnostics.record_local_model(
            context.run_id, rnd, env.client, trainable_tensors(session.model), session.num_examples
        )
    if exchange and not protocol.spec.payload_on_request:  # FedPC: only the report now
        payload, phases = protocol.client_payload(session)
        metrics.update(phases)
        if protocol.spec.evaluates_after_train:
            _evaluate_into(env, session, metrics)
        content["payload"] = to_array_record({name: tensor.cpu() for name, tensor in payload.items()})
    elif not exchange:
        _evaluate_into(env, session, metrics)
    save_session(env, session, optimizer, TRAINED if exchange else ROUND_END)
    _log_training(env.client, rnd, metrics)
    content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=msg)


def _log_training(client: int, rnd: int, metrics: dict[str, Any]) -> None:
    rate, unit = (
        (metrics["tokens_per_s"], "tok/s")
        if "tokens_per_s" in metrics
        else (metrics.get("examples_per_s", 0.0), "examples/s")
    )
    if "steps" in metrics:  # (FedPC: private, removed by client_trained)
        log.info(
            "client %s · round %d · %d steps in %.1f s · %.0f %s · train loss %.3f",
            client,
            rnd,
            metrics["steps"],
            metrics["train_s"],
            rate,
            unit,
            metrics["train_loss"],
        )
    else:
        log.info(
            "client %s · round %d · trained in %.1f s · train loss %.3f",
            client,
            rnd,
            metrics["train_s"],
            metrics["train_loss"],
        )


def train_payload(msg: Message, context: Context) -> Message:
    """The payload the server asks for after this round's training (``session.request``: FedPC's pilot
    model or ternary vector)."""
    env = client_env(context)
    config: Mapping[str, Any] = msg.content["config"]  # a ConfigRecord; Flower types its values as a union
    rnd = int(config["round"])
    session, optimizer = open_session(env, rnd, upto=(rnd, TRAINED), train=False)
    session.request = {k: v for k, v in dict(config).items() if k != "round"}
    metrics: dict[str, Any] = {
        "client": env.client,
        "round": rnd,
        "num_examples": session.num_examples,
        **env.timings(msg),
    }
    payload, phases = env.protocol.client_payload(session)
    metrics.update(phases)
    save_session(env, session, optimizer, TRAINED)
    return Message(
        RecordDict(
            {"payload": to_array_record({n: t.cpu() for n, t in payload.items()}), "metrics": MetricRecord(metrics)}
        ),
        reply_to=msg,
    )


def train_apply(msg: Message, context: Context) -> Message:
    """Apply the server's aggregate (validated against what this client expects), then evaluate."""
    env = client_env(context)
    config: Mapping[str, Any] = msg.content["config"]  # a ConfigRecord; Flower types its values as a union
    rnd = int(config["round"])
    session, optimizer = open_session(env, rnd, upto=(rnd, TRAINED), train=False)
    metrics: dict[str, Any] = {"client": env.client, "round": rnd, **env.timings(msg)}
    aggregate = from_array_record(
        cast(ArrayRecord, msg.content["aggregate"]),
        env.protocol.payload_spec(session),
        what="aggregate from the server",
    )
    device = next(session.model.parameters()).device
    metrics.update(env.protocol.client_apply(session, {name: t.to(device) for name, t in aggregate.items()}))
    if env.diagnostics:
        metrics["fedavg_distance"] = diagnostics.fedavg_distance(context.run_id, rnd, trainable_tensors(session.model))
    _evaluate_into(env, session, metrics)
    save_session(env, session, optimizer, ROUND_END)
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def query(msg: Message, context: Context) -> Message:
    """Which client this node is (its ``partition-id``): the server maps node ids to clients with it."""
    return Message(RecordDict({"metrics": MetricRecord({"client": client_id(context)})}), reply_to=msg)


def _finetuned_scores(env: ClientEnv, session: ClientSession, rnd: int) -> dict[str, float]:
    """``federation.finetune_epochs`` > 0: a copy of the final model fine-tuned on the client's own shard, scored
    on the shared test set and on the client's own held-out data (``ft_*``). Which weights train is the task's
    :meth:`~trustformer.tasks.run.RunTask.personal_copy` (``federation.finetune_params``)."""
    fed = env.cfg.federation
    if not fed.finetune_epochs:
        return {}
    tuned = env.task.personal_copy(session.model)
    out = env.task.finetune(
        tuned,
        env.shard,
        epochs=fed.finetune_epochs,
        lr_scale=fed.finetune_lr_scale,
        seed=derive_seed(env.cfg.seed, "finetune", env.client, rnd),
    )
    out["ft_test_loss"] = env.task.test_loss(tuned)
    out.update(
        {f"ft_{k}": v for k, v in {**env.task.quick_scores(tuned), **env.task.own_metrics(tuned, env.client)}.items()}
    )
    return out


def secure_channel_only(msg: Message, context: Context) -> Message:
    """``query.attest`` / ``query.secagg`` reach a handler only when the run's ``secure.mode`` has no such step."""
    mode = config_of(context).secure.mode
    raise FederationError(f"this client runs secure.mode = {mode!r}, which has no {msg.metadata.message_type} step")


def evaluate(msg: Message, context: Context) -> Message:
    """Final evaluation, in two steps the server asks for.

    ``score = false``: the test loss, what the whole model costs on the wire (``model_bytes``), a
    description of the client's data and the model's fingerprint (a hash that tells identical models apart:
    the server asks one client per distinct model to score it, ``eval.decode_once``).

    ``score = true``: the task's final scores too (translation: decoded translations scored with BLEU,
    chrF, METEOR, BERTScore; image classification: accuracy and per-class accuracy; segmentation: Dice,
    IoU, pixel accuracy), and the model saved where the node config's ``models-dir`` says (``export.py``:
    ``trustformer translate`` / ``predict`` read it). Only the scores (and, for translation, three sample
    translations) go back to the server. Where the node config names an ``output-dir`` (the in-process
    engine sets ``<out>/client-<id>``), the client also writes every decoded test sentence to
    ``<output-dir>/translations.tsv`` (segmentation: ``masks.png``) itself, on its own machine: what a
    client's model outputs says more about it than the scores do, so it never crosses the wire.
    """
    env = client_env(context)
    config: Mapping[str, Any] = msg.content["config"]  # a ConfigRecord; Flower types its values as a union
    rnd, score = int(config["round"]), bool(config.get("score", True))
    session, _optimizer = open_session(env, rnd, upto=(rnd, ROUND_END), train=False)
    metrics: dict[str, Any] = {"client": env.client}
    _evaluate_into(env, session, metrics)
    labels: dict[str, Any] = {  # ConfigRecord values (Flower names their type only in an internal module)
        "fingerprint": model_fingerprint(session.model)
    }
    content = RecordDict()
    if not score:  # what is this client's own: its held-out data, and its model fine-tuned on its data
        metrics.update(env.task.own_metrics(session.model, env.client))
        metrics.update(_finetuned_scores(env, session, rnd))
    if score:
        scores, task_labels, samples = env.task.final_metrics(
            session.model, node_setting(env.cfg, context, "output-dir")
        )
        scores.pop("test_loss", None)  # the task's own copy of what _evaluate_into measured
        metrics.update(scores)
        labels.update(task_labels)
        models_dir = node_setting(env.cfg, context, "models-dir")
        if models_dir:
            labels["model"] = str(
                export_model(
                    Path(str(models_dir)),
                    session.model,
                    **env.task.export_kwargs(),
                    extra={"strategy": env.cfg.federation.strategy, "round": rnd},
                )
            )
        if samples:
            content["samples"] = ConfigRecord(cast("dict[str, Any]", samples))  # lists of str
        log.info("client %s · final test loss %.3f · %s", env.client, metrics["test_loss"], env.task.final_log(metrics))
    # what the trainable tensors cost under the same serializer (the size of a FedAvg payload), and the whole model
    metrics["model_bytes"] = payload_bytes(RecordDict({"payload": to_array_record(trainable_tensors(session.model))}))
    whole = {n: p.detach() for n, p in session.model.named_parameters()}
    metrics["full_model_bytes"] = payload_bytes(RecordDict({"payload": to_array_record(whole)}))
    data = env.task.describe(env.client)
    if env.cfg.task == "translation":
        data["train_pairs"] = session.num_examples
    content["metrics"] = MetricRecord(metrics)
    content["data"] = ConfigRecord(data)
    content["labels"] = ConfigRecord(labels)
    return Message(content, reply_to=msg)


__all__ = [
    "ClientEnv",
    "client_env",
    "evaluate",
    "open_session",
    "query",
    "release_memory_store",
    "save_session",
    "secure_view",
    "train",
    "train_apply",
    "train_payload",
]
