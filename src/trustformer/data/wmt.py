"""WMT19 pairs through Hugging Face ``datasets``: from the Hub, or from local files in the same row shape."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from .corpus_errors import CorpusUnavailableError
from .tsv import Pair

WMT19_DATASET = "wmt/wmt19"  # current Hub id of the dataset formerly loaded as "wmt19"


def load_wmt19(
    split: str = "train",
    *,
    limit: int | None = None,
    data_files: str | Sequence[str] | None = None,
    source_lang: str = "ru",
    target_lang: str = "en",
) -> list[Pair]:
    """WMT19 pairs through Hugging Face ``datasets``.

    Without ``data_files`` the ``ru-en`` configuration is read from the Hugging Face Hub (needs
    internet; with ``limit`` it is streamed, so only the first rows are fetched). With ``data_files``,
    local JSON / JSON-lines / Parquet / CSV files in the same row shape are read instead: each row holds
    a ``translation`` dict such as ``{"ru": "...", "en": "..."}``. Rows with an empty side are skipped.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    datasets = _import_datasets()
    rows: Iterable[dict]
    if data_files is not None:
        rows = _local_rows(datasets, data_files, split)
    else:
        config = _wmt19_config(source_lang, target_lang)
        rows = _hub_rows(datasets, config, split, streaming=limit is not None)
    pairs = _rows_to_pairs(rows, source_lang, target_lang, limit)
    if data_files is not None and not pairs:
        raise ValueError(f"no {source_lang}-{target_lang} pairs found in {data_files!r}")
    return pairs


def _import_datasets() -> Any:
    """Import ``datasets`` lazily, naming the optional extra when it is missing."""
    try:
        import datasets
    except ImportError as exc:
        raise CorpusUnavailableError(
            "WMT19 needs the Hugging Face `datasets` package: pip install trustformer[hf]. "
            f"Or use the default LibreOffice corpus or `--data FILE.tsv`. ({exc})"
        ) from exc
    return datasets


def _local_rows(datasets: Any, data_files: str | Sequence[str], split: str) -> Iterator[dict]:
    """Rows of local files, read with the builder their extension names."""
    files = [str(data_files)] if isinstance(data_files, (str, os.PathLike)) else [str(f) for f in data_files]
    if not files:
        raise ValueError("data_files is empty")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(f"WMT19-format data file(s) not found: {', '.join(missing)}")
    builder = _builder_for(files)
    with tempfile.TemporaryDirectory(prefix="trustformer-hf-") as cache:
        dataset = datasets.load_dataset(builder, data_files={split: files}, split=split, cache_dir=cache)
        rows = list(dataset)
    return iter(rows)


def _builder_for(files: Sequence[str]) -> str:
    """The ``datasets`` packaged builder for the files' extension."""
    kinds: set[str | None] = set()
    for name in files:
        lower = name.lower().removesuffix(".gz").removesuffix(".bz2").removesuffix(".xz")
        suffix = lower.rsplit(".", 1)[-1] if "." in lower else ""
        kinds.add({"json": "json", "jsonl": "json", "parquet": "parquet", "csv": "csv"}.get(suffix))
    if None in kinds or len(kinds) != 1:
        raise ValueError(f"data_files must all be .json/.jsonl, .parquet or .csv files of one kind, got {list(files)}")
    return cast(str, kinds.pop())  # None was excluded just above


def _wmt19_config(source_lang: str, target_lang: str) -> str:
    """WMT19 configurations pair a language with English, named ``xx-en`` (e.g. ``ru-en``)."""
    langs = {source_lang, target_lang}
    if "en" not in langs or len(langs) != 2:
        raise ValueError(f"WMT19 pairs English with another language, got {source_lang}->{target_lang}")
    (other,) = langs - {"en"}
    return f"{other}-en"


def _hub_rows(datasets: Any, config: str, split: str, *, streaming: bool) -> Iterable[dict]:
    """Rows of WMT19 from the Hub, turning failures into ``CorpusUnavailableError``."""
    try:
        return datasets.load_dataset(WMT19_DATASET, config, split=split, streaming=streaming)
    except Exception as exc:  # noqa: BLE001 - network, hub and cache errors come in many types
        raise CorpusUnavailableError(
            f"could not load {WMT19_DATASET} ({config}, split {split!r}) from the Hugging Face Hub: "
            f"{type(exc).__name__}: {exc}. The Hub needs network access (or a filled Hugging Face cache "
            "with HF_DATASETS_OFFLINE=1). Alternatively pass local files with data_files=..., use the "
            "default LibreOffice corpus, or `--data FILE.tsv`."
        ) from exc


def _rows_to_pairs(rows: Iterable[dict], source_lang: str, target_lang: str, limit: int | None) -> list[Pair]:
    """Extract (source, target) pairs from rows in the WMT19 shape."""
    pairs: list[Pair] = []
    if limit == 0:
        return pairs
    for index, row in enumerate(rows):
        translation = row.get("translation", row)
        if not isinstance(translation, dict) or source_lang not in translation or target_lang not in translation:
            raise ValueError(
                f"row {index} is not in the WMT19 shape: expected a 'translation' dict with "
                f"{source_lang!r} and {target_lang!r} keys, got keys {sorted(row)}"
            )
        source = " ".join(str(translation[source_lang] or "").split())
        target = " ".join(str(translation[target_lang] or "").split())
        if source and target:
            pairs.append((source, target))
            if limit is not None and len(pairs) >= limit:
                break
    return pairs


__all__ = ["WMT19_DATASET", "load_wmt19"]
