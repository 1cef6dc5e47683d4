"""A protocol is one module: the narrow core interface, optional capabilities, generic wrappers, a complete spec
per protocol, and no protocol named outside its own module, the registry and the experiment/report layers."""

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

from trustformer.protocols.base import CORE, FederatedProtocol, ProtocolWrapper
from trustformer.protocols.capabilities import CAPABILITIES, HOOK_CAPABILITY, Capability, capability
from trustformer.protocols.spec import COMPOSITIONS, ProtocolSpec
from trustformer.registry import PROTOCOLS, protocol_spec, protocol_specs

SRC = Path(__file__).resolve().parents[1] / "src" / "trustformer"
ESTIMATORS = ("model", "update", "centroids", "none", None)
# Layers that compose experiments out of named protocols (the papers' grids, their tables and figures): they may
# name protocols. Everything else (config, attack, runtime, engine, deploy, secure, tasks, core, ...) may not.
EXPERIMENT_LAYERS = ("bench/", "report/", "reproduce.py", "registry.py", "cli.py")


def test_the_core_interface_is_narrow():
    """FederatedProtocol: 4 required members (its spec and the exchange: payload, aggregate, apply), 3 hooks with
    defaults (expected_payload, payload_spec, run_round), and ``name``/``cfg`` that come with the object."""
    methods = {n for n, v in vars(FederatedProtocol).items() if not n.startswith("__")}
    assert methods == {"name", *CORE, "run_round"}, sorted(methods)
    required = {"spec", "client_payload", "aggregate", "client_apply"}
    assert len(required) <= 8 and len(methods | {"spec", "cfg"}) <= 9
    bare = type("P", (), {"name": "p"})()
    for call in (
        lambda: FederatedProtocol.client_payload(bare, None),  # overridden by whatever exchanges
        lambda: FederatedProtocol.aggregate(bare, [], []),
        lambda: FederatedProtocol.client_apply(bare, None, {}),
    ):
        with pytest.raises(NotImplementedError):
            call()


def test_no_capability_hook_lives_on_the_core():
    assert not set(HOOK_CAPABILITY) & set(vars(FederatedProtocol)), "a capability hook is back on the core"


def test_the_wrapper_delegates_generically():
    """ProtocolWrapper defines no hook by hand: only construction and the round rule."""
    own = {n for n in vars(ProtocolWrapper) if not n.startswith("__") and n != "_extended"}
    assert own == {"run_round"}, own
    assert not set(vars(ProtocolWrapper)) & (set(HOOK_CAPABILITY) | set(CORE))


def test_a_hook_without_its_capability_is_refused_at_definition():
    with pytest.raises(TypeError, match="CatchUp"):
        type("Sloppy", (FederatedProtocol,), {"catch_up": lambda self: None})


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_registered_protocol_declares_a_complete_spec(name):
    spec = protocol_spec(name)
    assert isinstance(spec, ProtocolSpec) and spec.name == name
    assert callable(spec.factory) and spec.summary
    assert set(spec.refuses) <= set(COMPOSITIONS) and all(isinstance(v, str) and v for v in spec.refuses.values())
    assert spec.estimator in ESTIMATORS
    assert spec.mean_weighting in (None, "examples", "uniform")
    if spec.section is not None:
        assert dataclasses.is_dataclass(spec.section) and callable(getattr(spec.section, "validate", None))
        spec.section().validate()  # its defaults are valid
        assert all(f.default is not dataclasses.MISSING for f in dataclasses.fields(spec.section))
    module = importlib.import_module(f"trustformer.protocols.{PROTOCOLS[name]}")
    assert module.SPEC is spec


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_protocol_object_carries_its_spec_and_declared_capabilities(name, tmp_path):
    from trustformer.config import load_config
    from trustformer.protocols import bare, make_protocol

    task = (
        "image-classification"
        if protocol_spec(name).tasks and "translation" not in protocol_spec(name).tasks
        else "translation"
    )
    overrides = {"federation.strategy": name, "out": str(tmp_path), "task": task}
    if task != "translation":
        overrides.update({"image.dataset": "digits"})
    cfg = load_config("tiny", None, overrides)
    protocol = make_protocol(cfg)
    assert protocol.name == name and protocol.spec.name == name
    inner = bare(protocol)
    for kind in CAPABILITIES:
        hooks = [h for h, k in HOOK_CAPABILITY.items() if k is kind]
        classes = [c for c in type(inner).__mro__ if issubclass(c, FederatedProtocol)]
        overridden = [h for h in hooks if any(h in vars(c) for c in classes)]
        assert not overridden or isinstance(inner, kind), (name, kind.__name__, overridden)


def test_wrappers_take_the_capabilities_of_what_they_wrap():
    """A wrapper is an instance of every capability its inner protocol declares, and forwards to it."""
    from trustformer.protocols.capabilities import CatchUp, ServerState

    class Inner(FederatedProtocol, CatchUp):
        spec = ProtocolSpec(name="inner", factory=lambda cfg: None, summary="x")

        def catch_up(self):
            return (7, {})

    class Outer(ProtocolWrapper):
        pass

    class Cfg:
        pass

    outer = Outer(Inner(Cfg()))
    assert isinstance(outer, CatchUp) and not isinstance(outer, ServerState)
    assert capability(outer, CatchUp).catch_up() == (7, {})
    assert capability(outer, ServerState).server_state() is None  # defaults when nobody declares it
    assert issubclass(type(outer), Capability)


def _named_protocols(path: Path, names: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in docstrings
    ]


# string constants equal to a protocol name that mean something else (the package's own name, the membership mode
# "local" of Trustformer, the CLI's `deploy local` command), or the one default: federation.strategy = "fedavg"
OTHER_MEANINGS = {
    "fedavg": {"config/sections.py"},
    "trustformer": {
        "runtime/server.py",
        "runtime/client.py",
        "cli_options.py",
        "tracking.py",
        "deploy/fab.py",
        "deploy/launch.py",
        "data/corpus.py",
        "engine/flower_internals.py",
    },
    "local": {"protocols/trustformer.py", "deploy/cli.py", "config/sections.py"},
}


def test_no_protocol_is_named_outside_its_module_the_registry_and_the_experiment_layers():
    names = set(PROTOCOLS)
    own = {f"protocols/{module}.py": name for name, module in PROTOCOLS.items()}
    strays = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(EXPERIMENT_LAYERS):
            continue
        for line, value in _named_protocols(path, names):
            if own.get(rel) == value or rel in OTHER_MEANINGS.get(value, ()):
                continue
            strays.append(f"{rel}:{line}: {value!r}")
    assert not strays, "protocol names outside their module (read the spec instead):\n" + "\n".join(strays)


def test_the_specs_are_what_the_configuration_reads():
    """config names no protocol: its strategy list is the registry, its checks read the specs."""
    from trustformer import config

    assert tuple(config.STRATEGIES) == tuple(PROTOCOLS)
    assert [s.name for s in protocol_specs()] == list(PROTOCOLS)
