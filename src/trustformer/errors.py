"""The one base class of every error that describes a problem with the input, the data, the environment or a
peer, rather than a bug. The command line catches it and prints its message without a traceback (set
``TRUSTFORMER_DEBUG=1`` to see one), so a new error class only has to derive from it."""

from __future__ import annotations


class TrustformerError(Exception):
    """A problem the user can act on; the message names it and, where there is one, the option that fixes it."""


class UncheckedConfigError(TrustformerError, RuntimeError):
    """A run reached a composition the configuration refuses when it loads (``config/composition.py``): the
    configuration was built without ``validate()``. Every rule is checked once, at load, where the user gets its
    ``ConfigError``; this one only says which rule a caller skipped."""


__all__ = ["TrustformerError", "UncheckedConfigError"]
