"""The package's layers, checked on the import statements themselves (late imports inside functions count):
every import points down the table below, no package imports its importer, and the round's seams hold
(protocols import neither a task nor the runtime; nothing in ``secure/`` imports a protocol)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "trustformer"

# unit -> the units it may import (besides itself). A unit is a sub-package or a top-level module.
ALLOWED = {
    "__init__": set(),
    "__main__": {"cli"},
    "core": {"wire"},
    "errors": set(),  # TrustformerError: every unit may raise it (see BELOW_ALL)
    "wire": {"flower_internals"},  # Flower's wire format (content_wire_bytes)
    "flower_internals": set(),  # the one module that imports Flower's internal modules
    "registry": set(),  # imports the protocol modules by name, when a spec is asked for
    "config": {"registry"},
    "recording": set(),  # metrics.jsonl, summary.json and their mirror in experiment trackers
    "data": {"core"},
    "models": {"core"},
    "evaluation": {"models", "data", "core"},
    "tasks": {"config", "core", "data", "models", "evaluation"},
    "protocols": {"config", "core", "registry", "wire"},
    "secure": {"config", "core", "wire", "recording"},
    "runtime": {"config", "core", "wire", "recording", "protocols", "registry", "secure", "tasks", "export"},
    "app": {"config", "runtime", "secure", "wire"},
    "engine": {"app", "config", "core", "deploy", "flower_internals", "registry", "runtime", "secure", "tasks", "wire"},
    "export": {"config", "core", "data", "models", "evaluation", "tasks"},
    # runtime.checkpoint: the configuration of a resumed run (--resume); registry: the protocols' own sections, whose
    # settings name a run's default folder
    "cli_options": {"config", "registry", "runtime"},
    "deploy": {"cli_options", "config", "core", "registry", "runtime", "secure", "tasks", "wire"},
    "cli": {"*"},
}


def unit_of(module: str) -> str:
    """``trustformer.<unit>[...]``; a name the package's ``__init__`` defines (``__version__``) is ``__init__``."""
    parts = module.split(".")
    if len(parts) < 2 or not ((SRC / parts[1]).is_dir() or (SRC / f"{parts[1]}.py").exists()):
        return "__init__"
    return parts[1]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every ``trustformer`` import in a file, late ones included."""
    rel = path.relative_to(SRC.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("trustformer"):
                if target.count(".") == 0 or not node.module:  # `from . import x` / `from .. import x`
                    found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
                else:
                    found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("trustformer")]
    return found


def modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        yield ".".join(p for p in rel.parts if p != "__init__") or "trustformer", path


def test_every_import_points_down_the_layers():
    wrong = []
    for name, path in modules():
        unit = unit_of(name) if name != "trustformer" else "__init__"
        for line, target in imports_of(path):
            other = unit_of(target) if target != "trustformer" else "__init__"
            if other == unit or "*" in ALLOWED[unit] or other in ("__init__", "errors"):
                continue
            if other not in ALLOWED[unit]:
                wrong.append(f"{path.relative_to(SRC)}:{line} ({unit}) imports {target} ({other})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_product_imports_nothing_of_the_experiments():
    """``trustformer`` never imports ``trustformer_lab`` (benchmarks, attacks, reports, reproductions); the lab's
    commands reach the CLI through the entry-point group ``trustformer.commands``."""
    found = [
        f"{path.relative_to(SRC)}:{line} imports {target}"
        for _name, path in modules()
        for line, target in imports_of(path)
        if target == "trustformer_lab" or target.startswith("trustformer_lab.")
    ]
    assert not found, found
    assert not [p for p in SRC.rglob("*.py") if "trustformer_lab" in p.read_text(encoding="utf-8")]  # by name either


def test_every_unit_is_in_the_table():
    units = {unit_of(name) if name != "trustformer" else "__init__" for name, _ in modules()}
    assert units <= set(ALLOWED), sorted(units - set(ALLOWED))


def test_no_import_cycles_between_modules():
    graph: dict[str, set[str]] = {}
    names = {name for name, _ in modules()}
    for name, path in modules():
        graph[name] = set()
        for _line, target in imports_of(path):
            while target not in names and "." in target:
                target = target.rsplit(".", 1)[0]  # `from pkg.mod import name`
            if target in names and target != name:
                graph[name].add(target)
    # a package's __init__ is imported with every submodule: only edges between distinct modules count
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_secure_channel_names_no_protocol():
    from trustformer.config import STRATEGIES

    for path in (SRC / "secure").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for strategy in STRATEGIES:
            assert f'"{strategy}"' not in text and f"'{strategy}'" not in text, (path.name, strategy)


def test_every_error_class_of_the_project_derives_from_the_one_the_cli_catches():
    """A new error class that forgets the base would print a traceback instead of its message."""
    import importlib
    import inspect

    from trustformer.errors import TrustformerError

    strays = []
    for name, path in modules():
        if "Error(" not in path.read_text(encoding="utf-8"):
            continue
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Exception)
                and not issubclass(obj, Warning)  # a warning is printed as one, not caught as an error
                and obj.__module__ == name
                and not issubclass(obj, TrustformerError)
            ):
                strays.append(f"{name}.{attr}")
    assert not strays, f"derive these from trustformer.errors.TrustformerError: {strays}"
