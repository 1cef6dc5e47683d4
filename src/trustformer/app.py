"""The Flower ``ServerApp`` and ``ClientApp`` that run every protocol.

Written once on Flower's Message API; the in-process runtime (``trustformer.runtime.inprocess``)
and a multi-process Flower deployment run these very objects.

One round (``federation.rounds`` of them; the paper's epochs):

1. ``train`` → every client: load its state, train locally; if this round exchanges
   (``round % agg_every == 0``) reply with the protocol's payload, else evaluate and reply.
2. The server validates the payloads (names, shapes, dtypes, finite values, agreement between
   clients), drops the clients whose payload is invalid, and aggregates the rest.
3. ``train.apply`` → every valid client: apply the aggregate, evaluate on the shared test set.

After the last round, ``evaluate`` → every client: test loss and translation quality (BLEU, chrF,
METEOR, BERTScore F1); each client writes its own ``translations.tsv`` where its node config says.
The server writes ``metrics.jsonl`` and ``summary.json`` to the run's output folder.

A protocol may add optional hooks (``protocols/base.py``): its own local training step, a check
before round 1 (a privacy budget), per-round client sampling or an early stop, per-round fields
(ε spent) and extra summary fields. Clients not sampled in a round only receive the aggregate.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import flwr
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .config import RunConfig
from .data.batching import encode_pairs
from .metrics import RunRecorder
from .protocols import ClientSession, FederatedProtocol, get_protocol
from .protocols.base import trainable_tensors
from .runtime import diagnostics
from .runtime.store import ClientState, DiskStore, MemoryStore
from .wire import PayloadError, from_array_record, payload_bytes, to_array_record
from .workload import (
    ALL_SHARDS,
    Workload,
    derive_seed,
    initial_model,
    load_workload,
    new_optimizer,
    test_loss,
    train_local,
    translation_scores,
)

log = logging.getLogger(__name__)

CONFIG_KEY = "trustformer-config"  # run_config key holding the resolved RunConfig as JSON
TRAIN, APPLY, EVALUATE = "train", "train.apply", "evaluate"
SAMPLE_TRANSLATIONS = 3

server_app = ServerApp()
client_app = ClientApp()


class FederationError(RuntimeError):
    """The federation cannot go on (too few valid clients, nodes missing)."""


def config_from_context(context: Context) -> RunConfig:
    try:
        raw = context.run_config[CONFIG_KEY]
    except KeyError:
        raise FederationError(f"run_config has no {CONFIG_KEY!r} entry (the resolved run configuration)") from None
    return RunConfig.from_json(str(raw))


# --------------------------------------------------------------------------------------- server


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    run_federation(grid, config_from_context(context))


def expected_nodes(cfg: RunConfig) -> int:
    return 1 if cfg.federation.strategy == "centralized" else cfg.federation.clients


def run_federation(grid: Grid, cfg: RunConfig, *, node_wait_s: float = 120.0) -> dict[str, Any]:
    """The server's round loop (Algorithm 1 of the paper, server side) for any protocol."""
    protocol = get_protocol(cfg)
    fed = cfg.federation
    node_ids = _wait_for_nodes(grid, expected_nodes(cfg), node_wait_s)
    min_valid = fed.min_clients or len(node_ids)
    begin = getattr(protocol, "server_begin", None)  # optional hooks: see protocols/base.py
    if begin is not None:
        try:
            begin(len(node_ids))
        except ValueError as exc:
            raise FederationError(f"{protocol.name} refuses to start: {exc}") from exc
    choose = getattr(protocol, "server_round", None)
    round_done = getattr(protocol, "server_round_done", None)
    check_payload = getattr(protocol, "check_payload", None)
    recorder = RunRecorder(cfg.out, total_rounds=fed.rounds)
    log.info(
        "strategy %s · %d client(s) · %d round(s) · output %s", protocol.name, len(node_ids), fed.rounds, cfg.out
    )
    clients: dict[int, int] = {}  # node id -> client (partition) id, learnt from replies
    server_phases: Counter[str] = Counter()
    rounds_run = 0

    for rnd in range(1, fed.rounds + 1):
        exchange = protocol.exchanges and rnd % fed.agg_every == 0
        participants = list(node_ids)
        if exchange and choose is not None:
            chosen = choose(rnd, list(node_ids))
            if chosen is None:  # the protocol ends the run here (e.g. its privacy budget is spent)
                reason = getattr(protocol, "stop_reason", lambda: "stopped by the protocol")()
                log.warning("stopping before round %d: %s", rnd, reason)
                recorder.event(event="stopped", round=rnd, reason=reason)
                break
            participants = [n for n in node_ids if n in set(chosen)]
        needed = min(min_valid, len(participants))
        rounds_run = rnd
        round_fields: dict[str, Any] = {}
        train_cfg = ConfigRecord({"round": rnd, "exchange": exchange})
        replies = _send(grid, participants, TRAIN, rnd, lambda _n: RecordDict({"config": train_cfg}))
        rows: dict[int, dict[str, Any]] = {}
        payloads: dict[int, dict[str, torch.Tensor]] = {}
        for node, (reply, down) in replies.items():
            row = _reply_row(recorder, rnd, node, reply, down, clients, "train")
            if row is None:
                continue
            rows[node] = row
            if exchange:
                try:
                    payloads[node] = from_array_record(reply.content["payload"], what="payload")
                    if check_payload is not None:
                        check_payload(payloads[node])
                except (KeyError, PayloadError) as exc:
                    _drop(recorder, rnd, node, clients, f"invalid payload: {exc}")
                    rows.pop(node)
        if exchange:
            payloads = _consistent(recorder, rnd, payloads, clients)
            rows = {n: rows[n] for n in payloads}
            _require(len(rows), needed, rnd, "train")
            if rows:
                aggregate, phases = protocol.aggregate(
                    [payloads[n] for n in payloads], [rows[n]["num_examples"] for n in payloads]
                )
                server_phases.update(phases)
                content = RecordDict({"config": ConfigRecord({"round": rnd}),
                                      "aggregate": to_array_record(aggregate)})
                # with client sampling, every other client (not sampled, or dropped) adopts the aggregate too
                others = [n for n in node_ids if n not in rows] if choose is not None else []
                applied = _send(grid, list(rows) + others, APPLY, rnd, lambda _n: content)
                for node, (reply, down) in applied.items():
                    apply_row = _reply_row(recorder, rnd, node, reply, down, clients, "apply")
                    if apply_row is None:
                        rows.pop(node, None)
                        continue
                    if node in rows:
                        row = rows[node]
                        row["bytes_up"] += apply_row.pop("bytes_up")
                        row["bytes_down"] += apply_row.pop("bytes_down")
                        row.update(apply_row)
                    else:  # sat this round out (or was dropped): it only adopts the aggregate
                        row = rows[node] = apply_row
                    row.update(phases)  # server phases of this round, seen by every client
                _require(len(rows), needed, rnd, "apply")
            else:
                recorder.event(event="no_participants", round=rnd, reason="no client was sampled for this round")
            if round_done is not None:
                round_fields = round_done(rnd)
        else:
            _require(len(rows), needed, rnd, "train")
        for node in sorted(rows, key=lambda n: clients[n]):
            row = rows[node]
            row["exchanged"] = exchange
            if exchange and choose is not None:
                row["sampled"] = node in participants
            row.update(round_fields)
            if protocol.name == "trustformer":
                row["beta"] = fed.beta
            recorder.record(row)
        recorder.round_done(rnd)

    final = _send(grid, node_ids, EVALUATE, rounds_run,
                  lambda _n: RecordDict({"config": ConfigRecord({"round": rounds_run})}))
    per_client: dict[int, dict[str, Any]] = {}
    for node, (reply, _down) in final.items():
        if reply.has_error():
            _drop(recorder, rounds_run, node, clients, f"final evaluation failed: {reply.error.reason}")
            continue
        metrics = dict(reply.content["metrics"])
        samples = reply.content["samples"] if "samples" in reply.content else None
        metrics["samples"] = (
            [list(t) for t in zip(samples["source"], samples["reference"], samples["hypothesis"])]
            if samples is not None else []
        )
        metrics["data"] = dict(reply.content["data"]) if "data" in reply.content else {}
        metrics["labels"] = dict(reply.content["labels"]) if "labels" in reply.content else {}
        per_client[int(metrics["client"])] = metrics
    order = sorted(per_client)
    extra: dict[str, Any] = {}
    if protocol.name == "trustformer":
        extra["beta"] = fed.beta
    summary_hook = getattr(protocol, "server_summary", None)
    if summary_hook is not None:
        extra.update(summary_hook())
    distances = {r["client"]: r["fedavg_distance"] for r in recorder.records if "fedavg_distance" in r}
    if distances:  # the last exchange's value per client (simulation-only diagnostic)
        extra["fedavg_distance"] = [distances.get(c) for c in order]
    model_bytes = max((int(per_client[c]["model_bytes"]) for c in order), default=0)
    summary = recorder.summary(
        strategy=protocol.name,
        preset=cfg.preset,
        rounds=rounds_run,
        clients=len(node_ids),
        seed=cfg.seed,
        config=cfg.to_dict(),
        client_ids=order,
        test_loss=[per_client[c]["test_loss"] for c in order],
        bleu=[per_client[c]["bleu"] for c in order],
        chrf=[per_client[c]["chrf"] for c in order],
        meteor=[per_client[c].get("meteor") for c in order],
        bertscore_f1=[per_client[c].get("bertscore_f1") for c in order],
        bertscore_model=next((per_client[c]["labels"]["bertscore_model"] for c in order
                              if "bertscore_model" in per_client[c]["labels"]), None),
        translations={str(c): _under(cfg.out, per_client[c]["labels"]["translations"]) for c in order
                      if "translations" in per_client[c]["labels"]},
        samples={str(c): per_client[c]["samples"] for c in order},
        data={"clients": {str(c): per_client[c]["data"] for c in order}},
        bytes={"fedavg_model_bytes": model_bytes},
        server_time_s={k: round(v, 4) for k, v in server_phases.items()},
        versions={"trustformer": _version(), "flwr": flwr.__version__, "torch": torch.__version__},
        **extra,
    )
    log.info(
        "done in %.1f s · test loss %s · BLEU %s · wrote %s",
        summary["time_s"]["total"], _fmt_list(summary["test_loss"]), _fmt_list(summary["bleu"], 2),
        Path(cfg.out) / "summary.json",
    )
    return summary


def _under(out: str, path: str) -> str:
    """``path`` relative to the run's output folder when it lies inside it (as written by in-process clients)."""
    try:
        return str(Path(path).resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return path


def _send(grid: Grid, node_ids, message_type: str, rnd: int, make_content) -> dict[int, tuple[Message, int]]:
    """Send one message per node; return each node's reply with the bytes sent down to it."""
    messages, down = [], {}
    for node in node_ids:
        content = make_content(node)
        down[node] = payload_bytes(content)
        messages.append(Message(content, node, message_type, group_id=str(rnd)))
    replies = {m.metadata.src_node_id: m for m in grid.send_and_receive(messages)}
    out = {}
    for node in node_ids:
        if node in replies:
            out[node] = (replies[node], down[node])
        else:
            out[node] = (None, down[node])
    return out


def _reply_row(recorder, rnd, node, reply, down, clients, step) -> dict[str, Any] | None:
    if reply is None:
        _drop(recorder, rnd, node, clients, f"no reply to {step}")
        return None
    if reply.has_error():
        _drop(recorder, rnd, node, clients, f"{step} failed: {reply.error.reason}")
        return None
    metrics = dict(reply.content["metrics"])
    client = int(metrics.pop("client"))
    clients[node] = client
    row: dict[str, Any] = {"round": rnd, "client": client}
    row.update(metrics)
    row["bytes_down"] = down
    row["bytes_up"] = payload_bytes(reply.content)
    return row


def _consistent(recorder, rnd, payloads, clients):
    """Keep the payloads whose names/shapes/dtypes match the majority; drop the others."""
    if not payloads:
        return payloads
    specs = {node: tuple(sorted((k, v[0], v[1]) for k, v in
                                ((k, (tuple(t.shape), str(t.dtype))) for k, t in p.items())))
             for node, p in payloads.items()}
    majority, _count = Counter(specs.values()).most_common(1)[0]
    kept = {}
    for node, payload in payloads.items():
        if specs[node] == majority:
            kept[node] = payload
        else:
            _drop(recorder, rnd, node, clients, "payload names/shapes differ from the other clients'")
    return kept


def _drop(recorder: RunRecorder, rnd: int, node: int, clients: dict[int, int], reason: str) -> None:
    who = clients.get(node, f"node {node}")
    log.warning("round %d: client %s dropped from the round: %s", rnd, who, reason)
    recorder.event(event="dropped", round=rnd, client=clients.get(node), node=node, reason=reason)


def _require(valid: int, needed: int, rnd: int, step: str) -> None:
    if valid < needed:
        raise FederationError(
            f"round {rnd} ({step}): only {valid} client(s) replied with a valid message, "
            f"{needed} required (federation.min_clients); see the dropped events in metrics.jsonl"
        )


def _wait_for_nodes(grid: Grid, n: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n:
            return nodes[:n]
        if time.monotonic() > deadline:
            raise FederationError(f"only {len(nodes)} of {n} client node(s) connected within {timeout_s:.0f} s")
        time.sleep(0.5)


def _version() -> str:
    from . import __version__

    return __version__


def _fmt_list(values, digits: int = 3) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


# --------------------------------------------------------------------------------------- client


@dataclass(frozen=True)
class ClientEnv:
    """What a client node knows: the run config, its partition, the workload and its state store."""

    cfg: RunConfig
    client: int
    workload: Workload
    protocol: FederatedProtocol
    store: MemoryStore | DiskStore
    train_encoded: list[tuple[list[int], list[int]]]
    diagnostics: bool = False  # simulation only: report fedavg_distance (needs every client's weights)

    @property
    def key(self) -> str:
        return "all" if self.client == ALL_SHARDS else f"client-{self.client}"


_memory_stores: dict[int, MemoryStore] = {}


def memory_store(run_id: int) -> MemoryStore:
    """The in-process state store of a run (shared by its in-process clients)."""
    return _memory_stores.setdefault(run_id, MemoryStore())


def release_memory_store(run_id: int) -> None:
    _memory_stores.pop(run_id, None)


def client_env(context: Context) -> ClientEnv:
    cfg = config_from_context(context)
    node_cfg = context.node_config
    if "partition-id" not in node_cfg:
        raise FederationError("node_config has no 'partition-id' (which data shard this client owns)")
    client = int(node_cfg["partition-id"])
    state_dir = node_cfg.get("state-dir")
    store = DiskStore(str(state_dir)) if state_dir else memory_store(context.run_id)
    workload, encoded = _client_data(cfg.to_json(), client)
    return ClientEnv(cfg=cfg, client=client, workload=workload, protocol=get_protocol(cfg), store=store,
                     train_encoded=encoded, diagnostics=bool(node_cfg.get("diagnostics", False)))


@lru_cache(maxsize=4)
def _initial_tensors(cfg_json: str) -> dict[str, torch.Tensor]:
    cfg = RunConfig.from_json(cfg_json)
    return trainable_tensors(initial_model(cfg, load_workload(cfg)))


@lru_cache(maxsize=16)
def _client_data(cfg_json: str, client: int):
    cfg = RunConfig.from_json(cfg_json)
    workload = load_workload(cfg)
    return workload, encode_pairs(workload.shard(client), workload.tokenizer, max_len=cfg.model.max_len)


def open_session(env: ClientEnv, rnd: int) -> tuple[ClientSession, torch.optim.Optimizer]:
    """Rebuild the client's model, optimizer and protocol state (round 1: the shared initial model)."""
    model = initial_model(env.cfg, env.workload)
    optimizer = new_optimizer(env.cfg, model)
    state = env.store.load(env.key)
    protocol_state: dict[str, torch.Tensor] = {}
    if state is not None:
        model.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        protocol_state = dict(state.protocol)
    session = ClientSession(cfg=env.cfg, client=env.client, round=rnd, model=model,
                            num_examples=len(env.train_encoded),
                            initial_tensors=lambda: _initial_tensors(env.cfg.to_json()),
                            protocol_state=protocol_state, diagnostics=env.diagnostics)
    return session, optimizer


def save_session(env: ClientEnv, session: ClientSession, optimizer: torch.optim.Optimizer) -> None:
    env.store.save(env.key, ClientState(model=session.model.state_dict(), optimizer=optimizer.state_dict(),
                                        protocol=session.protocol_state, rounds_done=session.round))


def _evaluate_into(env: ClientEnv, session: ClientSession, metrics: dict[str, Any]) -> None:
    started = time.perf_counter()
    metrics["test_loss"] = test_loss(env.cfg, session.model, env.workload)
    metrics["eval_s"] = time.perf_counter() - started


@client_app.train()
def client_train(msg: Message, context: Context) -> Message:
    """Local training; then the protocol's payload (exchange rounds) or a test evaluation."""
    env = client_env(context)
    config = msg.content["config"]
    rnd, exchange = int(config["round"]), bool(config["exchange"])
    session, optimizer = open_session(env, rnd)
    metrics: dict[str, Any] = {"client": env.client, "num_examples": session.num_examples}
    make_step = getattr(env.protocol, "local_step", None)  # optional: e.g. SAM, a regularised loss
    metrics.update(train_local(env.cfg, session.model, optimizer, env.train_encoded,
                               seed=derive_seed(env.cfg.seed, "train", env.client, rnd),
                               step=make_step(session) if make_step is not None else None))
    content = RecordDict()
    if exchange:
        if env.diagnostics:
            diagnostics.record_local_model(context.run_id, rnd, env.client, trainable_tensors(session.model),
                                           session.num_examples)
        payload, phases = env.protocol.client_payload(session)
        metrics.update(phases)
        content["payload"] = to_array_record(payload)
    else:
        _evaluate_into(env, session, metrics)
    save_session(env, session, optimizer)
    log.info("client %s · round %d · %d steps in %.1f s · train loss %.3f", env.client, rnd,
             metrics["steps"], metrics["train_s"], metrics["train_loss"])
    content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=msg)


@client_app.train("apply")
def client_apply(msg: Message, context: Context) -> Message:
    """Apply the server's aggregate (validated against what this client sent), then evaluate."""
    env = client_env(context)
    rnd = int(msg.content["config"]["round"])
    session, optimizer = open_session(env, rnd)
    expected = env.protocol.payload_spec(session)
    aggregate = from_array_record(msg.content["aggregate"], expected, what="aggregate from the server")
    metrics: dict[str, Any] = {"client": env.client}
    metrics.update(env.protocol.client_apply(session, aggregate))
    if env.diagnostics:
        metrics["fedavg_distance"] = diagnostics.fedavg_distance(context.run_id, rnd,
                                                                 trainable_tensors(session.model))
    _evaluate_into(env, session, metrics)
    save_session(env, session, optimizer)
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@client_app.evaluate()
def client_evaluate(msg: Message, context: Context) -> Message:
    """Final evaluation: test loss; decoded translations scored with BLEU, chrF, METEOR, BERTScore.

    Only the scores and three sample translations go back to the server. Where the node config
    names an ``output-dir`` (the in-process runtime sets ``<out>/client-<id>``; a deployed SuperNode
    may set its own), the client also writes every decoded test sentence to
    ``<output-dir>/translations.tsv`` itself, on its own machine: the full set of translations says
    more about a client's model than the scores do, so it never crosses the wire.
    """
    env = client_env(context)
    rnd = int(msg.content["config"]["round"])
    session, _optimizer = open_session(env, rnd)
    metrics: dict[str, Any] = {"client": env.client}
    _evaluate_into(env, session, metrics)
    scores, triples = translation_scores(env.cfg, session.model, env.workload)
    labels = {k: v for k, v in scores.items() if isinstance(v, str)}  # e.g. bertscore_model
    metrics.update({k: v for k, v in scores.items() if not isinstance(v, str)})
    # what the whole model costs under the same serializer (the size of a FedAvg payload)
    metrics["model_bytes"] = payload_bytes(
        RecordDict({"payload": to_array_record(trainable_tensors(session.model))})
    )
    output_dir = context.node_config.get("output-dir")
    if output_dir:
        labels["translations"] = str(write_translations(Path(str(output_dir)) / "translations.tsv", triples))
    sample = triples[:SAMPLE_TRANSLATIONS]
    content = RecordDict({"metrics": MetricRecord(metrics),
                          "data": ConfigRecord({**env.workload.describe(), "train_pairs": session.num_examples})})
    if labels:
        content["labels"] = ConfigRecord(labels)
    if sample:
        content["samples"] = ConfigRecord({
            "source": [s for s, _, _ in sample],
            "reference": [r for _, r, _ in sample],
            "hypothesis": [h for _, _, h in sample],
        })
    log.info("client %s · final test loss %.3f · BLEU %.2f · chrF %.2f%s%s", env.client, metrics["test_loss"],
             metrics["bleu"], metrics["chrf"],
             f" · METEOR {metrics['meteor']:.3f}" if "meteor" in metrics else "",
             f" · BERTScore F1 {metrics['bertscore_f1']:.3f}" if "bertscore_f1" in metrics else "")
    return Message(content, reply_to=msg)


def write_translations(path: Path, triples: list[tuple[str, str, str]]) -> Path:
    """``source<TAB>reference<TAB>hypothesis`` per decoded test sentence, after a header line
    (tabs and line breaks inside a sentence become spaces)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def clean(text: str) -> str:
        return " ".join(text.replace("\t", " ").splitlines())

    lines = ["source\treference\thypothesis"] + ["\t".join(clean(x) for x in t) for t in triples]
    tmp = path.with_suffix(".tsv.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


__all__ = ["server_app", "client_app", "run_federation", "FederationError", "CONFIG_KEY"]
