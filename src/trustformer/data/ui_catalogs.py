"""A public Russian–English corpus from Debian's user-interface message catalogs (``train.public_source =
"debian-ui"``), built the way the default corpus is: ``apt-get download``, ``dpkg-deb -x``, parsed, aligned and
cached as ``<cache>/debian-ui-ru-en/<version>/pairs.tsv`` with its licence notice.

A gettext catalog (``.mo``) of a Russian translation maps each English source string (``msgid``, after an optional
``msgctxt`` and ``\\x04``) to its Russian translation (``msgstr``): every entry is an aligned pair. Only the
programs' own interface strings are read (``…/ru/LC_MESSAGES/*.mo``), not help or documentation pages. Cleaning:
mnemonic markers (``~``, and ``_`` before a letter) and line breaks go, and a pair is dropped when its Russian side
has no Cyrillic letter (untranslated), equals its English side, or either side is empty or carries markup. Plural
entries are read in their singular form. Deduplicating against the clients' data and the test sets is the public
model's step (:func:`trustformer.tasks.public.public_pairs`), which records how many pairs it dropped.
"""

from __future__ import annotations

import gettext
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .corpus_errors import ALTERNATIVES, CorpusUnavailableError
from .debian_build import Progress, apt_download, deb_version, require_tools, run_tool, version_folder
from .tsv import Pair, load_tsv, write_atomic, write_tsv

UI_PACKAGES = ("libreoffice-l10n-ru",)
"""The Debian packages whose Russian UI catalogs are read (LibreOffice's: about 19,000 distinct pairs)."""
CORPUS_NAME = "debian-ui-ru-en"
_CYRILLIC = re.compile(r"[А-Яа-яЁё]")
_MARKUP = re.compile(r"<[^>]*>|\$\(|\\[nt]")


def clean(text: str) -> str:
    """A catalog string as a sentence: no mnemonic markers (``~``, and a string's one ``_`` before a letter unless
    it joins a name such as ``ISEVEN_ADD``), no line breaks, single spaces."""
    text = text.replace("~", "")
    at = text.find("_")
    if at >= 0 and text.count("_") == 1 and not _joins_a_name(text, at):
        text = re.sub(r"_(?=\w)", "", text)
    return " ".join(text.split())


def _joins_a_name(text: str, at: int) -> bool:
    """Whether the ``_`` at ``at`` sits between capitals or digits (``ISEVEN_ADD``, ``ЕЧЁТН_ADD``)."""
    before, after = text[at - 1 : at], text[at + 1 : at + 2]
    return all(c and (c.isupper() or c.isdigit()) for c in (before, after))


def catalog_pairs(path: Path) -> list[Pair]:
    """The (Russian, English) pairs of one ``.mo`` catalog, cleaned (module docstring)."""
    with path.open("rb") as handle:
        try:
            catalog = gettext.GNUTranslations(handle)._catalog  # type: ignore[attr-defined]
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise CorpusUnavailableError(f"{path} is not a readable gettext catalog: {exc}") from exc
    pairs = []
    for key, value in catalog.items():
        if isinstance(key, tuple):  # a plural form: the singular's entry (index 0) stands for it
            if key[1] != 0:
                continue
            key = key[0]
        english, russian = clean(str(key).split("\x04")[-1]), clean(str(value))
        if not english or not russian or russian == english or not _CYRILLIC.search(russian):
            continue
        if _MARKUP.search(english) or _MARKUP.search(russian):
            continue
        pairs.append((russian, english))
    return pairs


def ui_catalogs(root: Path) -> list[Path]:
    """Every Russian interface catalog under ``root`` (an unpacked package tree): ``…/ru/LC_MESSAGES/*.mo``."""
    return sorted(p for p in root.rglob("*.mo") if p.parent.name == "LC_MESSAGES" and p.parent.parent.name == "ru")


def tree_pairs(root: Path) -> list[Pair]:
    """The distinct pairs of every Russian UI catalog under ``root``, in a fixed order (catalog, then entry)."""
    return distinct(pair for path in ui_catalogs(root) for pair in sorted(catalog_pairs(path)))


def distinct(pairs: Iterable[Pair]) -> list[Pair]:
    seen: set[Pair] = set()
    return [p for p in pairs if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def load_ui_corpus(cache_root: Path, report: Progress, packages: tuple[str, ...] = UI_PACKAGES) -> list[Pair]:
    """The cached UI corpus of ``packages`` (the highest version built), else built now: downloaded, unpacked,
    parsed and written under ``cache_root / CORPUS_NAME``."""
    root = cache_root / CORPUS_NAME
    cached = sorted(root.glob("*/pairs.tsv"))
    if cached:
        return load_tsv(cached[-1])
    require_tools()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
        work = Path(tmp)
        report(f"downloading {', '.join(packages)} with apt-get…")
        debs = apt_download(packages, work)
        versions = {name: deb_version(deb) for name, deb in debs.items()}
        for deb in debs.values():
            run_tool(["dpkg-deb", "-x", str(deb), str(work / "tree")], what=f"unpacking {deb.name}")
        pairs = tree_pairs(work / "tree")
        if not pairs:
            raise CorpusUnavailableError(f"no Russian UI catalog pairs in {', '.join(packages)}. {ALTERNATIVES}")
        target = root / version_folder(versions)
        write_atomic(target / "LICENSE-NOTICE.txt", _license_notice(versions, len(pairs)))
        write_tsv(pairs, target / "pairs.tsv")
        report(f"{len(pairs)} UI pairs from {len(ui_catalogs(work / 'tree'))} catalogs: wrote {target / 'pairs.tsv'}")
    return pairs


def _license_notice(versions: dict[str, str], n_pairs: int) -> str:
    packages = "\n".join(f"  {name} {versions[name]}" for name in sorted(versions))
    return (
        "Russian-English user-interface strings\n"
        "======================================\n\n"
        f"{n_pairs} string pairs read from the Russian gettext catalogs (msgid -> msgstr) of the Debian packages:\n"
        f"{packages}\n\n"
        "LibreOffice's translations are Copyright (c) The Document Foundation and its contributors, licensed under\n"
        "the Mozilla Public License, v. 2.0 (MPL-2.0): https://mozilla.org/MPL/2.0/. Source:\n"
        "https://www.libreoffice.org/. pairs.tsv is redistributed under the same licence.\n"
    )


__all__ = ["CORPUS_NAME", "UI_PACKAGES", "catalog_pairs", "clean", "load_ui_corpus", "tree_pairs", "ui_catalogs"]
