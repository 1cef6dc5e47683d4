"""Deterministic splitting of a parallel corpus into test, public and per-client IID shards."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from trustformer.data.corpus import Pair

__all__ = ["Splits", "split_corpus"]


@dataclass(frozen=True)
class Splits:
    """A corpus split into pairwise-disjoint parts.

    ``public`` is for tokenizer training only and belongs to no client; ``clients`` holds one IID
    shard per client; ``test`` is the shared held-out test set.
    """

    public: list[Pair]
    clients: list[list[Pair]]
    test: list[Pair]

    def sizes(self) -> dict[str, int | list[int]]:
        """Number of pairs per part, e.g. ``{"public": 500, "clients": [200, 200], "test": 100}``."""
        return {
            "public": len(self.public),
            "clients": [len(shard) for shard in self.clients],
            "test": len(self.test),
        }


def split_corpus(
    pairs: Iterable[Pair],
    *,
    n_clients: int,
    client_size: int | None,
    test_size: int,
    public_size: int,
    seed: int,
    max_words: int | None = None,
) -> Splits:
    """Split pairs into a held-out test set, a public split and ``n_clients`` IID shards.

    Pairs are deduplicated by source text (so no source sentence can land in two parts), optionally
    filtered to at most ``max_words`` words per side, sorted, and shuffled with ``random.Random(seed)``.
    The shuffled list is then cut in order: test set, public split, client shards. The test set thus
    depends only on the corpus, ``max_words`` and the seed, not on the client sizes.
    ``client_size=None`` shares the remainder equally between the clients.

    Raises ``ValueError`` when the corpus is too small for the requested sizes.
    """
    _check_arguments(n_clients, client_size, test_size, public_size, max_words)
    given, usable = _usable_pairs(pairs, max_words)
    rng = random.Random(seed)
    rng.shuffle(usable)

    available = len(usable) - test_size - public_size
    per_client = client_size if client_size is not None else max(available, 0) // n_clients
    needed = test_size + public_size + n_clients * max(per_client, 1)
    if per_client < 1 or available < n_clients * per_client:
        raise ValueError(_too_small_message(given, len(usable), max_words, test_size, public_size,
                                            n_clients, client_size, needed))

    test = usable[:test_size]
    public = usable[test_size:test_size + public_size]
    start = test_size + public_size
    clients = [usable[start + i * per_client:start + (i + 1) * per_client] for i in range(n_clients)]
    return Splits(public=public, clients=clients, test=test)


def _check_arguments(
    n_clients: int, client_size: int | None, test_size: int, public_size: int, max_words: int | None
) -> None:
    """Reject impossible sizes before touching the data."""
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if client_size is not None and client_size < 1:
        raise ValueError(f"client_size must be >= 1 or None, got {client_size}")
    if test_size < 0 or public_size < 0:
        raise ValueError(f"test_size and public_size must be >= 0, got {test_size} and {public_size}")
    if max_words is not None and max_words < 1:
        raise ValueError(f"max_words must be >= 1 or None, got {max_words}")


def _usable_pairs(pairs: Iterable[Pair], max_words: int | None) -> tuple[int, list[Pair]]:
    """Count the given pairs; return them deduplicated by source, length-filtered and sorted."""
    given = 0
    by_source: dict[str, str] = {}
    for source, target in sorted(pairs):
        given += 1
        if max_words is not None and (len(source.split()) > max_words or len(target.split()) > max_words):
            continue
        by_source.setdefault(source, target)  # sorted input: the smallest target wins
    return given, sorted(by_source.items())


def _too_small_message(
    given: int,
    usable: int,
    max_words: int | None,
    test_size: int,
    public_size: int,
    n_clients: int,
    client_size: int | None,
    needed: int,
) -> str:
    """Explain, with numbers, why the corpus cannot be split as requested."""
    filters = "deduplicated by source" + (f", at most {max_words} words per side" if max_words else "")
    per_client = f"{client_size}" if client_size is not None else "at least 1 (remainder shared)"
    return (
        f"corpus too small: {usable} usable pairs ({filters}; {given} given), but test_size={test_size} "
        f"+ public_size={public_size} + {n_clients} clients x {per_client} pairs needs {needed}. "
        "Use a larger corpus or smaller sizes."
    )
