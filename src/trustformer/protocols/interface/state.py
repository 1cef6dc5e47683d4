"""What a protocol holds on the server across rounds, declared by its class, saved and restored generically.

A protocol (or wrapper) class lists its attributes in these tuples:

- ``state_attrs``: what a resumed server needs (FedAvg's last global model under client sampling, the coding
  layer's last aggregate, a DP accountant). They are saved in every round's checkpoint and restored on resume.
  A value is a tensor, a number, a string, ``None``, or a dict / list / tuple of those; an object with
  ``state_dict()`` and ``load_state_dict()`` (the PyTorch convention) is saved through them.
- ``start_attrs``: what the server half derives once, before round 1, from the identical initial model and the
  population (``ServerHooks.server_begin``, handed a ``ServerStart``), and never changes: the model's dimension,
  the coded layout, DP's σ. Set only in ``server_begin`` (or a helper only it calls); never saved, derived again at
  every start.
- ``scratch_attrs``: what is set and used within one round (a per-round cache), or built at its first use. Never
  saved. The product's protocols declare none: what one hook hands the next is a value or declared state.
- ``hook_attrs``: an outside object the caller hands in at construction and the protocol reports to (an attack's
  observer, an audit's canaries): set only in ``__init__``, never saved, and its content is not the run's state.

Two checks keep a new attribute from becoming a silent resume bug:

- at class definition (:func:`check_declared`): every ``self.X = ...`` (also ``+=``, ``self.X[k] = ...``) in a
  method other than ``__init__`` must name a declared attribute; a ``start_attrs`` one only in ``server_begin``, and
  ``expected_payload``, which both halves call, sets none;
- at every checkpoint (:func:`undeclared_changes`): an attribute declared in neither tuple that changed since the
  previous checkpoint (an in-place mutation that the first check cannot see) is an error.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from typing import Any

import torch

from ...errors import TrustformerError

STATE, START, SCRATCH, HOOK = "state_attrs", "start_attrs", "scratch_attrs", "hook_attrs"
DECLARED = (STATE, START, SCRATCH, HOOK)
PURE_METHODS = frozenset({"expected_payload"})  # called on both halves: a layout from the configuration, no state
ALWAYS_FIXED = frozenset({"cfg", "spec", "inner"})  # the configuration, the spec, a wrapper's inner protocol


class UndeclaredStateError(TrustformerError, TypeError):
    """A protocol keeps server state across rounds that its class does not declare."""


def declared(cls: type, which: str) -> tuple[str, ...]:
    """The attributes ``cls`` and its bases declare in ``which`` (``state_attrs`` or ``scratch_attrs``)."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for name in vars(klass).get(which, ()):
            if name not in names:
                names.append(name)
    return tuple(names)


def _self_targets(node: ast.AST) -> list[str]:
    """The ``X`` of every ``self.X`` that ``node`` assigns to (directly, augmented, or by subscript)."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    out = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
            continue
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            out.append(target.attr)
    return out


def _start_only(methods: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> set[str]:
    """``server_begin`` and the methods of the class that only it calls, directly or through another such method."""
    callers: dict[str, set[str]] = {m.name: set() for m in methods}
    for method in methods:
        for call in _self_uses(method)[1]:
            if call in callers:
                callers[call].add(method.name)
    only = {"server_begin"}
    changed = True
    while changed:
        changed = False
        for name, by in callers.items():
            if name not in only and by and by <= only:
                only.add(name)
                changed = True
    return only


def check_declared(cls: type) -> None:
    """Raise :class:`UndeclaredStateError` when a method of ``cls`` other than ``__init__`` sets an attribute of
    ``self`` that ``cls`` declares in none of ``state_attrs``, ``start_attrs`` and ``scratch_attrs``; a
    ``start_attrs`` one outside ``server_begin`` and the helpers only it calls; or any attribute in
    ``expected_payload``."""
    methods = _methods(cls)
    if not methods:  # defined where there is no source (an interactive session): nothing to scan
        return
    start, hooks = set(declared(cls, START)), set(declared(cls, HOOK))
    allowed = set(declared(cls, STATE)) | set(declared(cls, SCRATCH)) | start | ALWAYS_FIXED
    start_only = _start_only(methods)
    for method in methods:
        if method.name == "__init__":
            continue
        for node in ast.walk(method):
            for name in _self_targets(node):
                if method.name in PURE_METHODS:
                    raise UndeclaredStateError(
                        f"{cls.__qualname__}.{method.name}() sets self.{name}, but {method.name} runs on both halves "
                        "and returns a layout only: derive server state in server_begin (start_attrs)"
                    )
                if name in hooks:
                    raise UndeclaredStateError(
                        f"{cls.__qualname__}.{method.name}() sets self.{name}, which {cls.__qualname__} declares in "
                        f"{HOOK}: an outside object handed in at construction is set only in __init__"
                    )
                if name not in allowed:
                    raise UndeclaredStateError(
                        f"{cls.__qualname__}.{method.name}() sets self.{name}, which {cls.__qualname__} declares "
                        f"in none of {STATE} (kept across rounds: saved in every checkpoint, restored on resume), "
                        f"{START} (derived once in server_begin) and {SCRATCH} (used within one round, or built at "
                        "its first use)"
                    )
                if name in start and method.name not in start_only:
                    raise UndeclaredStateError(
                        f"{cls.__qualname__}.{method.name}() sets self.{name}, which {cls.__qualname__} declares in "
                        f"{START}: those are derived once, in server_begin (or a helper only it calls); declare it "
                        f"in {STATE} if the run changes it"
                    )


CLIENT_METHODS = frozenset(
    {
        "client_payload",
        "client_apply",
        "payload_spec",
        "client_optimizer",
        "local_step",
        "train_options",
        "client_trained",
        "client_start_from",
        "catch_up_specs",
        "payload_reference",
    }
)
"""The methods that run on a client (``runtime/client.py``): the client half of a protocol."""


class ServerStateReadError(TrustformerError, TypeError):
    """A method of a protocol's client half reads what only its server half holds."""


def _methods(cls: type) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods ``cls`` itself defines, parsed (none where it has no source)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return []
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    return [m for m in body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]


def server_written(cls: type) -> set[str]:
    """The declared attributes (state or scratch) that a method of ``cls`` or a base other than ``__init__`` sets:
    what the server half changes as the run goes. One set only in ``__init__`` is configuration, equal on both
    halves."""
    names = {n for which in DECLARED for n in declared(cls, which)}
    written: set[str] = set()
    for klass in cls.__mro__:
        for method in _methods(klass):
            if method.name != "__init__":
                written |= {t for node in ast.walk(method) for t in _self_targets(node)}
    return written & names


def _self_uses(method: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], set[str]]:
    """(the attributes of ``self`` the method reads, the methods of ``self`` it calls)."""
    reads, calls = set(), set()
    for node in ast.walk(method):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            reads.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func
            if isinstance(target.value, ast.Name) and target.value.id == "self":
                calls.add(target.attr)
    return reads, calls


def check_client_half(cls: type) -> None:
    """Raise :class:`ServerStateReadError` when a client method of ``cls`` (:data:`CLIENT_METHODS`), or a method of
    the class it calls, reads a declared attribute that a server method sets (:func:`server_written`): on a deployed
    client that attribute holds its initial value, never the server's, so the method would compute something else
    there than in process."""
    server = server_written(cls)
    uses: dict[str, tuple[set[str], set[str]]] = {}
    for klass in cls.__mro__:  # the definition the class resolves to: the first in its method resolution order
        for method in _methods(klass):
            uses.setdefault(method.name, _self_uses(method))
    for start in [m.name for m in _methods(cls) if m.name in CLIENT_METHODS]:
        seen, todo = {start}, [start]
        while todo:
            name = todo.pop()
            reads, calls = uses.get(name, (set(), set()))
            bad = sorted(reads & server)
            if bad:
                via = "" if name == start else f" (through self.{name}())"
                raise ServerStateReadError(
                    f"{cls.__qualname__}.{start}() runs on a client and reads self.{bad[0]}{via}, which a server "
                    f"method of {cls.__qualname__} sets: a deployed client never holds the server's value; send it "
                    "with the aggregate, or keep the client's own copy in session.protocol_state"
                )
            todo += [c for c in calls - seen if c not in CLIENT_METHODS or c == name]
            seen |= calls


def own_state(protocol: Any) -> dict[str, Any]:
    """The declared ``state_attrs`` of ``protocol`` as checkpointable values."""
    out: dict[str, Any] = {}
    for name in declared(type(protocol), STATE):
        value = getattr(protocol, name)
        out[name] = {"state_dict": value.state_dict()} if hasattr(value, "load_state_dict") else value
    return out


def load_own_state(protocol: Any, state: dict[str, Any]) -> None:
    """Restore :func:`own_state` onto ``protocol`` (ValueError naming a missing or unexpected attribute)."""
    names = declared(type(protocol), STATE)
    missing, extra = [n for n in names if n not in state], sorted(set(state) - set(names))
    if missing or extra:
        raise ValueError(
            f"the checkpoint's state of {type(protocol).__name__} "
            + (f"lacks {', '.join(missing)}" if missing else f"holds unknown {', '.join(extra)}")
        )
    for name in names:
        current, saved = getattr(protocol, name), state[name]
        if hasattr(current, "load_state_dict") and isinstance(saved, dict) and "state_dict" in saved:
            current.load_state_dict(saved["state_dict"])
        else:
            setattr(protocol, name, saved)


def server_state(protocol: Any) -> dict[str, Any]:
    """What a resumed server needs of ``protocol``: its declared ``state_attrs`` under its class's name, and a
    wrapper's inner protocol's (its ``inner``) under ``inner``; the checkpoint saves it every round."""
    out: dict[str, Any] = {"class": type(protocol).__name__, "state": own_state(protocol)}
    inner = getattr(protocol, "inner", None)
    if inner is not None:
        out["inner"] = server_state(inner)
    return out


def load_server_state(protocol: Any, state: dict[str, Any]) -> None:
    """Restore :func:`server_state` onto ``protocol`` on resume (after ``server_begin``); ValueError when the
    checkpoint holds another class's state or other attributes."""
    if state.get("class") != type(protocol).__name__:
        raise ValueError(f"the checkpoint holds the state of {state.get('class')}, not of {type(protocol).__name__}")
    load_own_state(protocol, state["state"])
    inner = getattr(protocol, "inner", None)
    if inner is not None:
        load_server_state(inner, state["inner"])


def _digest(value: Any, hasher: Any, depth: int = 0) -> None:
    """Feed ``value``'s content to ``hasher`` (tensors by their bytes; objects by their attributes, 4 levels)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        hasher.update(f"T{tuple(tensor.shape)}{tensor.dtype}".encode())
        hasher.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, dict):
        hasher.update(b"{")
        for key in sorted(value, key=repr):
            hasher.update(repr(key).encode())
            _digest(value[key], hasher, depth)
    elif isinstance(value, (list, tuple, set, frozenset)):
        hasher.update(f"[{type(value).__name__}{len(value)}".encode())
        for item in sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value:
            _digest(item, hasher, depth)
    elif isinstance(value, (int, float, str, bytes, bool, type(None))):
        hasher.update(repr(value).encode())
    elif depth < 4 and hasattr(value, "__dict__") and not callable(value):
        hasher.update(type(value).__name__.encode())
        for key, item in sorted(vars(value).items()):
            hasher.update(key.encode())
            _digest(item, hasher, depth + 1)
    else:
        hasher.update(type(value).__name__.encode())


def fingerprint(protocol: Any) -> dict[str, str]:
    """A digest of every attribute of ``protocol`` that its class declares neither as state nor as scratch."""
    skip = {n for which in DECLARED for n in declared(type(protocol), which)} | ALWAYS_FIXED
    out = {}
    for name, value in vars(protocol).items():
        if name in skip:
            continue
        hasher = hashlib.sha1()
        _digest(value, hasher)
        out[name] = hasher.hexdigest()
    return out


def undeclared_changes(before: dict[str, str], protocol: Any) -> list[str]:
    """The undeclared attributes of ``protocol`` whose content differs from the fingerprint ``before``."""
    now = fingerprint(protocol)
    return sorted(n for n in set(before) | set(now) if before.get(n) != now.get(n))


__all__ = [
    "CLIENT_METHODS",
    "HOOK",
    "SCRATCH",
    "START",
    "ServerStateReadError",
    "check_client_half",
    "STATE",
    "UndeclaredStateError",
    "check_declared",
    "load_server_state",
    "server_state",
    "declared",
    "fingerprint",
    "load_own_state",
    "own_state",
    "undeclared_changes",
]
