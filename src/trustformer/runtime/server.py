"""The server's run loop (Algorithm 1 of the paper, server side) for any protocol, in any runtime.

:func:`run_federation` reads in one screen: connect the clients, run every round, then every client evaluates its
model and the summary is written. :func:`run_round` is one round, top to bottom: select the participants, train
(a client that missed exchanges catches up first), aggregate, apply, record the round's lines, checkpoint. It runs
over the send/receive helper (``runtime/rounds.py``); a protocol with a round of its own (FedPC, Phong) replaces the
select-to-apply part by its ``run_round``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import flwr
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from ..config import RunConfig
from ..protocols import bare, get_protocol, server_summary, start_server
from ..protocols.interface.session import ServerStart
from ..recording.recorder import RunRecorder
from ..secure.channel import secure_link
from ..tasks.results import FINAL_METRICS, task_summary, under
from ..tasks.run import initial_tensors
from ..wire import EVALUATE, PlainLink
from .checkpoint import Checkpointer
from .client_nodes import Nodes, expected_nodes
from .replies import ReplyError, client_of, describe, drop
from .rounds import FederationError, RoundIO, Server

log = logging.getLogger(__name__)


def run_federation(grid: Grid, cfg: RunConfig, *, node_wait_s: float | None = None) -> dict[str, Any]:
    """Connect the clients, run every round of the protocol, evaluate, write ``summary.json``; returns it.

    Every round starts from the nodes connected now, in client order (a client that restarts rejoins,
    under a new node id too); each message's replies are awaited at most ``federation.round_timeout_s``
    (later ones: dropped from the round); every completed round ends with a checkpoint that
    ``runtime.resume`` continues from (``runtime/checkpoint.py``).
    """
    protocol, fed = get_protocol(cfg), cfg.federation
    nodes = Nodes(grid, cfg, node_wait_s)
    try:
        start_server(protocol, ServerStart(initial_tensors(cfg), nodes.expected))
    except ValueError as exc:
        raise FederationError(f"{protocol.name} refuses to start: {exc}") from exc
    recorder = RunRecorder(cfg.out, total_rounds=fed.rounds, tracker=open_tracker(cfg))
    checkpoints = Checkpointer(cfg, recorder, protocol)  # resumes the checkpointed run when runtime.resume
    payload_spec = lru_cache(maxsize=1)(lambda: protocol.expected_payload(initial_tensors(cfg)))
    link = secure_link(
        cfg,
        PlainLink(grid, nodes.timeout, cfg.federation.restart_wait_s),
        run_id=int(grid.run.run_id),
        recorder=recorder,
        drop=lambda r, n, why: drop(recorder, r, n, nodes.clients, why),
        clients=nodes.clients,
        payload_spec=payload_spec,
    )
    checkpoints.attach_link(link)
    server = Server(
        cfg=cfg,
        link=link,
        protocol=protocol,
        recorder=recorder,
        clients=nodes.clients,
        min_valid=nodes.needed,
        payload_spec=payload_spec,
        initial=lambda: initial_tensors(cfg),
        server_phases=cast("dict[str, float]", checkpoints.server_phases),  # a Counter of seconds (typeshed: int)
        synced=checkpoints.synced,
    )
    log.info(
        "strategy %s · %d client(s) · %d round(s) · output %s%s",
        protocol.name,
        len(nodes.connected()),
        fed.rounds,
        cfg.out,
        f" · resumed after round {checkpoints.completed}" if cfg.runtime.resume else "",
    )
    link.setup(nodes.connected(), nodes.needed)  # the secure channel: every client attests the aggregator
    checkpoints.start(nodes.clients)  # round 0: a run killed in round 1 resumes too
    rounds_run = checkpoints.completed
    for rnd in range(checkpoints.completed + 1, fed.rounds + 1):
        if not run_round(server, checkpoints, rnd, nodes.connected()):
            break
        rounds_run = rnd
    return finish_run(cfg, server, nodes, checkpoints, rounds_run)


def run_round(server: Server, checkpoints: Checkpointer, rnd: int, nodes: list[int]) -> bool:
    """Round ``rnd`` on the server, over the connected ``nodes`` (Algorithm 1 of the paper, server side); False
    when the protocol stops the run before it (e.g. its privacy budget is spent).

    1. select: the protocol's participants (``server().participants``), every client or
       ``federation.clients_per_round`` of them; the link's setup of the round (secure aggregation's keys);
    2. train: each participant trains (one that missed exchanges first adopts the protocol's catch-up model,
       ``catching_up()``) and, in an exchange round, replies with its payload;
    3. aggregate the valid payloads (``aggregate``, through every wrapper: defences, DP, coding);
    4. apply: the clients that replied (and, where the protocol says so, those left out) adopt the aggregate
       and evaluate;
    5. record the round's lines (``metrics.jsonl``) and 6. checkpoint.

    A protocol with a round of its own (FedPC, Phong) runs steps 1 to 4 in its ``run_round``.
    """
    protocol, fed = server.protocol, server.cfg.federation
    io = RoundIO(server, rnd, nodes, exchange=protocol.spec.exchanges and rnd % fed.agg_every == 0)
    hooks = protocol.server()
    # a round of the protocol's own is the innermost protocol's: the wrappers act on it through io.aggregate, which
    # goes through the outermost
    if not bare(protocol).run_round(io):
        chosen = hooks.participants(rnd, [io.client(n) for n in nodes], io.exchange)  # 1. select (by client id)
        if chosen.stop is not None:
            io.stop(chosen.stop)
            return False
        participants = io.prepare([n for n in nodes if io.client(n) in set(chosen.clients)], sampled=chosen.sampled)
        models = io.behind(participants, protocol.catching_up().catch_up)  # 2. train
        payloads = io.train(participants, payload=io.exchange, models=models)
        io.require("train")
        aggregate = None
        if io.exchange and not payloads:
            io.event(event="no_participants", reason="no client was sampled for this round")
        elif io.exchange:
            aggregate, phases = io.aggregate(payloads)  # 3. aggregate
            receivers = list(io.replied()) + (io.left_out() if protocol.spec.informs_left_out else [])
            io.apply(receivers, aggregate, phases)  # 4. apply
        if io.exchange:
            io.add_fields(hooks.exchange_done(rnd, aggregate))
    if io.stopped is not None:
        return False
    io.finish()  # 5. record
    server.recorder.round_done(rnd)
    checkpoints.round_done(rnd, server.clients)  # 6. checkpoint
    return True


def bytes_summary(records: list[dict[str, Any]], finals: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json["bytes"] beyond the totals: the bytes of every round (all clients), the trainable tensors' and the
    whole model's float32 bytes under the same serializer, and the mean message per client and round against each."""
    trainable = max((int(f.get("model_bytes", 0)) for f in finals), default=0)
    full = max((int(f.get("full_model_bytes", 0)) for f in finals), default=0) or trainable
    rounds = sorted({int(r["round"]) for r in records})
    per_round = [
        {
            "round": rnd,
            "up": sum(int(r.get("bytes_up", 0)) for r in records if r["round"] == rnd),
            "down": sum(int(r.get("bytes_down", 0)) for r in records if r["round"] == rnd),
        }
        for rnd in rounds
    ]
    up = sum(int(r.get("bytes_up", 0)) for r in records) / max(len(records), 1)
    down = sum(int(r.get("bytes_down", 0)) for r in records) / max(len(records), 1)
    return {
        "fedavg_model_bytes": trainable,  # the trainable tensors (LoRA: the adapters), as one FedAvg payload
        "full_model_bytes": full,  # every parameter, frozen ones included, in float32
        "per_round": per_round,
        "up_vs_full_model": round(up / full, 6) if full else None,
        "down_vs_full_model": round(down / full, 6) if full else None,
        "up_vs_trainable": round(up / trainable, 6) if trainable else None,
        "down_vs_trainable": round(down / trainable, 6) if trainable else None,
    }


def finish_run(
    cfg: RunConfig, server: Server, nodes: Nodes, checkpoints: Checkpointer, rounds_run: int
) -> dict[str, Any]:
    """The final evaluation of every connected client (:func:`final_evaluation`), then ``summary.json``."""
    recorder, protocol = server.recorder, server.protocol
    per_client, models = final_evaluation(cfg, server, nodes, rounds_run)
    order = sorted(per_client)
    extra: dict[str, Any] = {**server_summary(protocol), "round_time_s": checkpoints.round_s}
    if models:
        extra["models"] = {str(c): models[c] for c in order if c in models}
    if cfg.privacy.unit == "record":  # what each client's DP-SGD spent (tasks/record_dp.py)
        from ..tasks.dp_summary import summary as record_privacy

        extra["privacy"] = record_privacy(cfg, recorder.records, per_client)
    if checkpoints.resumed:
        extra["resumed_after_rounds"] = checkpoints.resumed
    secure = server.link.summary()
    if secure is not None:
        extra["secure"] = secure
    distances = {r["client"]: r["fedavg_distance"] for r in recorder.records if "fedavg_distance" in r}
    if distances:  # the last exchange's value per client (simulation-only diagnostic)
        extra["fedavg_distance"] = [distances.get(c) for c in order]
    summary = recorder.summary(
        strategy=protocol.name,
        preset=cfg.preset,
        rounds=rounds_run,
        clients=expected_nodes(cfg),
        seed=cfg.seed,
        config=cfg.to_dict(),
        client_ids=order,
        test_loss=[per_client[c]["test_loss"] for c in order],
        **task_summary(cfg.task, cfg.out, per_client, order),
        data={"partition": cfg.data.partition, "clients": {str(c): per_client[c]["data"] for c in order}},
        bytes=bytes_summary(recorder.records, [per_client[c] for c in order]),
        scored_by={str(c): per_client[c]["scored_by"] for c in order},
        server_time_s={k: round(v, 4) for k, v in server.server_phases.items()},
        versions={"trustformer": _version(), "flwr": flwr.__version__, "torch": torch.__version__},
        **extra,
    )
    first = FINAL_METRICS[cfg.task][0]
    log.info(
        "done in %.1f s · test loss %s · %s %s · wrote %s",
        summary["time_s"]["total"],
        _fmt_list(summary["test_loss"]),
        first.upper() if first == "bleu" else first,
        _fmt_list(summary[first], 2 if first == "bleu" else 4),
        Path(cfg.out) / "summary.json",
    )
    return summary


def final_evaluation(
    cfg: RunConfig, server: Server, nodes: Nodes, rnd: int
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Every client's final metrics and where its model was saved. First every client reports its test loss
    and its model's fingerprint; then one client per distinct model (``eval.decode_once``; otherwise every
    client) scores and saves it, and the clients holding the same model share its scores (``scored_by``)."""
    recorder, link = server.recorder, server.link

    def ask(targets: list[int], score: bool) -> dict[int, tuple[int, dict[str, Any]]]:
        got = {}
        config = ConfigRecord({"round": rnd, "score": score})
        for node, delivery in link.send(targets, EVALUATE, rnd, lambda _n: RecordDict({"config": config})).items():
            reply = delivery.reply
            why = (
                "no reply to evaluate"
                if reply is None
                else f"final evaluation failed: {reply.error.reason}"
                if reply.has_error()
                else None
            )
            try:
                if why is None:  # then there is a reply, without an error
                    got[node] = final_metrics(
                        cast(Message, reply), node, nodes.clients, cfg.federation.clients, cfg.task, scored=score
                    )
            except (KeyError, TypeError, ValueError) as exc:
                why = f"invalid reply to evaluate: {describe(exc)}"
            if why is not None:
                drop(recorder, rnd, node, nodes.clients, why)
        return got

    reported = ask(nodes.connected(), score=False)
    key_of = {
        node: basic["labels"]["fingerprint"] if cfg.eval.decode_once else str(node)
        for node, (_client, basic) in reported.items()
    }
    candidates: dict[str, list[int]] = {}  # model -> the nodes holding it, in client order
    for node in sorted(reported, key=lambda n: reported[n][0]):
        candidates.setdefault(key_of[node], []).append(node)
    scored: dict[str, dict[str, Any]] = {}
    while wave := [members.pop(0) for key, members in candidates.items() if key not in scored and members]:
        for node, (client, metrics) in ask(wave, score=True).items():  # a failed one: the next holder tries
            scored[key_of[node]] = {**metrics, "scored_by": client}
    per_client, models = {}, {}
    for node, (client, basic) in reported.items():
        if key_of[node] not in scored:
            continue  # no client holding this model could score it (each drop is in metrics.jsonl)
        result = scored[key_of[node]]  # the shared model's scores; the client's own ones (its data) on top
        per_client[client] = {**result, **{k: v for k, v in basic.items() if k not in ("labels", "samples")}}
        if "model" in result["labels"]:
            models[client] = under(cfg.out, result["labels"]["model"])
    return per_client, models


def open_tracker(cfg: RunConfig):
    """The experiment trackers of ``runtime.log`` (None: none asked for)."""
    if not cfg.runtime.log:
        return None
    from ..recording.tracking import Tracker

    return Tracker(cfg.out, cfg.runtime.log, cfg.to_dict(), run_name=Path(cfg.out).name)


def final_metrics(
    reply: Message, node: int, clients: dict[int, int], expected: int, task: str = "translation", *, scored: bool = True
) -> tuple[int, dict[str, Any]]:
    """A client's final evaluation (ValueError/KeyError/TypeError if malformed): ``test_loss`` and
    ``model_bytes`` must be numbers, with ``scored`` the task's scores (``FINAL_METRICS``) too."""
    record = reply.content["metrics"]
    if not isinstance(record, MetricRecord):
        raise ReplyError("the 'metrics' record is not a MetricRecord")
    metrics: dict[str, Any] = dict(record)
    client = client_of(metrics, node, clients, expected)
    for key in ("test_loss", *(FINAL_METRICS[task] if scored else ()), "model_bytes"):
        if isinstance(metrics.get(key), bool) or not isinstance(metrics.get(key), (int, float)):
            raise ReplyError(f"metric {key!r} must be a number, got {metrics.get(key)!r}")
    per_class = metrics.get("per_class_accuracy")
    if per_class is not None and (
        not isinstance(per_class, list) or not all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in per_class)
    ):
        raise ReplyError(f"metric 'per_class_accuracy' must be a list of accuracies in [0, 1], got {per_class!r}")
    samples: Mapping[str, Any] | None = reply.content.get("samples", None)
    metrics["samples"] = (
        [[str(x) for x in t] for t in zip(samples["source"], samples["reference"], samples["hypothesis"], strict=False)]
        if samples is not None
        else []
    )
    metrics["data"] = _data_record(reply.content["data"]) if "data" in reply.content else {}
    metrics["labels"] = (
        {k: str(v) for k, v in dict(reply.content["labels"]).items()} if "labels" in reply.content else {}
    )
    metrics["labels"].setdefault("fingerprint", f"node-{node}")
    return client, metrics


def _data_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A client's data description, with its per-domain counts as ``{domain: pairs}`` dicts."""
    data = dict(record)
    for prefix in ("", "test_"):
        names, counts = data.pop(f"{prefix}domain_names", None), data.pop(f"{prefix}domain_counts", None)
        if names is not None and counts is not None:
            data[f"{prefix}domains"] = {str(n): int(c) for n, c in zip(names, counts, strict=True)}
    return data


def _version() -> str:
    from .. import __version__

    return __version__


def _fmt_list(values, digits: int = 3) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


__all__ = ["FederationError", "final_metrics", "run_federation"]
