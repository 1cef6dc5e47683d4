"""Plain (TOML/JSON) values to config dataclasses and back: each value coerced to its field's type, unknown keys
refused."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

from .checks import ConfigError


def build(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a table, got {values!r}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise unknown_key(prefix, str(unknown[0]), known)
    kwargs = {}
    for f in fields(cls):
        if f.name not in values:
            continue
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        if isinstance(hint, type) and is_dataclass(hint):
            kwargs[f.name] = build(hint, values[f.name], prefix=f"{key}.")
        else:
            kwargs[f.name] = _coerce(key, values[f.name], hint)
    return cls(**kwargs)


def did_you_mean(name: str, candidates: Iterable[str], prefix: str = "") -> str:
    """``": did you mean train.lr?"``: the closest of ``candidates`` to a mistyped ``name`` (each shown after
    ``prefix``; those about as close as the closest), or "" when none is close."""
    scored = sorted(
        ((difflib.SequenceMatcher(None, name, c).ratio(), c) for c in set(candidates)), key=lambda t: (-t[0], t[1])
    )
    close = [c for score, c in scored if score >= 0.6 and score >= scored[0][0] - 0.1][:3]
    return f": did you mean {' or '.join(prefix + c for c in close)}?" if close else ""


def unknown_key(prefix: str, name: str, known: Iterable[str], elsewhere: Iterable[str] = ()) -> ConfigError:
    """The error of key ``prefix + name``, not one of the ``known`` keys of its table: the closest known keys,
    else the dotted keys of ``elsewhere`` (other tables' keys) named ``name`` (``fedprox.mu`` for ``federation.mu``)."""
    known = sorted(known)
    moved = sorted(k for k in elsewhere if k.rpartition(".")[2] == name)
    hint = did_you_mean(name, known, prefix) or (f": did you mean {' or '.join(moved)}?" if moved else "")
    return ConfigError(f"unknown config key {prefix}{name}{hint} (valid keys here: {', '.join(known)})")


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type ``hint`` (a scalar, ``tuple[T, ...]`` or a fixed tuple), or a ConfigError
    naming ``key``."""
    if get_origin(hint) is tuple:
        return _coerce_tuple(key, value, get_args(hint))
    check = _SCALARS.get(hint)
    if check is None:
        raise TypeError(f"unsupported config type {hint!r} for {key}")  # pragma: no cover
    return check(key, value)


def _coerce_tuple(key: str, value: Any, item_types: tuple[Any, ...]) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} = {value!r} must be a list")
    if item_types[-1:] == (Ellipsis,):  # tuple[T, ...]: a list of any length
        return tuple(_coerce(key, v, item_types[0]) for v in value)
    if len(value) != len(item_types):
        raise ConfigError(f"{key} = {list(value)!r} must have {len(item_types)} items")
    return tuple(_coerce(key, v, t) for v, t in zip(value, item_types, strict=True))


def _as_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} = {value!r} must be true or false")
    return value


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} = {value!r} must be an integer")
    return value


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} = {value!r} must be a number")
    if not math.isfinite(value):
        raise ConfigError(f"{key} = {value!r} must be finite")
    return float(value)


def _as_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r} must be a string")
    return value


_SCALARS: dict[Any, Callable[[str, Any], Any]] = {bool: _as_bool, int: _as_int, float: _as_float, str: _as_str}


def to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value
