"""Federated protocols, one module each, all driven by the same round loop (``trustformer.runtime.server``).

Each module declares its protocol in its ``SPEC`` (``interface/spec.py``); ``trustformer/registry.py`` maps every
``federation.strategy`` to its module. Every protocol is a ``interface.base.FederatedProtocol``; the layers around
one (coding, differential privacy, defences, the observer) are in ``wrappers/``.

:func:`observe` lets a measurement harness (``trustformer attack``) watch a run from the inside without
changing it: while an observer is active, every protocol object :func:`get_protocol` returns (the
server's and every client's) is wrapped so that the observer sees each client's trained model when it
builds its payload (ground truth that only the harness keeps; it is never sent), what it sent, what the
server's aggregation received and returned, and the aggregate each client applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from ..config import RunConfig
from ..errors import UncheckedConfigError
from ..registry import PROTOCOLS, protocol_spec
from .interface.base import ClientSession, FederatedProtocol
from .wrappers.base import bare, server_summary, start_server
from .wrappers.observed import ObservedProtocol, ProtocolObserver
from .wrappers.robust import with_defences
from .wrappers.server_optimizer import with_server_optimizer


def make_protocol(cfg: RunConfig, observer: ProtocolObserver | None = None) -> FederatedProtocol:
    """The protocol object named by ``federation.strategy``, with the server's defences (``robust.*``) around it,
    the server optimizer (``federation.server_optimizer``) around those, payload coding around that when
    ``federation.payload_bits`` < 32, and download coding outermost when ``federation.download_bits`` < 32;
    ``observer`` watches the optimized, defended protocol, inside the coding layers."""
    name = cfg.federation.strategy
    if name not in PROTOCOLS:
        raise UncheckedConfigError(  # checked at load (config/sections.py: STRATEGIES)
            f"federation.strategy = {name!r} is not a registered protocol (one of: {', '.join(PROTOCOLS)})"
        )
    protocol = protocol_spec(name).factory(cfg)
    if cfg.privacy.noise == "distributed":  # the owners' shares add up to the mechanism's noise in a plain mean
        protocol.spec = replace(protocol.spec, mean_weighting="uniform")
    protocol = with_defences(protocol)  # robust.*: the update bound and the aggregation rule, where in force
    # federation.server_optimizer: outside DP (the factory's) and the defences, so it steps with what they release
    # (the noisy mean: post-processing, no epsilon charged; the defended aggregate) and tells them what the clients
    # now hold; inside the observer (which then sees what the clients apply) and the coding layers, which decode the
    # payloads before it and code the step or model it returns
    protocol = with_server_optimizer(protocol)
    if observer is not None:
        protocol = ObservedProtocol(protocol, observer)
    if cfg.federation.payload_bits != 32:
        from .wrappers.coding import CodedPayload

        fed = cfg.federation
        protocol = CodedPayload(protocol, fed.payload_bits, fed.payload_scale, fed.payload_rounding)
    if cfg.federation.download_bits != 32:
        from .wrappers.download import CodedDownload

        protocol = CodedDownload(protocol, cfg.federation.download_bits, cfg.federation.payload_scale)
    return protocol


def get_protocol(cfg: RunConfig) -> FederatedProtocol:
    """The protocol object named by ``federation.strategy`` (observed while an :func:`observe` is active)."""
    return make_protocol(cfg, active_observer())


_observers: list[ProtocolObserver] = []


def active_observer() -> ProtocolObserver | None:
    """The observer :func:`get_protocol` wraps protocols with now (the innermost :func:`observe`), if any."""
    return _observers[-1] if _observers else None


@contextlib.contextmanager
def observe(observer: ProtocolObserver) -> Iterator[ProtocolObserver]:
    """While active, every protocol :func:`get_protocol` makes reports to ``observer`` (the innermost
    active observer when nested). Meant for in-process runs (``engine.inprocess``)."""
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


__all__ = [
    "PROTOCOLS",
    "ClientSession",
    "FederatedProtocol",
    "ObservedProtocol",
    "ProtocolObserver",
    "active_observer",
    "bare",
    "server_summary",
    "start_server",
    "get_protocol",
    "make_protocol",
    "observe",
]
