"""The secure channel's error: the run cannot go on (``channel.py`` and its steps)."""

from __future__ import annotations

from ..wire import FederationError


class SecureChannelError(FederationError):
    """The secure channel cannot go on (too few attested clients, a secure-aggregation step failed)."""


__all__ = ["SecureChannelError"]
