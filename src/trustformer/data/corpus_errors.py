"""The error every corpus loader raises when its corpus cannot be obtained, and the alternatives it names."""

from __future__ import annotations

from ..errors import TrustformerError

ALTERNATIVES = (
    "Alternatives: pass your own corpus with `--data FILE.tsv` (one `source<TAB>target` pair per line), "
    'or set `data.source = "wmt19"` (needs internet access and `pip install trustformer[hf]`).'
)


class CorpusUnavailableError(TrustformerError, RuntimeError):
    """A corpus cannot be obtained on this machine (missing tools, network or packages)."""


__all__ = ["ALTERNATIVES", "CorpusUnavailableError"]
