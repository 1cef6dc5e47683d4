"""The Flower ``ServerApp`` and ``ClientApp`` that run every protocol.

Written once on Flower's Message API; the in-process runtime (``trustformer.runtime.inprocess``)
and a multi-process Flower deployment run these very objects.

One round (``federation.rounds`` of them; the paper's epochs):

1. ``train`` → every client: load its state, train locally; if this round exchanges
   (``round % agg_every == 0``) reply with the protocol's payload, else evaluate and reply.
2. The server validates every reply (a metrics record with the right types, the client it claims
   to be, the round, ``num_examples`` a positive integer ≤ ``federation.max_examples``) and every
   payload (the names, shapes and dtypes the configuration and protocol give, finite values), drops
   the clients whose reply is invalid — or whose contribution makes the aggregation raise — with a
   ``dropped`` event, and aggregates the rest while ``federation.min_clients`` allows.
3. ``train.apply`` → every valid client: apply the aggregate, evaluate on the shared test set.

After the last round, ``evaluate`` → every client: test loss and the task's final metrics
(translation: BLEU, chrF, METEOR, BERTScore F1, and each client writes its own ``translations.tsv``
where its node config says; image classification: accuracy and per-class accuracy; segmentation:
Dice, IoU, pixel accuracy, and each client draws ``masks.png``). The task (``config.task``,
``tasks/run.py``) supplies the data, model, optimizer, local training and scores; the round loop and
the protocols only move tensors.
The server writes ``metrics.jsonl`` and ``summary.json`` to the run's output folder.

A protocol may add optional hooks (``protocols/base.py``): its own local training step, a check
before round 1 (a privacy budget), per-round client sampling or an early stop, per-round fields
(ε spent) and extra summary fields. Clients not sampled in a round only receive the aggregate.

``secure.mode`` (``trustformer.secure.exchange``) changes how payloads travel: sealed after the
aggregator's attestation before round 1 (``tee``), masked by secure aggregation (``secagg``), or both.
"""

from __future__ import annotations

import logging
import os
import sys
import time
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
from .metrics import RunRecorder
from .protocols import ClientSession, FederatedProtocol, get_protocol
from .protocols.base import trainable_tensors
from .runtime import diagnostics
from .runtime.checkpoint import Checkpointer, run_key
from .runtime.store import ROUND_END, TRAINED, ClientState, DiskStore, MemoryStore
from .secure.exchange import ClientExchange, ServerExchange
from .tasks.run import FINAL_METRICS, RunTask, load_task
from .wire import PayloadError, payload_bytes, spec_of, to_array_record
from .workload import ALL_SHARDS, derive_seed

log = logging.getLogger(__name__)

CONFIG_KEY = "trustformer-config"  # run_config key holding the resolved RunConfig as JSON
TRAIN, APPLY, EVALUATE, QUERY = "train", "train.apply", "evaluate", "query"
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
    cfg = config_from_context(context)
    process_setup(cfg, log_file=Path(cfg.out) / "server.log")
    run_federation(grid, cfg)


DEPLOYED_PROCESSES = ("flwr-serverapp", "flwr-clientapp")  # Flower starts one per run / message


def process_setup(cfg: RunConfig, log_file: Path | None = None) -> None:
    """Torch threads from ``runtime.threads``. In a process Flower's deployment runtime started, also
    the progress lines: to stderr (a SuperNode's log) and ``log_file`` (the ServerApp's ``server.log``,
    since Flower keeps a ServerApp's own output for ``flwr log``)."""
    threads = cfg.runtime.threads or os.cpu_count() or 1
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    root = logging.getLogger("trustformer")
    if Path(sys.argv[0]).name not in DEPLOYED_PROCESSES or root.handlers or not cfg.runtime.progress:
        return
    formatter = logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def expected_nodes(cfg: RunConfig) -> int:
    return 1 if cfg.federation.strategy == "centralized" else cfg.federation.clients


def run_federation(grid: Grid, cfg: RunConfig, *, node_wait_s: float | None = None) -> dict[str, Any]:
    """The server's round loop (Algorithm 1 of the paper, server side) for any protocol.

    Every round starts from the nodes connected now, in client order (a client that restarts
    rejoins, under a new node id too); each message's replies are awaited at most
    ``federation.round_timeout_s`` (later ones: dropped from the round); every completed round
    ends with a checkpoint that ``runtime.resume`` continues from (``runtime/checkpoint.py``).
    """
    protocol = get_protocol(cfg)
    fed = cfg.federation
    timeout = fed.round_timeout_s or None
    wait_s = fed.node_wait_s if node_wait_s is None else node_wait_s
    expected = expected_nodes(cfg)
    min_valid = min(fed.min_clients or expected, expected)
    clients: dict[int, int] = {}  # node id -> client (partition) id, from each node's answer to a query
    retired: set[int] = set()  # node ids whose client reconnected under another node id
    node_ids = _connected_clients(grid, clients, retired, want=expected, need=min_valid, wait_s=wait_s,
                                  timeout=timeout)
    begin = getattr(protocol, "server_begin", None)  # optional hooks: see protocols/base.py
    if begin is not None:
        try:
            begin(expected)
        except ValueError as exc:
            raise FederationError(f"{protocol.name} refuses to start: {exc}") from exc
    choose = getattr(protocol, "server_round", None)
    round_done = getattr(protocol, "server_round_done", None)
    check_payload = getattr(protocol, "check_payload", None)
    payload_spec: dict | None = None  # what every client's payload must be, from the configuration (lazily)
    recorder = RunRecorder(cfg.out, total_rounds=fed.rounds)
    checkpoints = Checkpointer(cfg, recorder, protocol)  # resumes the checkpointed run when runtime.resume
    log.info(
        "strategy %s · %d client(s) · %d round(s) · output %s%s", protocol.name, len(node_ids), fed.rounds, cfg.out,
        f" · resumed after round {checkpoints.completed}" if cfg.runtime.resume else "",
    )
    server_phases = checkpoints.server_phases
    rounds_run = checkpoints.completed
    secure = ServerExchange(cfg, grid, recorder, lambda *args: _send(*args, timeout=timeout),
                            lambda r, n, why: _drop(recorder, r, n, clients, why), clients)
    secure.setup(node_ids, min_valid)  # secure.mode tee: every client attests the aggregator before round 1

    for rnd in range(checkpoints.completed + 1, fed.rounds + 1):
        if rnd > checkpoints.completed + 1:  # who is connected now (a restarted client rejoins)
            node_ids = _connected_clients(grid, clients, retired, want=min_valid, need=min_valid, wait_s=wait_s,
                                          timeout=timeout)
        exchange = protocol.exchanges and rnd % fed.agg_every == 0
        participants = list(node_ids)
        needed = min_valid
        if exchange and choose is not None:
            chosen = choose(rnd, [clients[n] for n in node_ids])  # sampled by client id: the same in any runtime
            if chosen is None:  # the protocol ends the run here (e.g. its privacy budget is spent)
                reason = getattr(protocol, "stop_reason", lambda: "stopped by the protocol")()
                log.warning("stopping before round %d: %s", rnd, reason)
                recorder.event(event="stopped", round=rnd, reason=reason)
                break
            participants = [n for n in node_ids if clients[n] in set(chosen)]
            needed = min(min_valid, len(participants))
        rounds_run = rnd
        round_fields: dict[str, Any] = {}
        train_cfg = ConfigRecord({"round": rnd, "exchange": exchange})
        participants = secure.prepare_round(rnd, participants, exchange)  # secagg: keys and shares steps
        replies = _send(grid, participants, TRAIN, rnd,
                        lambda n: secure.train_content(n, rnd, exchange, RecordDict({"config": train_cfg})),
                        timeout=timeout)
        rows: dict[int, dict[str, Any]] = {}
        payloads: dict[int, dict[str, torch.Tensor]] = {}
        for node, (reply, down) in replies.items():
            row = _reply_row(recorder, rnd, node, reply, down, clients, "train", max_examples=fed.max_examples,
                             expected=fed.clients)
            if row is None:
                continue
            rows[node] = row
            if exchange:
                try:
                    payload = secure.read_payload(node, rnd, reply, row)
                    if cfg.secure.mode in ("none", "tee"):  # secagg: the masked vector's length is checked
                        if payload_spec is None:
                            payload_spec = expected_payload_spec(cfg, protocol)
                        _check_spec(payload, payload_spec)
                    if check_payload is not None:
                        check_payload(payload)
                    payloads[node] = payload
                except FederationError:
                    raise
                except Exception as exc:  # anything a client's reply makes us raise drops that client
                    _drop(recorder, rnd, node, clients, f"invalid payload: {_describe(exc)}")
                    rows.pop(node)
        if exchange:
            rows = {n: rows[n] for n in payloads}
            _require(len(rows), needed, rnd, "train")
            if rows:
                aggregate, phases = _aggregate(secure, protocol, recorder, rnd, payloads, rows, clients, needed)
                server_phases.update(phases)
                # with client sampling, every other client (not sampled, or dropped) adopts the aggregate too
                others = [n for n in node_ids if n not in rows] if choose is not None else []
                applied = _send(grid, list(rows) + others, APPLY, rnd, secure.apply_content(rnd, aggregate),
                                timeout=timeout)
                for node, (reply, down) in applied.items():
                    apply_row = _reply_row(recorder, rnd, node, reply, down, clients, "apply",
                                           max_examples=fed.max_examples, expected=fed.clients)
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
            secure.finish_row(rnd, node, row)
            if protocol.name == "trustformer":
                row["beta"] = fed.beta
            recorder.record(row)
        recorder.round_done(rnd)
        checkpoints.round_done(rnd, clients)

    node_ids = _connected_clients(grid, clients, retired, want=min_valid, need=min_valid, wait_s=wait_s,
                                  timeout=timeout)
    final = _send(grid, node_ids, EVALUATE, rounds_run,
                  lambda _n: RecordDict({"config": ConfigRecord({"round": rounds_run})}), timeout=timeout)
    per_client: dict[int, dict[str, Any]] = {}
    for node, (reply, _down) in final.items():
        if reply is None:
            _drop(recorder, rounds_run, node, clients, "no reply to evaluate")
            continue
        if reply.has_error():
            _drop(recorder, rounds_run, node, clients, f"final evaluation failed: {reply.error.reason}")
            continue
        try:
            client, metrics = _final_metrics(reply, node, clients, fed.clients, cfg.task)
        except (KeyError, TypeError, ValueError) as exc:
            _drop(recorder, rounds_run, node, clients, f"invalid reply to evaluate: {_describe(exc)}")
            continue
        per_client[client] = metrics
    order = sorted(per_client)
    extra: dict[str, Any] = {}
    if protocol.name == "trustformer":
        extra["beta"] = fed.beta
    summary_hook = getattr(protocol, "server_summary", None)
    if summary_hook is not None:
        extra.update(summary_hook())
    extra["round_time_s"] = checkpoints.round_s  # wall time of each round
    if checkpoints.resumed:
        extra["resumed_after_rounds"] = checkpoints.resumed
    if cfg.secure.mode != "none":
        extra["secure"] = secure.summary()
    distances = {r["client"]: r["fedavg_distance"] for r in recorder.records if "fedavg_distance" in r}
    if distances:  # the last exchange's value per client (simulation-only diagnostic)
        extra["fedavg_distance"] = [distances.get(c) for c in order]
    model_bytes = max((int(per_client[c]["model_bytes"]) for c in order), default=0)
    summary = recorder.summary(
        strategy=protocol.name,
        preset=cfg.preset,
        rounds=rounds_run,
        clients=expected,
        seed=cfg.seed,
        config=cfg.to_dict(),
        client_ids=order,
        test_loss=[per_client[c]["test_loss"] for c in order],
        **_task_summary(cfg, per_client, order),
        data={"partition": cfg.data.partition, "clients": {str(c): per_client[c]["data"] for c in order}},
        bytes={"fedavg_model_bytes": model_bytes},
        server_time_s={k: round(v, 4) for k, v in server_phases.items()},
        versions={"trustformer": _version(), "flwr": flwr.__version__, "torch": torch.__version__},
        **extra,
    )
    first = FINAL_METRICS[cfg.task][0]
    log.info(
        "done in %.1f s · test loss %s · %s %s · wrote %s",
        summary["time_s"]["total"], _fmt_list(summary["test_loss"]), first.upper() if first == "bleu" else first,
        _fmt_list(summary[first], 2 if first == "bleu" else 4), Path(cfg.out) / "summary.json",
    )
    return summary


def _task_summary(cfg: RunConfig, per_client: dict[int, dict[str, Any]], order: list[int]) -> dict[str, Any]:
    """The task's fields of ``summary.json``, each a list over clients in ``client_ids`` order (or a
    dict by client). Translation: ``bleu``, ``chrf``, ``meteor``, ``bertscore_f1``, ``bertscore_model``,
    ``translations``, ``samples``. Image classification: ``accuracy`` and ``per_class_accuracy``
    (client → class → accuracy). Segmentation: ``dice``, ``iou``, ``pixel_accuracy``, their per-image
    means, and ``figures`` (``masks``: client → the figure of predicted beside true masks it drew)."""
    out: dict[str, Any] = {"task": cfg.task}
    if cfg.task == "translation":
        out.update(
            bleu=[per_client[c]["bleu"] for c in order],
            chrf=[per_client[c]["chrf"] for c in order],
            meteor=[per_client[c].get("meteor") for c in order],
            bertscore_f1=[per_client[c].get("bertscore_f1") for c in order],
            bertscore_model=next((per_client[c]["labels"]["bertscore_model"] for c in order
                                  if "bertscore_model" in per_client[c]["labels"]), None),
            translations={str(c): _under(cfg.out, per_client[c]["labels"]["translations"]) for c in order
                          if "translations" in per_client[c]["labels"]},
            samples={str(c): per_client[c]["samples"] for c in order},
        )
        return out
    for key in FINAL_METRICS[cfg.task]:
        out[key] = [per_client[c][key] for c in order]
    if cfg.task == "image-classification":
        out["per_class_accuracy"] = {
            str(c): dict(zip(per_client[c]["data"].get("classes", []), per_client[c].get("per_class_accuracy", [])))
            for c in order}
    else:
        for key in ("dice_per_image", "iou_per_image"):
            out[key] = [per_client[c].get(key) for c in order]
        out["figures"] = {"masks": {str(c): _under(cfg.out, per_client[c]["labels"]["masks"]) for c in order
                                    if "masks" in per_client[c]["labels"]}}
    return out


def _data_record(record: ConfigRecord) -> dict[str, Any]:
    """A client's data description, with its per-domain counts as ``{domain: pairs}`` dicts."""
    data = dict(record)
    for prefix in ("", "test_"):
        names, counts = data.pop(f"{prefix}domain_names", None), data.pop(f"{prefix}domain_counts", None)
        if names is not None and counts is not None:
            data[f"{prefix}domains"] = {str(n): int(c) for n, c in zip(names, counts)}
    return data


def _under(out: str, path: str) -> str:
    """``path`` relative to the run's output folder when it lies inside it (as written by in-process clients)."""
    try:
        return str(Path(path).resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return path


def _send(grid: Grid, node_ids, message_type: str, rnd: int, make_content, *,
          timeout: float | None = None) -> dict[int, tuple[Message | None, int]]:
    """Send one message per node; return each node's reply (None: none within ``timeout`` seconds)
    with the bytes sent down to it."""
    messages, down = [], {}
    for node in node_ids:
        content = make_content(node)
        down[node] = payload_bytes(content)
        messages.append(Message(content, node, message_type, group_id=str(rnd), ttl=_ttl(timeout)))
    replies = _exchange(grid, messages, timeout)
    out = {}
    for node in node_ids:
        if node in replies:
            out[node] = (replies[node], down[node])
        else:
            out[node] = (None, down[node])
    return out


class ReplyError(ValueError):
    """A client's reply is malformed: it is dropped from the round, the run goes on."""


# metrics keys the server writes itself: a client's reply may not set them
SERVER_KEYS = frozenset({"event", "node", "reason", "bytes_up", "bytes_down", "exchanged", "sampled", "epsilon",
                         "beta"})


def _client_of(metrics, node: int, clients: dict[int, int], expected: int) -> int:
    """The client id a reply names, which must be a valid one and the one this node is known as."""
    from .workload import ALL_SHARDS

    client = metrics.get("client") if hasattr(metrics, "get") else None
    if isinstance(client, bool) or not isinstance(client, int):
        raise ReplyError(f"'client' must be an integer, got {client!r}")
    if not (0 <= client < expected or client == ALL_SHARDS):
        raise ReplyError(f"'client' = {client} is not a client of this run")
    if clients.get(node, client) != client:
        raise ReplyError(f"node {node} is client {clients[node]} but its reply says client {client}")
    return client


def validate_reply(reply: Message, rnd: int, node: int, clients: dict[int, int], step: str, *, expected: int,
                   max_examples: int) -> tuple[int, dict[str, float | int]]:
    """The client id and metrics of a ``train`` or ``train.apply`` reply, or a ReplyError saying what is wrong:
    a ``metrics`` MetricRecord of scalar numbers, the client this node is, the round of the message, and
    for ``train`` a ``num_examples`` that is an integer in [1, ``federation.max_examples``]."""
    if "metrics" not in reply.content:
        raise ReplyError(f"the reply to {step} has no 'metrics' record")
    record = reply.content["metrics"]
    if not isinstance(record, MetricRecord):
        raise ReplyError(f"the 'metrics' record of the reply to {step} is a {type(record).__name__}, "
                         "not a MetricRecord")
    metrics = dict(record)
    client = _client_of(metrics, node, clients, expected)
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReplyError(f"metric {key!r} must be a number, got {type(value).__name__}")
        if key in SERVER_KEYS:
            raise ReplyError(f"metric {key!r} is the server's to write")
    if metrics.get("round") != rnd:
        raise ReplyError(f"the reply is for round {metrics.get('round')!r}, not round {rnd} (replayed or stale)")
    if step == "train":
        n = metrics.get("num_examples")
        if not isinstance(n, int) or not 1 <= n <= max_examples:
            raise ReplyError(f"num_examples = {n!r} must be an integer in [1, {max_examples}] "
                             "(federation.max_examples)")
    return client, metrics


def _reply_row(recorder, rnd, node, reply, down, clients, step, *, max_examples: int,
               expected: int) -> dict[str, Any] | None:
    if reply is None:
        _drop(recorder, rnd, node, clients, f"no reply to {step}")
        return None
    if reply.has_error():
        _drop(recorder, rnd, node, clients, f"{step} failed: {reply.error.reason}")
        return None
    try:
        client, metrics = validate_reply(reply, rnd, node, clients, step, expected=expected,
                                         max_examples=max_examples)
    except ReplyError as exc:
        _drop(recorder, rnd, node, clients, f"invalid reply to {step}: {exc}")
        return None
    clients[node] = client
    row: dict[str, Any] = dict(metrics)
    row.update(round=rnd, client=client, bytes_down=down, bytes_up=payload_bytes(reply.content))
    return row


def _final_metrics(reply: Message, node: int, clients: dict[int, int], expected: int,
                   task: str = "translation") -> tuple[int, dict[str, Any]]:
    """The final evaluation's scores, samples and labels of one client (ValueError/KeyError/TypeError if
    malformed): ``test_loss``, ``model_bytes`` and the task's scores (``FINAL_METRICS``) must be numbers."""
    record = reply.content["metrics"]
    if not isinstance(record, MetricRecord):
        raise ReplyError("the 'metrics' record is not a MetricRecord")
    metrics: dict[str, Any] = dict(record)
    client = _client_of(metrics, node, clients, expected)
    for key in ("test_loss", *FINAL_METRICS[task], "model_bytes"):
        if isinstance(metrics.get(key), bool) or not isinstance(metrics.get(key), (int, float)):
            raise ReplyError(f"metric {key!r} must be a number, got {metrics.get(key)!r}")
    per_class = metrics.get("per_class_accuracy")
    if per_class is not None and (not isinstance(per_class, list)
                                  or not all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in per_class)):
        raise ReplyError(f"metric 'per_class_accuracy' must be a list of accuracies in [0, 1], got {per_class!r}")
    samples = reply.content["samples"] if "samples" in reply.content else None
    metrics["samples"] = (
        [[str(x) for x in t] for t in zip(samples["source"], samples["reference"], samples["hypothesis"])]
        if samples is not None else []
    )
    metrics["data"] = _data_record(reply.content["data"]) if "data" in reply.content else {}
    metrics["labels"] = {k: str(v) for k, v in dict(reply.content["labels"]).items()} \
        if "labels" in reply.content else {}
    return client, metrics


def expected_payload_spec(cfg: RunConfig, protocol: FederatedProtocol | None = None
                          ) -> dict[str, tuple[tuple[int, ...], str]]:
    """The names/shapes/dtypes every client's payload must have, from the configuration and the protocol
    (the identical initial model gives the shapes): never from what the clients send."""
    protocol = protocol if protocol is not None else get_protocol(cfg)
    return protocol.expected_payload(_initial_tensors(cfg.to_json()))


def _check_spec(payload: dict[str, torch.Tensor], expected: dict[str, tuple[tuple[int, ...], str]]) -> None:
    got = spec_of(payload)
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        extra = sorted(set(got) - set(expected))[:3]
        wrong = [f"{n} {got[n][0]} {got[n][1]} (expected {expected[n][0]} {expected[n][1]})"
                 for n in sorted(set(got) & set(expected)) if got[n] != expected[n]][:3]
        raise PayloadError("payload names/shapes/dtypes differ from those the configuration gives: "
                           + "; ".join(x for x in (f"missing {missing}" if missing else "",
                                                   f"unexpected {extra}" if extra else "",
                                                   f"wrong {wrong}" if wrong else "") if x))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if isinstance(exc, (PayloadError, ReplyError)) else f"{type(exc).__name__}: {text}"


def _aggregate(secure, protocol, recorder, rnd, payloads, rows, clients, needed):
    """The round's aggregate. When the aggregation raises, each contribution is aggregated on its own
    to find the ones that make it fail: those clients are dropped (a ``dropped`` event each) and the
    others aggregated, while ``federation.min_clients`` allows."""
    try:
        return secure.aggregate(protocol, rnd, payloads, rows)
    except FederationError:
        raise
    except Exception as exc:
        first = exc
    culprits = {}
    for node in list(payloads):
        try:
            secure.aggregate(protocol, rnd, {node: payloads[node]}, {node: rows[node]})
        except FederationError:
            raise
        except Exception as exc:  # this client's contribution alone makes the aggregation fail
            culprits[node] = exc
    if not culprits:
        raise FederationError(f"round {rnd}: the aggregation failed with every client's contribution valid on its "
                              f"own: {_describe(first)}") from first
    for node, exc in culprits.items():
        _drop(recorder, rnd, node, clients, f"aggregation failed on its contribution: {_describe(exc)}")
        payloads.pop(node)
        rows.pop(node)
    _require(len(rows), needed, rnd, "aggregate")
    return secure.aggregate(protocol, rnd, payloads, rows)


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


POLL_S = 0.5  # seconds between two pulls of the replies still awaited
TTL_MARGIN_S = 10.0  # a message outlives the wait for its reply by this much (the SuperLink then drops it)


def _ttl(timeout: float | None) -> float | None:
    """Message lifetime for a wait of ``timeout`` seconds (None: Flower's default)."""
    return None if timeout is None else timeout + TTL_MARGIN_S


def _exchange(grid: Grid, messages: list[Message], timeout: float | None) -> dict[int, Message]:
    """Push the messages, then pull their replies until all came or ``timeout`` seconds passed."""
    if not messages:
        return {}
    ids = list(grid.push_messages(messages))
    node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages) if mid}
    pending = set(node_of)
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: dict[int, Message] = {}
    while pending:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid in pending:
                pending.discard(mid)
                replies[node_of[mid]] = reply
        if not pending or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(POLL_S)
    return replies


def _identify(grid: Grid, nodes: list[int], clients: dict[int, int], retired: set[int],
              timeout: float | None) -> list[int]:
    """Ask the nodes not met yet which client they are (a ``query``); return the nodes of known
    clients in client order. A client answering from a new node id retires its old one."""
    unknown = [n for n in nodes if n not in clients and n not in retired]
    replies = _exchange(grid, [Message(RecordDict({"config": ConfigRecord({"round": 0})}), n, QUERY,
                                       group_id="identify", ttl=_ttl(timeout)) for n in unknown], timeout)
    for node in unknown:
        reply = replies.get(node)
        if reply is None or reply.has_error():
            log.warning("node %d did not say which client it is (%s); left out for now", node,
                        "no reply" if reply is None else reply.error.reason)
            continue
        try:
            record = reply.content["metrics"]
            client = record["client"] if isinstance(record, MetricRecord) else None
            if isinstance(client, bool) or not isinstance(client, int):
                raise ReplyError(f"'client' must be an integer, got {client!r}")
        except (KeyError, ReplyError) as exc:
            log.warning("node %d did not say which client it is (malformed reply: %s); left out for now", node, exc)
            continue
        for old in [n for n, c in clients.items() if c == client]:
            del clients[old]
            retired.add(old)
            log.info("client %d reconnected as node %d (was node %d)", client, node, old)
        clients[node] = client
    return sorted((n for n in nodes if n in clients), key=lambda n: clients[n])


def _connected_clients(grid: Grid, clients: dict[int, int], retired: set[int], *, want: int, need: int,
                       wait_s: float, timeout: float | None) -> list[int]:
    """The connected clients' node ids in client order: waits up to ``wait_s`` seconds for ``want``
    of them; fewer than ``need`` after that is a FederationError."""
    started = time.monotonic()
    deadline = started + wait_s
    shown: tuple[int, ...] | None = None
    while True:
        nodes = _identify(grid, sorted(grid.get_node_ids()), clients, retired, timeout)
        if len(nodes) >= want:
            return nodes
        connected = tuple(sorted(clients[n] for n in nodes))
        if connected != shown:  # who is connected so far, each time it changes
            log.info("waiting for client nodes: %d of %d connected (client%s %s) · %.0f s of %.0f s "
                     "(federation.node_wait_s)", len(nodes), want, "" if len(nodes) == 1 else "s",
                     ", ".join(map(str, connected)) or "none", time.monotonic() - started, wait_s)
            shown = connected
        if time.monotonic() > deadline:
            if len(nodes) >= need:
                return nodes
            raise FederationError(
                f"only {len(nodes)} of {want} client node(s) connected within {wait_s:.0f} s "
                f"(federation.node_wait_s); at least {need} required (federation.min_clients)"
            )
        time.sleep(POLL_S)


def _version() -> str:
    from . import __version__

    return __version__


def _fmt_list(values, digits: int = 3) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


# --------------------------------------------------------------------------------------- client


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
        return {"load_s": self.load_s, "startup_s": self.startup_s,
                "deliver_s": max(0.0, started_at - msg.metadata.created_at)}

    @property
    def key(self) -> str:
        return "all" if self.client == ALL_SHARDS else f"client-{self.client}"


_memory_stores: dict[int, MemoryStore] = {}


def memory_store(run_id: int) -> MemoryStore:
    """The in-process state store of a run (shared by its in-process clients)."""
    return _memory_stores.setdefault(run_id, MemoryStore())


def release_memory_store(run_id: int) -> None:
    _memory_stores.pop(run_id, None)


def client_id(context: Context) -> int:
    """The client (data partition) this node is, from its node config's ``partition-id``."""
    if "partition-id" not in context.node_config:
        raise FederationError("node_config has no 'partition-id' (which data shard this client owns)")
    return int(context.node_config["partition-id"])


def client_env(context: Context) -> ClientEnv:
    """The client's view of the run. Node config: ``partition-id``; optional ``state-dir`` (state on
    disk, under ``<state-dir>/<run key>/``), ``train-file`` (a TSV of the client's own training pairs
    instead of its shard of the configured corpus), ``output-dir`` (translations), ``diagnostics``
    (simulation only)."""
    started = time.perf_counter()
    cfg = config_from_context(context)
    process_setup(cfg)
    node_cfg = context.node_config
    client = client_id(context)
    state_dir = node_cfg.get("state-dir")
    store = DiskStore(Path(str(state_dir)) / run_key(cfg)) if state_dir else memory_store(context.run_id)
    task, shard = _client_data(cfg.to_json(), client, str(node_cfg.get("train-file", "")))
    return ClientEnv(cfg=cfg, client=client, task=task, protocol=get_protocol(cfg), store=store, shard=shard,
                     diagnostics=bool(node_cfg.get("diagnostics", False)),
                     load_s=time.perf_counter() - started, startup_s=_process_age_s(started), created=started)


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


@lru_cache(maxsize=4)
def _initial_tensors(cfg_json: str) -> dict[str, torch.Tensor]:
    cfg = RunConfig.from_json(cfg_json)
    return trainable_tensors(load_task(cfg).initial_model())


@lru_cache(maxsize=16)
def _client_data(cfg_json: str, client: int, train_file: str = ""):
    """The run's task and the client's training shard (translation: its encoded pairs, or those of
    its own ``train_file``; see the task's ``shard``)."""
    task = load_task(RunConfig.from_json(cfg_json))
    return task, task.shard(client, train_file)


class SavedOptimizerState:
    """An optimizer's saved state, passed through unchanged by a message that does not train (building
    a torch optimizer imports torch._dynamo: about 1.7 s in every fresh ClientApp process)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def open_session(env: ClientEnv, rnd: int, upto: tuple[int, int], *, train: bool = True
                 ) -> tuple[ClientSession, torch.optim.Optimizer | SavedOptimizerState]:
    """Rebuild the client's model, optimizer and protocol state as saved at or before the point ``upto``
    (round, TRAINED | ROUND_END) of the round loop; none saved yet: the shared initial model.
    ``train=False``: the optimizer's saved state is kept as it is, without building an optimizer."""
    model = env.task.initial_model()
    state = env.store.load(env.key, upto=upto)
    optimizer: torch.optim.Optimizer | SavedOptimizerState
    if train or state is None:
        optimizer = env.task.new_optimizer(model)
    else:
        optimizer = SavedOptimizerState(state.optimizer)
    protocol_state: dict[str, torch.Tensor] = {}
    if state is not None:
        model.load_state_dict(state.model)
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer.load_state_dict(state.optimizer)
        protocol_state = dict(state.protocol)
    session = ClientSession(cfg=env.cfg, client=env.client, round=rnd, model=model,
                            num_examples=len(env.shard), label_smoothing=env.task.label_smoothing,
                            initial_tensors=lambda: _initial_tensors(env.cfg.to_json()),
                            protocol_state=protocol_state, diagnostics=env.diagnostics)
    return session, optimizer


def save_session(env: ClientEnv, session: ClientSession, optimizer: torch.optim.Optimizer | SavedOptimizerState,
                 at: int) -> None:
    """Save the client's state as snapshot (session.round, ``at``): TRAINED or ROUND_END."""
    env.store.save(env.key, ClientState(model=session.model.state_dict(), optimizer=optimizer.state_dict(),
                                        protocol=session.protocol_state, rounds_done=session.round),
                   at=(session.round, at))


def _evaluate_into(env: ClientEnv, session: ClientSession, metrics: dict[str, Any]) -> None:
    started = time.perf_counter()
    metrics["test_loss"] = env.task.test_loss(session.model)
    metrics["eval_s"] = time.perf_counter() - started


@client_app.train()
def client_train(msg: Message, context: Context) -> Message:
    """Local training; then the protocol's payload (exchange rounds) or a test evaluation."""
    env = client_env(context)
    config = msg.content["config"]
    rnd, exchange = int(config["round"]), bool(config["exchange"])
    secure = ClientExchange(env, context)
    secure.require_session()  # secure.mode tee: nothing is trained or sent without an attested aggregator
    session, optimizer = open_session(env, rnd, upto=(rnd - 1, ROUND_END))
    metrics: dict[str, Any] = {"client": env.client, "round": rnd, "num_examples": session.num_examples,
                               **env.timings(msg)}
    make_step = getattr(env.protocol, "local_step", None)  # optional: e.g. SAM, a regularised loss
    metrics.update(env.task.train_local(session.model, optimizer, env.shard,
                                        seed=derive_seed(env.cfg.seed, "train", env.client, rnd),
                                        step=make_step(session) if make_step is not None else None))
    content = RecordDict()
    if exchange:
        if env.diagnostics:
            diagnostics.record_local_model(context.run_id, rnd, env.client, trainable_tensors(session.model),
                                           session.num_examples)
        payload, phases = env.protocol.client_payload(session)
        payload = {name: tensor.cpu() for name, tensor in payload.items()}  # the wire is CPU memory
        metrics.update(phases)
        secure.put_payload(content, msg, rnd, payload, session.num_examples, metrics)
    else:
        _evaluate_into(env, session, metrics)
    save_session(env, session, optimizer, TRAINED if exchange else ROUND_END)
    rate, unit = ((metrics["tokens_per_s"], "tok/s") if "tokens_per_s" in metrics
                  else (metrics.get("examples_per_s", 0.0), "examples/s"))
    log.info("client %s · round %d · %d steps in %.1f s · %.0f %s · train loss %.3f", env.client, rnd,
             metrics["steps"], metrics["train_s"], rate, unit, metrics["train_loss"])
    content["metrics"] = MetricRecord(secure.clear_metrics(metrics))  # tee: the rest travels sealed
    return Message(content, reply_to=msg)


@client_app.train("apply")
def client_apply(msg: Message, context: Context) -> Message:
    """Apply the server's aggregate (validated against what this client sent), then evaluate."""
    env = client_env(context)
    rnd = int(msg.content["config"]["round"])
    session, optimizer = open_session(env, rnd, upto=(rnd, TRAINED), train=False)
    expected = env.protocol.payload_spec(session)
    metrics: dict[str, Any] = {"client": env.client, "round": rnd, **env.timings(msg)}
    aggregate = ClientExchange(env, context).read_aggregate(msg, rnd, expected, metrics)
    device = next(session.model.parameters()).device
    aggregate = {name: tensor.to(device) for name, tensor in aggregate.items()}
    metrics.update(env.protocol.client_apply(session, aggregate))
    if env.diagnostics:
        metrics["fedavg_distance"] = diagnostics.fedavg_distance(context.run_id, rnd,
                                                                 trainable_tensors(session.model))
    _evaluate_into(env, session, metrics)
    save_session(env, session, optimizer, ROUND_END)
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@client_app.query()
def client_query(msg: Message, context: Context) -> Message:
    """Which client this node is (its ``partition-id``): the server maps node ids to clients with it."""
    return Message(RecordDict({"metrics": MetricRecord({"client": client_id(context)})}), reply_to=msg)


@client_app.query("attest")
def client_attest(msg: Message, context: Context) -> Message:
    """secure.mode tee: the client's side of the aggregator's attestation (before round 1)."""
    return ClientExchange(client_env(context), context).attest(msg)


@client_app.query("secagg")
def client_secagg(msg: Message, context: Context) -> Message:
    """secure.mode secagg: one secure-aggregation step (keys, shares, unmask) of an exchange round."""
    env = client_env(context)
    return ClientExchange(env, context).secagg_step(msg, lambda: _initial_tensors(env.cfg.to_json()))


@client_app.evaluate()
def client_evaluate(msg: Message, context: Context) -> Message:
    """Final evaluation: test loss and the task's metrics (translation: decoded translations scored
    with BLEU, chrF, METEOR, BERTScore; image classification: accuracy and per-class accuracy;
    segmentation: Dice, IoU, pixel accuracy).

    Only the scores (and, for translation, three sample translations) go back to the server. Where
    the node config names an ``output-dir`` (the in-process runtime sets ``<out>/client-<id>``; a
    deployed SuperNode may set its own), the client also writes every decoded test sentence to
    ``<output-dir>/translations.tsv`` (segmentation: ``masks.png``, a few predicted masks beside the
    truth) itself, on its own machine: what a client's model outputs says more about it than the
    scores do, so it never crosses the wire.
    """
    env = client_env(context)
    rnd = int(msg.content["config"]["round"])
    session, _optimizer = open_session(env, rnd, upto=(rnd, ROUND_END), train=False)
    metrics: dict[str, Any] = {"client": env.client}
    _evaluate_into(env, session, metrics)
    output_dir = context.node_config.get("output-dir")
    scores, labels, samples = env.task.final_metrics(session.model, str(output_dir) if output_dir else None)
    scores.pop("test_loss", None)  # the task's own copy of what _evaluate_into measured
    metrics.update(scores)
    # what the whole model costs under the same serializer (the size of a FedAvg payload)
    metrics["model_bytes"] = payload_bytes(
        RecordDict({"payload": to_array_record(trainable_tensors(session.model))})
    )
    data = env.task.describe(env.client)
    if env.cfg.task == "translation":
        data["train_pairs"] = session.num_examples
    content = RecordDict({"metrics": MetricRecord(metrics), "data": ConfigRecord(data)})
    if labels:
        content["labels"] = ConfigRecord(labels)
    if samples:
        content["samples"] = ConfigRecord(samples)
    log.info("client %s · final test loss %.3f · %s", env.client, metrics["test_loss"], env.task.final_log(metrics))
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
