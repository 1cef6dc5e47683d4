"""The configuration reference (``docs/configuration.md``), generated from the config classes themselves.

Every key of :class:`~trustformer.config.RunConfig` with its type, its default (the ``small`` preset's value) and
the comment written beside its declaration in the ``config`` package's section modules (the line's trailing
comment, or the comment lines just above it). ``trustformer config --reference`` prints it; a test fails when the
committed file is stale.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize
import typing
from typing import Any

from ..registry import protocol_specs
from . import PRESETS, TASK_PRESETS, RunConfig


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source: its line's trailing comment, else the comment block above it."""
    source = inspect.getsource(cls)
    trailing = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    comments: dict[str, str] = {}
    pending: list[str] = []
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        name = stripped.split(":", 1)[0].strip()
        if ":" in stripped and name.isidentifier() and name not in comments:
            text = trailing.get(number) or " ".join(pending)
            if text:
                comments[name] = text
        pending = []
    return comments


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        return (
            f"list of {_type_name(args[0])}"
            if args[-1:] == (Ellipsis,)
            else "[" + ", ".join(_type_name(a) for a in args) + "]"
        )
    return getattr(hint, "__name__", str(hint))


def _value(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def reference() -> str:
    """The whole reference as Markdown."""
    default = RunConfig()
    lines = [
        "# Configuration reference",
        "",
        "Generated from the config classes (`src/trustformer/config/`, and each protocol's own section in its "
        "module) by `trustformer config --reference`; "
        "a test fails when this file is stale. Every key can be set in a TOML file (`--config FILE`, sections "
        "as below) or on the command line (`--set section.key=value`). Defaults are the `small` preset's; "
        "the presets change what the table at the end lists. Precedence: preset < `--config` < options.",
        "",
    ]
    hints = typing.get_type_hints(RunConfig)
    top = [
        f for f in dataclasses.fields(RunConfig) if not dataclasses.is_dataclass(hints[f.name]) and f.name != "sections"
    ]
    comments = _comments(RunConfig)
    lines += ["## Top level", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{f.name}` | {_type_name(hints[f.name])} | `{_value(getattr(default, f.name))}` | "
        f"{comments.get(f.name, '').replace('|', chr(92) + '|')} |"
        for f in top
    ]
    sections = [
        (f.name, hints[f.name], getattr(default, f.name))
        for f in dataclasses.fields(RunConfig)
        if dataclasses.is_dataclass(hints[f.name])
    ]
    sections += [(spec.name, spec.section, spec.section()) for spec in protocol_specs() if spec.section is not None]
    for name, cls, section in sections:
        lines += _section_lines(name, cls, section)
    lines += ["", "## Presets", "", "What each preset changes (`--preset`; `small` is the defaults above).", ""]
    for name, values in PRESETS.items():
        lines.append(f"- `{name}`: " + (", ".join(f"`{k}`" for k in _flat(values)) or "the defaults"))
    for task, presets in TASK_PRESETS.items():
        for name, values in presets.items():
            lines.append(f'- `{name}` with `task = "{task}"`: ' + ", ".join(f"`{k}`" for k in _flat(values)))
    from .run import deprecated_keys

    lines += ["", "## Deprecated keys", "", "Still read for one release, with a warning that names the new key.", ""]
    lines += ["| old key | new key |", "|---|---|"]
    lines += [f"| `{old}` | `{section}.{key}` |" for old, (section, key) in deprecated_keys().items()]
    return "\n".join(lines) + "\n"


def _section_lines(name: str, cls: type, section: Any) -> list[str]:
    """The table of one section, ``[name]``: its docstring's first paragraph, then every key."""
    doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
    if doc.startswith(cls.__name__ + "("):  # no docstring of its own: the dataclass's generated signature
        doc = ""
    section_hints, section_comments = typing.get_type_hints(cls), _comments(cls)
    lines = ["", f"## `[{name}]`", ""] + ([doc, ""] if doc else [])
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(cls):
        meaning = section_comments.get(field.name, "").replace("|", "\\|")
        lines.append(
            f"| `{name}.{field.name}` | {_type_name(section_hints[field.name])} | "
            f"`{_value(getattr(section, field.name))}` | {meaning} |"
        )
    return lines


def _flat(values: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key} = {_value(tuple(value) if isinstance(value, list) else value)}")
    return out


__all__ = ["reference"]
