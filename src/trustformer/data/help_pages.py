"""LibreOffice help pages: the visible text of their paragraphs, and the Russian and English pages aligned into
pairs by (file, element id, occurrence)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from .corpus_errors import ALTERNATIVES, CorpusUnavailableError
from .tsv import Pair

HELP_ROOT = Path("usr/share/libreoffice/help")

_CYRILLIC = re.compile(r"[\u0400-\u0481\u048A-\u052F]")
_PARAGRAPH_ID = re.compile(r"^[A-Za-z]+_id\w*$")
_VOID_TAGS = frozenset(
    ["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"]
)
_SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template"})
_CLOSES_P = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "div",
        "dl",
        "fieldset",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "menu",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "table",
        "ul",
    ]
)


class _HelpPageParser(HTMLParser):
    """Collect the visible text of elements whose id looks like ``par_id…`` or ``hd_id…``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._stack: list[str] = []
        self._hidden: list[int] = []  # stack depths of open hidden elements
        self._open: list[tuple[int, str, list[str]]] = []  # (depth, id, text chunks)
        self.paragraphs: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID_TAGS:
            if tag == "br":
                self._add_text(" ")
            return
        if tag in _CLOSES_P and self._stack and self._stack[-1] == "p":
            self._close_from(len(self._stack) - 1)
        depth = len(self._stack)
        self._stack.append(tag)
        attributes = dict(attrs)
        element_id = attributes.get("id") or ""
        if tag in _SKIPPED_TAGS or _is_hidden(attributes, element_id):
            self._hidden.append(depth)
        if _PARAGRAPH_ID.match(element_id):
            self._open.append((depth, element_id, []))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self._add_text(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID_TAGS or tag not in self._stack:
            return
        depth = len(self._stack) - 1 - self._stack[::-1].index(tag)
        self._close_from(depth)

    def handle_data(self, data: str) -> None:
        self._add_text(data)

    def close(self) -> None:
        super().close()
        self._close_from(0)

    def _add_text(self, text: str) -> None:
        if self._hidden:
            return
        for _, _, chunks in self._open:
            chunks.append(text)

    def _close_from(self, depth: int) -> None:
        """Close every open element at stack depth ``depth`` or deeper."""
        del self._stack[depth:]
        self._hidden = [d for d in self._hidden if d < depth]
        while self._open and self._open[-1][0] >= depth:
            _, element_id, chunks = self._open.pop()
            self.paragraphs.append((element_id, " ".join("".join(chunks).split())))


def _is_hidden(attributes: dict[str, str | None], element_id: str) -> bool:
    """Hidden alternatives are not shown, except the ``default…`` one the help viewer displays."""
    return "hidden" in attributes and not element_id.startswith("default")


def extract_help_paragraphs(html: str) -> dict[tuple[str, int], str]:
    """Map (element id, occurrence index) to whitespace-normalised visible text of one help page."""
    parser = _HelpPageParser()
    parser.feed(html)
    parser.close()
    seen: dict[str, int] = {}
    out: dict[tuple[str, int], str] = {}
    for element_id, text in parser.paragraphs:
        occurrence = seen.get(element_id, 0)
        seen[element_id] = occurrence + 1
        out[(element_id, occurrence)] = text
    return out


HELP_MODULES = {
    "swriter": "writer",
    "scalc": "calc",
    "simpress": "impress",
    "sdraw": "draw",
    "sdatabase": "base",
    "smath": "math",
    "sbasic": "basic",
    "schart": "chart",
    "shared": "shared",
}
"""Help folders (``text/<folder>/``) and the module name a pair from them is labelled with."""


def help_module(relative: Path) -> str:
    """The LibreOffice module of a help page, from its path under the language folder
    (``text/scalc/01/…`` → ``calc``); pages outside ``text/<module>/`` are ``other``."""
    parts = relative.parts
    if len(parts) >= 3 and parts[0] == "text":
        return HELP_MODULES.get(parts[1], parts[1])
    return "other"


def align_help_trees(ru_root: Path, en_root: Path) -> list[Pair]:
    """Align the help pages of two language folders into sorted, deduplicated (ru, en) pairs."""
    return [(ru, en) for ru, en, _ in align_help_modules(ru_root, en_root)]


def align_help_modules(ru_root: Path, en_root: Path) -> list[tuple[str, str, str]]:
    """Sorted, deduplicated (ru, en, module) triples; a pair found in several modules' pages keeps the
    module of its first page in path order."""
    if not ru_root.is_dir() or not en_root.is_dir():
        raise CorpusUnavailableError(
            f"help folders not found after unpacking ({ru_root.name}, {en_root.name} under {HELP_ROOT}). {ALTERNATIVES}"
        )
    modules: dict[Pair, str] = {}
    for relative in sorted(p.relative_to(en_root) for p in en_root.rglob("*.html")):
        ru_page = ru_root / relative
        if not ru_page.is_file():
            continue
        en_par = extract_help_paragraphs((en_root / relative).read_text(encoding="utf-8", errors="replace"))
        ru_par = extract_help_paragraphs(ru_page.read_text(encoding="utf-8", errors="replace"))
        module = help_module(relative)
        for key in sorted(en_par.keys() & ru_par.keys()):
            pair = (ru_par[key], en_par[key])
            if _keep_pair(pair):
                modules.setdefault(pair, module)
    return sorted((ru, en, module) for (ru, en), module in modules.items())


def _keep_pair(pair: Pair) -> bool:
    """Drop empty, untranslated (ru == en) and non-Cyrillic Russian sides."""
    ru, en = pair
    return bool(ru) and bool(en) and ru != en and _CYRILLIC.search(ru) is not None


__all__ = [
    "HELP_MODULES",
    "HELP_ROOT",
    "align_help_modules",
    "align_help_trees",
    "extract_help_paragraphs",
    "help_module",
]
