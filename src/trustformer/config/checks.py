"""The configuration's error and the small value checks every section's ``validate`` uses."""

from __future__ import annotations

import difflib
from typing import Any

from ..errors import TrustformerError


class ConfigError(TrustformerError, ValueError):
    """A configuration value or key is invalid; the message names the key and the value."""


def check_choice(key: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        names = [str(a) for a in allowed]
        close = difflib.get_close_matches(str(value), names, n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ConfigError(f"{key} = {value!r} is not one of: {', '.join(names)}{hint}")


def check_at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(f"{key} = {value!r} must be >= {low}")


def check_positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key} = {value!r} must be > 0")


def check_in_range(key: str, value: float, lo: float, hi: float, *, lo_open=False, hi_open=False) -> None:
    too_low = value <= lo if lo_open else value < lo
    too_high = value >= hi if hi_open else value > hi
    if too_low or too_high:
        left, right = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ConfigError(f"{key} = {value!r} must be in {left}{lo}, {hi}{right}")
