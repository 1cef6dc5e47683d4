"""The Flower internals of ``trustformer.flower_internals``, each exercised through that module, on a Flower
release the module declares supported; and no other module of the package importing a Flower internal."""

import ast
import inspect
from pathlib import Path

import flwr
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from trustformer import flower_internals as fi

SRC = Path(__file__).resolve().parents[1] / "src" / "trustformer"
INTERNALS = SRC / "flower_internals.py"

# Flower's public modules; any other ``flwr.*`` import is an internal and belongs in flower_internals.py
PUBLIC_FLOWER = {
    "flwr",
    "flwr.app",
    "flwr.serverapp",
    "flwr.serverapp.strategy",
    "flwr.clientapp",
    "flwr.clientapp.mod",
    "flwr.common",
    "flwr.simulation",
}
# the internals named explicitly (also caught by the rule above): the wire format, the SuperLink's core, the
# legacy server package, the Simulation Engine's private entry point, the constants flwr.common does not export
INTERNAL_PREFIXES = (
    "flwr.proto",
    "flwr.common.serde",
    "flwr.common.constant",
    "flwr.supercore",
    "flwr.server.",
    "flwr.simulation.run_simulation",
)


def test_the_installed_flower_is_a_supported_release():
    try:
        fi.check_flower_version()
    except fi.UnsupportedFlowerError as exc:
        pytest.fail(
            f"Flower {flwr.__version__} is not in SUPPORTED_FLOWER {fi.SUPPORTED_FLOWER}: re-check every "
            f"internal listed in src/trustformer/flower_internals.py against it, then add "
            f"{fi.flower_release()!r} to SUPPORTED_FLOWER ({exc})"
        )


def test_an_unlisted_release_is_refused_naming_what_to_do():
    assert fi.check_flower_version("1.41.0") == "1.41"
    with pytest.raises(fi.UnsupportedFlowerError, match="re-check the internals"):
        fi.check_flower_version("9.99.0")
    assert fi.flower_release("1.41.0rc1") == "1.41"


def _content() -> RecordDict:
    return RecordDict(
        {
            "payload": ArrayRecord(
                {"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3)), "i": Array(np.array([1, 2], dtype=np.int64))}
            ),
            "config": ConfigRecord({"round": 3, "name": "x", "blob": b"\x00\x01"}),
            "metrics": MetricRecord({"loss": 0.5, "num_examples": 10}),
        }
    )


def test_a_message_round_trips_through_the_protobuf_wire_with_the_task_identity():
    with fi.task_identity(run_id=77):
        message = Message(_content(), fi.SUPERLINK_NODE_ID + 2, "train", group_id="3")
    fi.set_message_id(message, "m-1")
    delivered = fi.wire_copy(message)
    assert delivered is not message
    meta = delivered.metadata
    assert (meta.run_id, meta.src_node_id, meta.dst_node_id, meta.src_task_id) == (
        77,
        fi.SUPERLINK_NODE_ID,
        fi.SUPERLINK_NODE_ID + 2,
        1,
    )
    assert (meta.message_id, meta.message_type, meta.group_id) == ("m-1", "train", "3")
    content = delivered.content
    assert content["payload"]["w"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert content["payload"]["w"].numpy().dtype == np.float32 and content["payload"]["i"].numpy().dtype == np.int64
    assert dict(content["config"]) == {"round": 3, "name": "x", "blob": b"\x00\x01"}
    assert dict(content["metrics"]) == {"loss": 0.5, "num_examples": 10}

    reply = fi.wire_copy(Message(Error(fi.NODE_UNAVAILABLE, "gone"), reply_to=delivered))
    assert reply.has_error() and reply.error.code == fi.NODE_UNAVAILABLE and reply.error.reason == "gone"
    assert reply.metadata.reply_to_message_id == "m-1" and reply.metadata.dst_node_id == fi.SUPERLINK_NODE_ID


def test_the_node_unavailable_code_is_flowers():
    # the code the SuperLink answers for a node gone (flwr's ErrorCode.NODE_UNAVAILABLE), an int
    assert isinstance(fi.NODE_UNAVAILABLE, int) and fi.NODE_UNAVAILABLE > 0
    assert isinstance(fi.SUPERLINK_NODE_ID, int)


def test_the_task_identity_is_restored_and_nests():
    with fi.task_identity(run_id=5, node_id=9, task_id=2):
        outer = Message(RecordDict(), 3, "query")
        with fi.task_identity(run_id=6):
            inner = Message(RecordDict(), 3, "query")
        again = Message(RecordDict(), 3, "query")
    assert (outer.metadata.run_id, outer.metadata.src_node_id, outer.metadata.src_task_id) == (5, 9, 2)
    assert (inner.metadata.run_id, inner.metadata.src_node_id) == (6, fi.SUPERLINK_NODE_ID)
    assert (again.metadata.run_id, again.metadata.src_node_id, again.metadata.src_task_id) == (5, 9, 2)


def test_the_content_wire_bytes_are_the_protobuf_length_and_wire_counts_them():
    from trustformer.wire import payload_bytes

    small, big = _content(), _content()
    big["payload"]["x"] = Array(np.zeros(1000, dtype=np.float32))
    assert 0 < fi.content_wire_bytes(small) < fi.content_wire_bytes(big)
    assert fi.content_wire_bytes(big) - fi.content_wire_bytes(small) >= 4000
    assert payload_bytes(big) == fi.content_wire_bytes(big)
    assert fi.content_wire_bytes(RecordDict()) == 0


def test_runs_for_a_grid_and_for_the_simulation_engine():
    from trustformer.engine.inprocess import InProcessGrid

    run = fi.empty_run(42)
    assert isinstance(run, fi.Run) and run.run_id == 42
    grid = InProcessGrid(lambda message, context: message, [{"partition-id": 0}], {}, run_id=42)
    assert grid.run.run_id == 42
    grid.set_run(fi.empty_run(43))
    assert grid.run.run_id == 43

    sim = fi.simulation_run(44, {"trustformer-config": "{}"})
    assert (sim.run_id, sim.override_config, sim.primary_task_id) == (44, {"trustformer-config": "{}"}, 1)
    assert sim.federation_id  # the no-op federation: the engine refuses an empty one


def test_the_simulation_entry_point_takes_what_start_simulation_passes():
    pytest.importorskip("ray")
    from flwr.simulation.run_simulation import _run_simulation

    taken = set(inspect.signature(_run_simulation).parameters)
    passed = {
        "num_supernodes",
        "exit_event",
        "client_app",
        "server_app",
        "backend_name",
        "backend_config",
        "server_app_context",
        "app_dir",
        "run",
        "is_app",
    }
    assert passed <= taken, f"_run_simulation no longer takes {sorted(passed - taken)}"
    from flwr.common import EventType

    assert EventType.PYTHON_API_RUN_SIMULATION_LEAVE  # the exit event start_simulation passes


def _flower_imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names imported from it) of every ``flwr`` import of a file (late ones too), and of
    ``import_module("flwr...")``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and node.module.split(".")[0] == "flwr":
            found.append((node.lineno, node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] == "flwr"]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("flwr.")
        ):
            found.append((node.lineno, node.args[0].value, ()))
    return found


def _internal(module: str, names: tuple[str, ...] = ()) -> bool:
    """A module outside Flower's public ones, or a name of a public one that is an internal submodule
    (``from flwr.common import serde``)."""
    return (
        module not in PUBLIC_FLOWER
        or module.startswith(INTERNAL_PREFIXES)
        or any(f"{module}.{name}".startswith(INTERNAL_PREFIXES) for name in names)
    )


def test_only_flower_internals_imports_flower_internals():
    strays = []
    for path in sorted(SRC.rglob("*.py")):
        if path == INTERNALS:
            continue
        for line, module, names in _flower_imports(path):
            if _internal(module, names):
                strays.append(f"{path.relative_to(SRC)}:{line} imports {module} {', '.join(names)}".rstrip())
    assert not strays, (
        "Flower internals imported outside src/trustformer/flower_internals.py (use the public "
        "API, or add the internal there, documented):\n" + "\n".join(strays)
    )


def test_the_import_check_catches_an_internal(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from flwr.app import Message\nimport flwr.proto.message_pb2\nimport flwr\n"
        "def f():\n    from flwr.common.serde import message_to_proto\n"
        "    from flwr.supercore.run import Run\n    from flwr.server.grid import Grid\n"
        "    from flwr.simulation.run_simulation import _run_simulation\n"
        "    from flwr.common.constant import ErrorCode\n    from flwr.common import Error, serde\n"
        "    from flwr.superlink import grid\n    from flwr.serverapp import Grid\n",
        encoding="utf-8",
    )
    flagged = {(m, names) for _, m, names in _flower_imports(probe) if _internal(m, names)}
    assert {m for m, _ in flagged} == {
        "flwr.proto.message_pb2",
        "flwr.common.serde",
        "flwr.supercore.run",
        "flwr.server.grid",
        "flwr.simulation.run_simulation",
        "flwr.common.constant",
        "flwr.common",
        "flwr.superlink",
    }
    assert ("flwr.common", ("Error", "serde")) in flagged  # the submodule serde, not Error
    assert not _internal("flwr.common", ("Error",)) and not _internal("flwr")
    assert not _internal("flwr.app", ("Message",))
    assert INTERNALS.exists() and _flower_imports(INTERNALS)  # the module the check exempts is where they live
