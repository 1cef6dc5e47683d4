"""Parallel corpora as TSV files: ``source<TAB>target`` per line, optionally ``<TAB>domain`` (strict UTF-8, read
and written atomically)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

Pair = tuple[str, str]
"""A translation pair: (source = Russian, target = English)."""


def load_tsv(path: str | os.PathLike[str]) -> list[Pair]:
    """Read a strict UTF-8 TSV corpus, one ``source<TAB>target`` pair per line (see ``load_tsv_domains``;
    a domain column, if any, is dropped)."""
    return load_tsv_domains(path)[0]


def check_corpus_file(path: Path) -> None:
    """A corpus path must name a readable file (ValueError saying what it names instead)."""
    if path.is_dir():
        raise ValueError(
            f"{path} is a folder: --data (data.path) takes one TSV file of `source<TAB>target` "
            "lines (optionally `<TAB>domain`); to use several files, concatenate them"
        )
    if not path.exists():
        raise ValueError(f"{path} does not exist: --data (data.path) takes a TSV file of `source<TAB>target` lines")


def load_tsv_domains(path: str | os.PathLike[str]) -> tuple[list[Pair], list[str] | None]:
    """Read a strict UTF-8 TSV corpus: ``source<TAB>target`` per line, or ``source<TAB>target<TAB>domain``
    on every line (the domain names the part of the corpus a pair comes from, e.g. a help module).

    Returns the pairs and, for a file with the domain column, the domain of each pair (else ``None``).
    Blank lines are skipped. A line with the wrong number of tabs (or a different number than the first
    line), an empty field, or invalid UTF-8 raises ``ValueError`` naming the file and the 1-based line
    number; so does a file with no pairs at all.
    """
    path = Path(path)
    check_corpus_file(path)
    pairs: list[Pair] = []
    domains: list[str] = []
    columns: int | None = None
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            fields = _parse_tsv_line(raw, path, number, columns)
            if fields is None:
                continue
            columns = len(fields)
            pairs.append((fields[0], fields[1]))
            if columns == 3:
                domains.append(fields[2])
    if not pairs:
        raise ValueError(f"{path}: no pairs found (expected one `source<TAB>target` per line)")
    return pairs, (domains if columns == 3 else None)


def _parse_tsv_line(raw: bytes, path: Path, number: int, columns: int | None) -> tuple[str, ...] | None:
    """Parse one TSV line into 2 or 3 fields (``columns``: what earlier lines had); ``None`` for a blank line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}, line {number}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    line = line.rstrip("\r\n")
    if not line.strip():
        return None
    tabs = line.count("\t")
    if tabs not in (1, 2) or (columns is not None and tabs != columns - 1):
        expected = {
            None: "exactly one tab between source and target (or two, with a domain column on every line)",
            2: "exactly one tab between source and target, like the lines before",
            3: "two tabs (source, target, domain), like the lines before",
        }[columns]
        raise ValueError(f"{path}, line {number}: expected {expected}, found {tabs}")
    fields = tuple(side.strip() for side in line.split("\t"))
    for name, text in zip(("source", "target", "domain"), fields, strict=False):
        if not text:
            raise ValueError(
                f"{path}, line {number}: empty {name} side"
                if name != "domain"
                else f"{path}, line {number}: empty domain column"
            )
    return fields


def write_tsv(pairs: Iterable[Pair], path: str | os.PathLike[str], domains: Sequence[str] | None = None) -> None:
    """Write pairs (and a third ``domain`` column when ``domains`` is given) as UTF-8 TSV atomically."""
    path = Path(path)
    pairs = list(pairs)
    if domains is not None and len(domains) != len(pairs):
        raise ValueError(f"{len(domains)} domains for {len(pairs)} pairs")
    lines = []
    for i, (source, target) in enumerate(pairs):
        fields = (source, target) if domains is None else (source, target, domains[i])
        if any(ch in text for text in fields for ch in "\t\n\r") or not all(fields):
            raise ValueError(
                f"pair contains a tab or newline, or an empty field, and cannot be written as TSV: {source!r}"
            )
        lines.append("\t".join(fields) + "\n")
    write_atomic(path, "".join(lines))


def write_atomic(path: Path, text: str) -> None:
    """Write text to ``path`` through a temporary file in the same folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["Pair", "check_corpus_file", "load_tsv", "load_tsv_domains", "write_atomic", "write_tsv"]
