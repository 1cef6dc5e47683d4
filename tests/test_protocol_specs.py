"""A protocol is one module: the narrow core interface, optional parts with defaults, plain wrappers, a complete spec
per protocol, and no protocol named outside its own module, the registry and the experiment/report layers."""

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

from trustformer.protocols.interface.base import REQUIRED, CatchUp, FederatedProtocol, hooks
from trustformer.protocols.interface.spec import COMPOSITIONS, ProtocolSpec
from trustformer.protocols.interface.state import server_state
from trustformer.protocols.wrappers.base import ProtocolWrapper
from trustformer.registry import PROTOCOLS, protocol_spec, protocol_specs

SRC = Path(__file__).resolve().parents[1] / "src" / "trustformer"
LAB = SRC.parent / "trustformer_lab"  # the experiments
ESTIMATORS = ("model", "update", "centroids", "none", None)
# Layers that compose experiments out of named protocols (the papers' grids, their tables and figures): they may
# name protocols. Everything else (config, attack, runtime, engine, deploy, secure, tasks, core, ...) may not.
EXPERIMENT_LAYERS = ("bench/", "report/", "reproduce/", "commands.py", "registry.py", "cli.py")


def test_the_required_core_is_narrow_and_every_other_hook_has_a_default():
    """FederatedProtocol: 4 required members (its spec and the exchange: payload, aggregate, apply), at most 10 hooks
    in all; what only some protocols need is an optional part with defaults, reached through one hook each."""
    assert REQUIRED == ("spec", "client_payload", "aggregate", "client_apply")
    bare_object = type("P", (), {"name": "p"})()
    for call in (
        lambda: FederatedProtocol.client_payload(bare_object, None),  # overridden by whatever exchanges
        lambda: FederatedProtocol.aggregate(bare_object, 1, [], []),
        lambda: FederatedProtocol.client_apply(bare_object, None, {}),
    ):
        with pytest.raises(NotImplementedError):
            call()
    assert len(hooks()) <= 10, hooks()
    assert {"training", "server", "catching_up", "coding"} <= set(hooks())
    assert {"catch_up", "participants", "coding_view", "check_payload"}.isdisjoint(hooks())


def test_the_wrapper_forwards_the_core_in_plain_code_and_reaches_the_inner_parts():
    """ProtocolWrapper writes out the core hooks it forwards (no class is built at run time): a wrapper's type is its
    source class; a part the wrapper does not subclass is its inner protocol's."""
    forwarded = [n for n in hooks() if n in vars(ProtocolWrapper)]
    assert len(forwarded) <= 8, forwarded
    assert {"client_payload", "aggregate", "client_apply"} <= set(forwarded)

    class Inner(FederatedProtocol, CatchUp):
        spec = ProtocolSpec(name="inner", factory=lambda cfg: None, summary="x")

        def catch_up(self, version):
            return {"version": version}

    class Outer(ProtocolWrapper):
        pass

    class Cfg:
        pass

    inner = Inner(Cfg())
    outer = Outer(inner)
    assert type(outer) is Outer and outer.catching_up() is inner and outer.catching_up().catch_up(7) == {"version": 7}
    assert outer.coding().stable_payload_layout() and outer.training().local_step(None) is None
    assert server_state(outer) == {"class": "Outer", "state": {}, "inner": {"class": "Inner", "state": {}}}


def unforwarded(part, inner_base):
    """The methods of ``part`` that a wrapper on ``inner_base`` does not hand to its inner protocol: each is called
    on the wrapper with placeholder arguments, and the inner protocol records what reached it."""
    import inspect

    from trustformer.protocols.interface.parts import part_methods

    reached = []

    class Inner(FederatedProtocol, part):
        spec = ProtocolSpec(name="inner", factory=lambda cfg: None, summary="x")

    for name in part_methods(part):
        setattr(Inner, name, lambda self, *args, _name=name: reached.append(_name))

    class Outer(ProtocolWrapper, inner_base):
        pass

    class Cfg:
        pass

    outer = Outer(Inner(Cfg()))
    for name in part_methods(part):
        arguments = [None] * (len(inspect.signature(getattr(part, name)).parameters) - 1)
        getattr(outer, name)(*arguments)
    return sorted(set(part_methods(part)) - set(reached))


@pytest.mark.parametrize("part", ["ServerHooks", "CatchUp"])
def test_a_wrapper_base_forwards_every_method_of_its_part_and_a_forgotten_one_is_seen(monkeypatch, part):
    from trustformer.protocols.interface import parts
    from trustformer.protocols.wrappers import base

    inner_base = getattr(base, f"Inner{part}")
    walked = list(base.EVERY_LAYER) if part == "ServerHooks" else []  # the runtime calls them on every layer
    assert unforwarded(getattr(parts, part), inner_base) == walked
    forgotten = sorted(n for n in vars(inner_base) if not n.startswith("_"))[0]
    monkeypatch.delattr(inner_base, forgotten)  # the planted bug: one forward left out
    assert unforwarded(getattr(parts, part), inner_base) == sorted([*walked, forgotten])


def test_a_part_method_on_a_class_without_the_part_is_refused_at_definition():
    """A method named like an optional part's, on a class that does not subclass that part, would never be called."""
    with pytest.raises(TypeError, match=r"Forgot defines catch_up \(a method of CatchUp\)"):

        class Forgot(FederatedProtocol):
            def catch_up(self, version):
                return None


def test_no_protocol_class_is_built_at_run_time():
    """No ``type(name, bases, members)`` call anywhere in the protocols or the runtime."""
    for path in [*(SRC / "protocols").rglob("*.py"), *(SRC / "runtime").rglob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "type" and len(n.args) == 3
        ]
        assert not calls, f"{path.relative_to(SRC)}:{calls}"


def test_undeclared_server_state_is_refused_at_definition():
    from trustformer.protocols.interface.state import UndeclaredStateError

    with pytest.raises(UndeclaredStateError, match=r"Sloppy.aggregate\(\) sets self.total"):

        class Sloppy(FederatedProtocol):
            def aggregate(self, rnd, payloads, num_examples):
                self.total = len(payloads)
                return {}, {}

    class Declared(FederatedProtocol):  # declared: accepted
        state_attrs = ("total",)

        def aggregate(self, rnd, payloads, num_examples):
            self.total = len(payloads)
            return {}, {}


def test_start_attributes_are_set_in_server_begin_only_and_the_payload_layout_sets_none():
    """What the server derives from the initial model and the population is set once, in ``server_begin`` (or a helper
    only it calls); ``expected_payload``, which both halves call, returns a layout and sets nothing. Planted: a start
    attribute reset in ``aggregate``, a helper that ``aggregate`` calls too, and the layout keeping the dimension."""
    from trustformer.protocols.interface.parts import ServerHooks
    from trustformer.protocols.interface.state import UndeclaredStateError

    class Started(FederatedProtocol, ServerHooks):  # accepted: server_begin and a helper only it calls
        start_attrs = ("dim", "layout")

        def server_begin(self, start):
            self.dim = sum(t.numel() for t in start.initial.values())
            self._fix_layout(start.initial)

        def _fix_layout(self, initial):
            self.layout = sorted(initial)

    with pytest.raises(
        UndeclaredStateError, match=r"Reset.aggregate\(\) sets self.dim, which .*Reset declares in start_attrs"
    ):

        class Reset(Started):
            def aggregate(self, rnd, payloads, num_examples):
                self.dim = 0
                return {}, {}

    with pytest.raises(UndeclaredStateError, match=r"Shared._fix_layout\(\) sets self.layout"):

        class Shared(Started):
            def _fix_layout(self, initial):
                self.layout = sorted(initial)

            def aggregate(self, rnd, payloads, num_examples):
                self._fix_layout(payloads[0])
                return {}, {}

    with pytest.raises(UndeclaredStateError, match=r"Keeps.expected_payload\(\) sets self.dim, but expected_payload"):

        class Keeps(Started):
            def expected_payload(self, initial):
                self.dim = sum(t.numel() for t in initial.values())
                return {}


def test_a_hook_is_set_in_init_only_and_no_product_protocol_keeps_scratch():
    """An outside object handed in at construction (``hook_attrs``: an observer, an audit's canaries) is set in
    ``__init__`` only: planted, a method that swaps it. And no protocol or wrapper of the product hands state from one
    hook to the next through ``scratch_attrs``: what it keeps is state, derived once (start) or a value."""
    import importlib
    import inspect
    import pkgutil

    import trustformer.protocols as protocols
    from trustformer.protocols.interface.state import SCRATCH, UndeclaredStateError

    class Watched(FederatedProtocol):  # accepted: the hook set in __init__
        hook_attrs = ("observer",)

        def __init__(self, cfg, observer=None):
            super().__init__(cfg)
            self.observer = observer

    with pytest.raises(UndeclaredStateError, match=r"Swapped.aggregate\(\) sets self.observer, .* hook_attrs"):

        class Swapped(Watched):
            def aggregate(self, rnd, payloads, num_examples):
                self.observer = None
                return {}, {}

    scratch = set()
    for info in pkgutil.walk_packages(protocols.__path__, "trustformer.protocols."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and cls.__dict__.get(SCRATCH):
                scratch |= {f"{cls.__name__}.{a}" for a in cls.__dict__[SCRATCH]}
    assert not scratch, f"scratch attributes in the product's protocols: {sorted(scratch)}"


def test_a_client_method_that_reads_server_state_is_refused_at_definition():
    """The client half may not read what the server half sets: a deployed client would hold the initial value. The
    planted bugs: a client method reading it directly, and through a helper it calls."""
    from trustformer.protocols.fedavg import FedAvg
    from trustformer.protocols.interface.state import ServerStateReadError

    with pytest.raises(ServerStateReadError, match=r"Peeking.client_apply\(\) runs on a client and reads self.latest"):

        class Peeking(FedAvg):
            def client_apply(self, session, aggregate):
                return {} if self.latest is None else {"behind": float(self.latest[0])}

    with pytest.raises(ServerStateReadError, match=r"reads self.latest \(through self._behind\(\)\)"):

        class PeekingThroughAHelper(FedAvg):
            def _behind(self):
                return self.latest

            def client_payload(self, session):
                self._behind()
                return {}, {}

    class Configured(FedAvg):  # what __init__ alone sets is configuration, equal on both halves: accepted
        def __init__(self, cfg):
            super().__init__(cfg)
            self.scale = 2.0

        def client_payload(self, session):
            return {}, {"scale": self.scale}


def test_undeclared_state_changed_in_place_is_refused_at_the_next_checkpoint(tmp_path):
    """The runtime check: an attribute set in __init__ and mutated in place (no assignment for the scan to see)."""
    from trustformer.protocols.interface.state import UndeclaredStateError
    from trustformer.runtime.checkpoint import Checkpointer

    class Counting(FederatedProtocol):
        spec = ProtocolSpec(name="counting", factory=lambda cfg: None, summary="x")

        def __init__(self, cfg):
            super().__init__(cfg)
            self.seen = []

        def aggregate(self, rnd, payloads, num_examples):
            self.seen.append(len(payloads))  # in place: the definition-time scan cannot see it
            return {}, {}

    from trustformer.config import load_config

    cfg = load_config("tiny", None, {"out": str(tmp_path)})
    protocol = Counting(cfg)

    class Recorder:
        metrics_path = tmp_path / "metrics.jsonl"
        started = 0.0

    Recorder.metrics_path.write_text("")
    checkpoints = Checkpointer(cfg, Recorder(), protocol)
    protocol.aggregate(1, [{}], [1])
    checkpoints.round_done(1, {})
    protocol.aggregate(1, [{}], [1])
    with pytest.raises(UndeclaredStateError, match="Counting changed seen"):
        checkpoints.round_done(2, {})


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
def test_every_protocol_object_carries_its_spec(name, tmp_path):
    from trustformer.config import load_config
    from trustformer.protocols import bare, make_protocol

    tasks = protocol_spec(name).tasks
    task = "image-classification" if tasks and "translation" not in tasks else "translation"
    overrides = {"federation.strategy": name, "out": str(tmp_path), "task": task}
    if task != "translation":
        overrides.update({"image.dataset": "digits"})
    protocol = make_protocol(load_config("tiny", None, overrides))
    assert protocol.name == name and protocol.spec.name == name
    assert bare(protocol).spec.name in (name, bare(protocol).spec.name)


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
        "runtime/node.py",
        "cli_options.py",
        "recording/tracking.py",
        "deploy/fab.py",
        "deploy/launch.py",
        "data/corpus.py",
        "flower_internals.py",
    },
    "local": {"protocols/trustformer.py", "deploy/cli.py", "config/privacy_section.py"},  # privacy.noise = "local"
}


def test_no_protocol_is_named_outside_its_module_the_registry_and_the_experiment_layers():
    names = set(PROTOCOLS)
    own = {f"protocols/{module}.py": name for name, module in PROTOCOLS.items()}
    strays = []
    for path in sorted([*SRC.rglob("*.py"), *LAB.rglob("*.py")]):
        rel = path.relative_to(SRC if path.is_relative_to(SRC) else LAB).as_posix()
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


def started_layers(protocol, initial):
    """The layers of ``protocol`` (every wrapper and the protocol inside) that subclass ``ServerHooks``, innermost
    first, and those that the runtime's start (``start_server``) reached, in the order reached."""
    from trustformer.protocols import start_server
    from trustformer.protocols.interface.parts import ServerHooks
    from trustformer.protocols.interface.session import ServerStart

    layers, layer, reached = [], protocol, []
    while layer is not None:
        if isinstance(layer, ServerHooks):
            layers.append(layer)
        layer = getattr(layer, "inner", None)
    for layer in layers:
        original = layer.server_begin
        layer.server_begin = lambda start, _original=original, _layer=layer: (reached.append(_layer), _original(start))
    start_server(protocol, ServerStart(initial, 3))
    return layers[::-1], reached


def test_every_layer_of_every_composition_is_started_once_innermost_first(monkeypatch):
    """The runtime's start reaches every layer that has server hooks exactly once, innermost first, in every
    composition the configuration accepts (tests/compositions.py; one per distinct stack of layer classes), and the
    summary holds every layer's fields. Planted: a start that calls the outermost layer only (what a wrapper that
    does not hand ``start`` on used to leave), a wrapper that still forwards ``server_begin`` (its inner is started
    twice), and a summary of the outermost layer only."""
    from compositions import compositions

    from trustformer.config import load_config
    from trustformer.protocols import make_protocol
    from trustformer.protocols.interface.session import ServerStart
    from trustformer.protocols.wrappers import base
    from trustformer.protocols.wrappers.dp import DifferentialPrivacy
    from trustformer.tasks.run import initial_tensors

    stacks = {}
    for composition in compositions():
        cfg = load_config("tiny", None, {**composition.overrides, "out": ""})
        layer, classes = make_protocol(cfg), []
        while layer is not None:
            classes.append(type(layer))
            layer = getattr(layer, "inner", None)
        stacks.setdefault(tuple(classes), (composition.label, cfg))

    def wrong():
        out = []
        for label, cfg in stacks.values():
            layers, reached = started_layers(make_protocol(cfg), initial_tensors(cfg))
            if [id(x) for x in reached] != [id(x) for x in layers]:
                out.append(f"{label}: {[type(x).__name__ for x in reached]}")
        return out

    def summaries_short():
        out = []
        for label, cfg in stacks.values():
            protocol = make_protocol(cfg)
            base.start_server(protocol, ServerStart(initial_tensors(cfg), 3))
            own = {k for hooks in base.server_layers(protocol) for k in hooks.server_summary()}
            if not own <= set(base.server_summary(protocol)):
                out.append(label)
        return out

    assert len(stacks) > 20 and not wrong() and not summaries_short()
    with monkeypatch.context() as planted:
        planted.setattr(base, "server_layers", lambda protocol: [protocol.server()])
        assert wrong()
    with monkeypatch.context() as planted:
        forward = lambda self, start: self.inner.server().server_begin(start)  # noqa: E731
        planted.setattr(DifferentialPrivacy, "server_begin", forward)
        assert any("dp" in m for m in wrong())
    with monkeypatch.context() as planted:
        planted.setattr(base, "server_summary", lambda protocol: protocol.server().server_summary())
        assert summaries_short()
