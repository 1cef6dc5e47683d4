"""The protocol registry: every ``federation.strategy`` and the module that declares it (its ``SPEC``, a
``protocols.interface.spec.ProtocolSpec``). Adding a protocol is one module under ``protocols/`` and one line here.

Modules are imported when a spec is first asked for, so the configuration can list the strategies without
importing the protocols (which import the configuration).
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

PROTOCOLS: dict[str, str] = {  # federation.strategy -> module under trustformer.protocols
    "fedavg": "fedavg",
    "local": "local",
    "centralized": "centralized",
    "trustformer": "trustformer",
    "fedavg-topk": "fedavg_topk",
    "dp-fedavg": "dp_fedavg",
    "dp-fedsam": "dp_fedsam",
    "dp-blur-lus": "dp_blur_lus",
    "fedpc": "fedpc",
    "phong": "phong",
    "fedprox": "fedprox",
    "scaffold": "scaffold",
}


@cache
def protocol_spec(name: str) -> Any:
    """The ``ProtocolSpec`` of strategy ``name`` (KeyError naming the known ones)."""
    if name not in PROTOCOLS:
        raise KeyError(f"unknown strategy {name!r} (known: {', '.join(PROTOCOLS)})")
    spec = importlib.import_module(f"trustformer.protocols.{PROTOCOLS[name]}").SPEC
    if spec.name != name:
        raise RuntimeError(f"trustformer.protocols.{PROTOCOLS[name]} declares {spec.name!r}, registered as {name!r}")
    return spec


def protocol_specs() -> list[Any]:
    """Every registered protocol's spec, in registry order."""
    return [protocol_spec(name) for name in PROTOCOLS]


__all__ = ["PROTOCOLS", "protocol_spec", "protocol_specs"]
