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

That is the standard round (``runtime/rounds.py``: ``standard_round``); a protocol may declare its own
(``run_round``: FedPC's report → pilot → ``train.payload`` round, Phong's sequential ``train`` messages
carrying the model) over the same validated, measured, secure messages (``RoundIO``).

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
from .runtime.rounds import (EVALUATE, POLL_S, QUERY, SERVER_KEYS, FederationError, ReplyError, RoundIO, Server,
                             standard_round)
from .runtime.rounds import client_of as _client_of
from .runtime.rounds import describe as _describe
from .runtime.rounds import drop as _drop
from .runtime.rounds import exchange as _exchange
from .runtime.rounds import send as _send
from .runtime.rounds import ttl as _ttl
from .runtime.rounds import validate_reply
from .runtime.store import ROUND_END, TRAINED, ClientState, DiskStore, MemoryStore
from .secure.exchange import ClientExchange, ServerExchange
from .tasks.run import FINAL_METRICS, RunTask, load_task
from .wire import payload_bytes, to_array_record
from .workload import ALL_SHARDS, derive_seed

log = logging.getLogger(__name__)

CONFIG_KEY = "trustformer-config"  # run_config key holding the resolved RunConfig as JSON
SAMPLE_TRANSLATIONS = 3

server_app = ServerApp()
client_app = ClientApp()


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
    rejoins, under a new node id too); what one round does is the protocol's ``run_round`` hook or
    the standard round (``runtime/rounds.py``), over the shared validated, measured, secure messages;
    each message's replies are awaited at most ``federation.round_timeout_s`` (later ones: dropped
    from the round); every completed round ends with a checkpoint that ``runtime.resume`` continues
    from (``runtime/checkpoint.py``).
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
    run_round = getattr(protocol, "run_round", None) or standard_round
    recorder = RunRecorder(cfg.out, total_rounds=fed.rounds)
    checkpoints = Checkpointer(cfg, recorder, protocol)  # resumes the checkpointed run when runtime.resume
    log.info(
        "strategy %s · %d client(s) · %d round(s) · output %s%s", protocol.name, len(node_ids), fed.rounds, cfg.out,
        f" · resumed after round {checkpoints.completed}" if cfg.runtime.resume else "",
    )
    rounds_run = checkpoints.completed
    secure = ServerExchange(cfg, grid, recorder, lambda *args: _send(*args, timeout=timeout),
                            lambda r, n, why: _drop(recorder, r, n, clients, why), clients)
    secure.setup(node_ids, min_valid)  # secure.mode tee: every client attests the aggregator before round 1
    server = Server(cfg=cfg, grid=grid, protocol=protocol, recorder=recorder, secure=secure, clients=clients,
                    min_valid=min_valid, timeout=timeout, payload_spec=lru_cache(maxsize=1)(
                        lambda: expected_payload_spec(cfg, protocol)),
                    initial=lambda: _initial_tensors(cfg.to_json()), server_phases=checkpoints.server_phases)
    for rnd in range(checkpoints.completed + 1, fed.rounds + 1):
        if rnd > checkpoints.completed + 1:  # who is connected now (a restarted client rejoins)
            node_ids = _connected_clients(grid, clients, retired, want=min_valid, need=min_valid, wait_s=wait_s,
                                          timeout=timeout)
        io = RoundIO(server, rnd, node_ids, exchange=protocol.exchanges and rnd % fed.agg_every == 0)
        run_round(io)
        if io.stopped is not None:
            break
        rounds_run = rnd
        io.finish()
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
        server_time_s={k: round(v, 4) for k, v in checkpoints.server_phases.items()},
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
        make = getattr(env.protocol, "client_optimizer", None)  # optional: e.g. FedPC's private choice
        optimizer = make(env.task, model, env.client) if make is not None else env.task.new_optimizer(model)
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
    protocol = env.protocol  # optional hooks: see protocols/base.py
    incoming = secure.read_model(msg, rnd, protocol.payload_spec(session), metrics)  # Phong: the model to train on
    if incoming is not None:
        metrics.update(protocol.client_apply(session, incoming))
    make_step = getattr(protocol, "local_step", None)  # optional: e.g. SAM, a regularised loss
    options = getattr(protocol, "train_options", lambda _s: {})(session)
    metrics.update(env.task.train_local(session.model, optimizer, env.shard,
                                        seed=derive_seed(env.cfg.seed, "train", env.client, rnd),
                                        step=make_step(session) if make_step is not None else None, **options))
    trained = getattr(protocol, "client_trained", None)
    if trained is not None:
        trained(session, metrics)
    content = RecordDict()
    if exchange and env.diagnostics:
        diagnostics.record_local_model(context.run_id, rnd, env.client, trainable_tensors(session.model),
                                       session.num_examples)
    if exchange and getattr(protocol, "payload_on_request", False):  # FedPC: only the report now
        if env.cfg.secure.mode != "none":  # tee: the report travels sealed (no payload arrays)
            secure.put_payload(content, msg, rnd, {}, session.num_examples, metrics)
    elif exchange:
        payload, phases = env.protocol.client_payload(session)
        payload = {name: tensor.cpu() for name, tensor in payload.items()}  # the wire is CPU memory
        metrics.update(phases)
        if getattr(protocol, "evaluates_after_train", False):
            _evaluate_into(env, session, metrics)
        secure.put_payload(content, msg, rnd, payload, session.num_examples, metrics)
    else:
        _evaluate_into(env, session, metrics)
    save_session(env, session, optimizer, TRAINED if exchange else ROUND_END)
    rate, unit = ((metrics["tokens_per_s"], "tok/s") if "tokens_per_s" in metrics
                  else (metrics.get("examples_per_s", 0.0), "examples/s"))
    if "steps" in metrics:  # (FedPC: private, removed by client_trained)
        log.info("client %s · round %d · %d steps in %.1f s · %.0f %s · train loss %.3f", env.client, rnd,
                 metrics["steps"], metrics["train_s"], rate, unit, metrics["train_loss"])
    else:
        log.info("client %s · round %d · trained in %.1f s · train loss %.3f", env.client, rnd, metrics["train_s"],
                 metrics["train_loss"])
    content["metrics"] = MetricRecord(secure.clear_metrics(metrics))  # tee: the rest travels sealed
    return Message(content, reply_to=msg)


@client_app.train("payload")
def client_train_payload(msg: Message, context: Context) -> Message:
    """The payload the server asks for after this round's training (``session.request``: FedPC's pilot
    model or ternary vector)."""
    env = client_env(context)
    config = msg.content["config"]
    rnd = int(config["round"])
    secure = ClientExchange(env, context)
    secure.require_session()
    session, optimizer = open_session(env, rnd, upto=(rnd, TRAINED), train=False)
    session.request = {k: v for k, v in dict(config).items() if k != "round"}
    metrics: dict[str, Any] = {"client": env.client, "round": rnd, "num_examples": session.num_examples,
                               **env.timings(msg)}
    payload, phases = env.protocol.client_payload(session)
    metrics.update(phases)
    content = RecordDict()
    kind = "train.payload.retry" if session.request.get("retry") else "train.payload"
    secure.put_payload(content, msg, rnd, {n: t.cpu() for n, t in payload.items()}, session.num_examples, metrics,
                       kind=kind)
    save_session(env, session, optimizer, TRAINED)
    content["metrics"] = MetricRecord(secure.clear_metrics(metrics))
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


__all__ = ["server_app", "client_app", "run_federation", "FederationError", "CONFIG_KEY", "ReplyError", "SERVER_KEYS",
           "validate_reply"]
