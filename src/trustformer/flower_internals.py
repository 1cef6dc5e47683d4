"""Every Flower internal the project uses, in one place, behind small functions of its own.

Flower's public API (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``, ``flwr.common``, ``flwr.simulation``)
covers messages, records, contexts, the apps and the ``Grid`` interface. It does not cover what an engine that
is its own SuperLink needs, nor the byte count of Flower's wire format. For those this module, and no other
module of the project (``tests/test_flower_internals.py`` checks it), imports Flower's internal modules:

``flwr.common.constant.SUPERLINK_NODE_ID``
    The node id a ServerApp runs as (the ``src_node_id`` of the server's messages; clients' ids follow it).
    ``flwr.common`` does not export it.
``flwr.common.constant.ErrorCode.NODE_UNAVAILABLE``
    The code of the SuperLink's reply for a node that is gone: the in-process engine's ``dropout`` fault
    answers with it, so the server's drop path sees the code a deployment sends. Not exported either.
``flwr.common.serde.message_to_proto`` / ``message_from_proto``, ``flwr.proto.message_pb2.Message``
    Flower's protobuf wire format of a whole ``Message``: the in-process engine carries every message through
    it (:func:`wire_copy`), as a SuperLink does. The public ``Message`` has no (de)serializer.
``flwr.common.serde.recorddict_to_proto``
    The protobuf form of a message's content, whose length is the bytes a run counts
    (:func:`content_wire_bytes`, ``wire.payload_bytes``); no public API gives a serialized size.
``flwr.supercore.run.Run``
    The run a ``Grid`` carries (the public abstract ``Grid.run`` / ``Grid.set_run`` are typed with it) and
    that the Simulation Engine takes with the run's config (:func:`empty_run`, :func:`simulation_run`).
``flwr.supercore.task_identity.TaskIdentity``
    The process-wide (task, run, node) identity a new ``Message`` takes its metadata from. Flower's own
    runtime sets it in the process of a ServerApp; an engine that calls the ServerApp itself must set it
    too (:func:`task_identity`).
``Metadata._message_id`` (a private attribute of the public ``flwr.app.Metadata``)
    Message ids are given by the SuperLink, and ``Metadata.message_id`` has no setter; a grid that is its
    own SuperLink sets the attribute as Flower's own grids do (:func:`set_message_id`).
``flwr.simulation.run_simulation._run_simulation``, ``flwr.supercore.constant.NOOP_FEDERATION_ID``
    The Simulation Engine's entry point that takes a ``Run`` (its run config) and the ServerApp's
    ``Context``; the public ``flwr.simulation.run_simulation`` takes neither (:func:`start_simulation`).
    Imported when called: it needs Ray (``flwr[simulation]``).

``SUPPORTED_FLOWER`` lists the Flower releases (major.minor) these internals were checked on;
``tests/test_flower_internals.py`` fails on any other, asking to re-check them. 1.42: none of the modules above
changed from 1.41; this module's tests, the in-process, Simulation Engine and deployment tests pass on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import flwr
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import EventType
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto, recorddict_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module
from flwr.serverapp import ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from .errors import TrustformerError

SUPPORTED_FLOWER = ("1.41", "1.42")

NODE_UNAVAILABLE = int(ErrorCode.NODE_UNAVAILABLE)  # the SuperLink's error code for a node that is gone


class UnsupportedFlowerError(TrustformerError, RuntimeError):
    """The installed Flower is not a release whose internals this module was checked against."""


def flower_release(version: str | None = None) -> str:
    """``major.minor`` of a Flower version (default: the installed one)."""
    return ".".join((version or flwr.__version__).split(".")[:2])


def check_flower_version(version: str | None = None) -> str:
    """The installed Flower's release if it is in ``SUPPORTED_FLOWER``; :class:`UnsupportedFlowerError` if not."""
    release = flower_release(version)
    if release not in SUPPORTED_FLOWER:
        raise UnsupportedFlowerError(
            f"Flower {version or flwr.__version__} is not in trustformer.flower_internals.SUPPORTED_FLOWER "
            f"{SUPPORTED_FLOWER}: re-check the internals that module uses (its docstring lists them) against "
            f"this release, run tests/test_flower_internals.py and the engine tests, then add {release!r}"
        )
    return release


def wire_copy(message: Message) -> Message:
    """Serialize to Flower's protobuf wire format and parse back (what crossing a network does)."""
    proto = ProtoMessage()
    proto.ParseFromString(message_to_proto(message).SerializeToString())
    return message_from_proto(proto)


def content_wire_bytes(content: RecordDict) -> int:
    """Length in bytes of Flower's protobuf serialization of a message's content."""
    return len(recorddict_to_proto(content).SerializeToString())


def set_message_id(message: Message, message_id: str) -> None:
    """Give a message its id, as the SuperLink does (``Metadata.message_id`` has no setter)."""
    message.metadata.__dict__["_message_id"] = message_id


def empty_run(run_id: int) -> Run:
    """A ``Run`` with nothing but its id: what an in-process ``Grid`` carries."""
    return Run.create_empty(run_id)


def simulation_run(run_id: int, run_config: dict[str, bool | float | int | str]) -> Run:
    """The ``Run`` the Simulation Engine starts: its id, its run config, task 1, no federation."""
    from flwr.supercore.constant import NOOP_FEDERATION_ID

    run = Run.create_empty(run_id)
    run.override_config, run.primary_task_id, run.federation_id = dict(run_config), 1, NOOP_FEDERATION_ID
    return run


@contextmanager
def task_identity(run_id: int, node_id: int = SUPERLINK_NODE_ID, task_id: int = 1) -> Iterator[None]:
    """Within the block, messages created in this process belong to task ``task_id`` of run ``run_id`` on
    node ``node_id`` (the ServerApp's, by default); the previous identity is restored after it."""
    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = task_id, run_id, node_id
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous


def start_simulation(
    *,
    num_supernodes: int,
    client_app: ClientApp,
    server_app: ServerApp,
    backend_config: dict[str, Any],
    server_app_context: Context,
    app_dir: str,
    run: Run,
) -> None:
    """Run the apps on Flower's Simulation Engine (Ray backend) with the ServerApp's ``Context`` and the
    ``Run`` given (the run config travels in both); returns when the ServerApp has finished."""
    from flwr.simulation.run_simulation import _run_simulation

    _run_simulation(
        num_supernodes=num_supernodes,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        client_app=client_app,
        server_app=server_app,
        backend_name="ray",
        backend_config=backend_config,
        server_app_context=server_app_context,
        app_dir=app_dir,
        run=run,
        is_app=True,
    )


__all__ = [
    "NODE_UNAVAILABLE",
    "SUPERLINK_NODE_ID",
    "SUPPORTED_FLOWER",
    "Run",
    "UnsupportedFlowerError",
    "check_flower_version",
    "content_wire_bytes",
    "empty_run",
    "flower_release",
    "set_message_id",
    "simulation_run",
    "start_simulation",
    "task_identity",
    "wire_copy",
]
