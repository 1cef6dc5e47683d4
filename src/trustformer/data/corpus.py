"""Parallel Russian→English corpora: the offline LibreOffice help corpus, TSV files and WMT19.

Every loader returns a list of ``(source, target)`` pairs where the source is Russian and the target
English. The default corpus is built from Debian's LibreOffice help packages (see ``DATA.md``): the
Russian and English help pages carry the same paragraph ids, so paragraphs join on
(file, element id, occurrence). The help text is licensed MPL-2.0 by The Document Foundation; the built
corpus keeps that attribution in ``LICENSE-NOTICE.txt`` beside ``pairs.tsv``.

The loaders live beside this module, one job each: ``tsv.py`` (TSV files), ``debian_build.py`` (the Debian
build and its cache) with ``help_pages.py`` (HTML alignment), and ``wmt.py`` (WMT19); this module gives the
LibreOffice corpus's entry points and the cache folder, and re-exports the rest.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .corpus_errors import CorpusUnavailableError
from .debian_build import (
    CORPUS_NAME,
    LIBREOFFICE_PACKAGES,
    Progress,
    build_libreoffice_corpus,
    find_cached_corpus,
)
from .help_pages import align_help_trees, extract_help_paragraphs, help_module
from .tsv import Pair, load_tsv, load_tsv_domains, write_tsv
from .wmt import load_wmt19

__all__ = [
    "CorpusUnavailableError",
    "LIBREOFFICE_PACKAGES",
    "Pair",
    "align_help_trees",
    "default_cache_dir",
    "extract_help_paragraphs",
    "load_libreoffice_corpus",
    "load_tsv",
    "load_tsv_domains",
    "load_libreoffice_domains",
    "help_module",
    "load_wmt19",
    "write_tsv",
]

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """Cache folder for built data: ``$TRUSTFORMER_CACHE`` if set, else ``~/.cache/trustformer``."""
    env = os.environ.get("TRUSTFORMER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trustformer"


def load_libreoffice_corpus(cache_dir: Path | None = None, *, progress: Progress | None = None) -> list[Pair]:
    """Russian→English pairs aligned from Debian's LibreOffice help packages (see
    ``load_libreoffice_domains``, which also returns each pair's help module)."""
    return load_libreoffice_domains(cache_dir, progress=progress)[0]


def load_libreoffice_domains(
    cache_dir: Path | None = None, *, progress: Progress | None = None
) -> tuple[list[Pair], list[str]]:
    """Russian→English pairs aligned from Debian's LibreOffice help packages, and the help module
    (``HELP_MODULES``: writer, calc, impress, draw, base, math, basic, chart, shared) of each pair.

    The first call downloads ``libreoffice-help-en-us`` and ``libreoffice-help-ru`` with
    ``apt-get download``, unpacks them with ``dpkg-deb -x``, aligns the help paragraphs and caches the
    result as ``<cache_dir>/libreoffice-ru-en/<version>/pairs.tsv`` (``source<TAB>target<TAB>module``, with
    ``LICENSE-NOTICE.txt``). Later calls read the cache and never call apt. The result is deduplicated and
    sorted, so it is identical on every machine for the same package version.

    Raises ``CorpusUnavailableError`` when the packages cannot be obtained.
    """
    report = progress or (lambda message: logger.info("%s", message))
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    corpus_root = root / CORPUS_NAME
    cached = find_cached_corpus(corpus_root)
    if cached is not None:
        report(f"using cached corpus {cached}")
        pairs, domains = load_tsv_domains(cached)
        assert domains is not None  # find_cached_corpus keeps files with the domain column only
        return pairs, domains
    return build_libreoffice_corpus(corpus_root, report)
