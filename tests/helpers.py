"""Helpers the test modules share: the ``tiny`` run configuration, the kill harness of the resume tests, and reading a
run's JSON lines. Imported as a sibling module (``from helpers import ...``), like ``dp_plants``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trustformer.config import load_config
from trustformer.config.run import RunConfig


def tiny_config(
    out: Path | str | None = None,
    name: str | None = None,
    faults: Sequence[Any] | None = None,
    /,
    *,
    defaults: Mapping[str, Any] | None = None,
    **values: Any,
) -> RunConfig:
    """The ``tiny`` preset, progress off: ``defaults`` (a test module's own, bound with ``functools.partial``), the
    run folder ``out`` (``out / name`` when a name is given), ``faults`` as ``federation.faults``, then ``values``
    (dotted keys) on top."""
    merged: dict[str, Any] = {"runtime.progress": False, **(defaults or {})}
    if out is not None:
        merged["out"] = str(Path(out) / name if name is not None else out)
    if faults is not None:
        merged["federation.faults"] = list(faults)
    return load_config("tiny", None, {**merged, **values})


def jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Every row of a JSON-lines file (a run's ``metrics.jsonl``)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


class Crash(BaseException):
    """Stops the whole in-process run, as a killed server would (not an error reply of one client): a
    ``BaseException``, so that no handler of the run catches it."""


def crash_at(message_type: str, rnd: int, partition: int | None = None, after: int = 0) -> Callable[[Any, Any], Any]:
    """The client app, raising :class:`Crash` when it is delivered ``message_type`` of round ``rnd``: the
    ``after``-th such delivery (counting from 0), to the client of ``partition`` or to any."""
    from trustformer.app import client_app

    seen = 0

    def call(message: Any, context: Any) -> Any:
        nonlocal seen
        if (
            message.metadata.message_type == message_type
            and message.metadata.group_id == str(rnd)
            and (partition is None or context.node_config["partition-id"] == partition)
        ):
            if seen == after:
                raise Crash()
            seen += 1
        return client_app(message, context)

    return call


def forget_process() -> None:
    """Drop what the killed process held in memory (its clients' protocol objects and memory stores), as a restarted
    process would not have them."""
    from trustformer.runtime import client as client_runtime
    from trustformer.runtime import node as node_runtime

    client_runtime._node_protocols.clear()
    node_runtime._memory_stores.clear()


class Quadratic(torch.nn.Module):
    """A one-parameter model for a protocol's own local step: F(w) = ½‖w − t‖² summed over a batch of targets t (its
    minimiser is the mean target), with the ``loss`` signature of the project's models."""

    def __init__(self, start: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(start.clone())

    def loss(self, src: Any, tgt: torch.Tensor, label_smoothing: float = 0.0) -> tuple[torch.Tensor, int]:
        return 0.5 * ((self.w - tgt) ** 2).sum(), tgt.shape[0]


def session_of(model: Any, state: Mapping[str, Any] | None = None, rnd: int = 1) -> Any:
    """A client session of ``model`` for a local step alone (no configuration, no data): protocol state ``state``."""
    from trustformer.protocols.interface.base import ClientSession

    return ClientSession(
        cfg=None,  # type: ignore[arg-type]
        client=0,
        round=rnd,
        model=model,
        num_examples=1,
        initial_tensors=dict,
        protocol_state=dict(state or {}),
        label_smoothing=0.0,
    )


def begin_server(protocol: Any, initial: Mapping[str, torch.Tensor], clients: int = 3) -> Any:
    """``protocol``'s server half started as the runtime starts it (``start_server``: every layer's ``server_begin``,
    innermost first): the identical initial model ``initial`` and ``clients`` clients; returns the protocol."""
    from trustformer.protocols import start_server
    from trustformer.protocols.interface.session import ServerStart

    start_server(protocol, ServerStart(dict(initial), clients))
    return protocol


def dp_steps(model: Any, optimizer: Any, src: torch.Tensor, tgt: torch.Tensor, dp: Any, steps: int = 1, **extra: Any):
    """``steps`` DP-SGD steps (``core/dpsgd.py``) of ``dp`` on the records (``src``, ``tgt``) of a translation model,
    from seeded draws and noise; ``extra``: more keyword arguments of ``dp_sgd``."""
    from trustformer.core import dpsgd

    return dpsgd.dp_sgd(
        model,
        optimizer,
        len(src),
        lambda idx: (src[idx], tgt[idx]),
        lambda m, s, t: m.pair_losses(s, t),
        dp=dp,
        steps=steps,
        sampler=torch.Generator().manual_seed(0),
        noise=torch.Generator().manual_seed(0),
        **extra,
    )
