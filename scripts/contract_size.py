"""The size of the protocol contract and of the product, as issue-style figures (docs/architecture.md): overridable
names of a protocol (FederatedProtocol and its optional parts), hand forwards in the wrapper bases, declared scratch
attributes, ConfigError raised outside config/, product files over 400 and 600 lines, and the experiments'
imports from the product (none allowed).

Usage: .venv/bin/python scripts/contract_size.py
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import trustformer
import trustformer.protocols as protocols
from trustformer.protocols.interface import base, parts
from trustformer.protocols.wrappers import base as wrapper_base

SRC = Path(trustformer.__file__).parent


def public_methods(cls: type) -> list[str]:
    return [n for n, v in cls.__dict__.items() if callable(v) and not n.startswith("_")]


def main() -> None:
    core = [n for n in public_methods(base.FederatedProtocol) if n not in ("innermost",)]
    optional = {
        c.__name__: public_methods(c)
        for c in (parts.LocalTraining, parts.ServerHooks, parts.CatchUp, parts.PayloadCoding)
    }
    print(
        f"overridable names: {len(core)} core + {sum(map(len, optional.values()))} in parts "
        f"({', '.join(f'{k} {len(v)}' for k, v in optional.items())})"
    )
    forwards = {
        c.__name__: [n for n in public_methods(c) if n not in ("innermost",)]
        for c in (wrapper_base.ProtocolWrapper, wrapper_base.InnerServerHooks, wrapper_base.InnerCatchUp)
    }
    print(
        f"hand forwards: {sum(map(len, forwards.values()))} ({', '.join(f'{k} {len(v)}' for k, v in forwards.items())})"
    )
    declared: dict[str, set[tuple[str, str]]] = {"scratch_attrs": set(), "start_attrs": set(), "hook_attrs": set()}
    for info in pkgutil.walk_packages(protocols.__path__, "trustformer.protocols."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            for which, found in declared.items():
                if cls.__module__ == module.__name__ and which in cls.__dict__:
                    found.update((cls.__name__, a) for a in cls.__dict__[which])
    scratch = sorted(f"{c}.{a}" for c, a in declared["scratch_attrs"])
    print(f"scratch attributes: {len(scratch)} ({', '.join(scratch)})")
    print(f"start attributes (set only in server_begin, checked): {len(declared['start_attrs'])}")
    hooks = sorted(f"{c}.{a}" for c, a in declared["hook_attrs"])
    print(f"hook attributes (set only in __init__, checked): {len(hooks)} ({', '.join(hooks)})")
    raised = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("config/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
                if name == "ConfigError":
                    raised.append(f"{rel}:{node.lineno}")
    print(f"ConfigError raised outside config/: {len(raised)} ({', '.join(raised)})")
    sizes = {p.relative_to(SRC).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in SRC.rglob("*.py")}
    large = sorted(((v, k) for k, v in sizes.items() if v > 400), reverse=True)
    print(
        f"product files over 600 lines: {sum(v > 600 for v in sizes.values())}; over 400: {len(large)} "
        f"({', '.join(f'{k} {v}' for v, k in large)})"
    )


if __name__ == "__main__":
    main()
