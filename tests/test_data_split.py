"""Deterministic, disjoint corpus splits."""

from __future__ import annotations

import pytest

from trustformer.data.split import Splits, split_corpus


def make_corpus(n: int) -> list[tuple[str, str]]:
    """n distinct pairs whose length in words grows with the index."""
    return [
        (f"предложение {i} " + "слово " * (i % 7), f"sentence {i} " + "word " * (i % 5))
        for i in range(n)
    ]


def sources(pairs: list[tuple[str, str]]) -> set[str]:
    return {source for source, _ in pairs}


def parts(splits: Splits) -> list[list[tuple[str, str]]]:
    return [splits.test, splits.public, *splits.clients]


def test_sizes_as_requested() -> None:
    splits = split_corpus(make_corpus(1000), n_clients=3, client_size=200, test_size=100, public_size=150, seed=1)
    assert splits.sizes() == {"public": 150, "clients": [200, 200, 200], "test": 100}


def test_parts_are_pairwise_disjoint_by_source() -> None:
    corpus = make_corpus(600)
    # the same source with another translation must not end up in two parts
    corpus += [(source, target + " (alternative)") for source, target in corpus[:300]]
    splits = split_corpus(corpus, n_clients=4, client_size=None, test_size=50, public_size=50, seed=3)
    seen: set[str] = set()
    for part in parts(splits):
        part_sources = sources(part)
        assert len(part_sources) == len(part)
        assert not part_sources & seen
        seen |= part_sources
    assert len(seen) == 600


def test_remainder_shared_equally() -> None:
    splits = split_corpus(make_corpus(1003), n_clients=4, client_size=None, test_size=100, public_size=100, seed=0)
    assert splits.sizes()["clients"] == [200, 200, 200, 200]


def test_deterministic_for_a_seed_and_independent_of_input_order() -> None:
    corpus = make_corpus(500)
    first = split_corpus(corpus, n_clients=2, client_size=100, test_size=50, public_size=50, seed=7)
    again = split_corpus(list(reversed(corpus)), n_clients=2, client_size=100, test_size=50, public_size=50, seed=7)
    assert first == again


def test_other_seed_gives_other_split() -> None:
    corpus = make_corpus(500)
    first = split_corpus(corpus, n_clients=2, client_size=100, test_size=50, public_size=50, seed=7)
    other = split_corpus(corpus, n_clients=2, client_size=100, test_size=50, public_size=50, seed=8)
    assert first.test != other.test and first.clients != other.clients


def test_does_not_use_global_random_state() -> None:
    import random

    corpus = make_corpus(300)
    random.seed(1)
    first = split_corpus(corpus, n_clients=2, client_size=50, test_size=20, public_size=20, seed=5)
    random.seed(2)
    again = split_corpus(corpus, n_clients=2, client_size=50, test_size=20, public_size=20, seed=5)
    assert first == again


def test_test_set_does_not_depend_on_client_sizes() -> None:
    corpus = make_corpus(800)
    small = split_corpus(corpus, n_clients=2, client_size=50, test_size=40, public_size=30, seed=2)
    large = split_corpus(corpus, n_clients=5, client_size=100, test_size=40, public_size=30, seed=2)
    assert small.test == large.test and small.public == large.public


def test_max_words_filter() -> None:
    corpus = make_corpus(700)
    splits = split_corpus(corpus, n_clients=2, client_size=None, test_size=20, public_size=20, seed=0, max_words=4)
    for part in parts(splits):
        assert all(len(s.split()) <= 4 and len(t.split()) <= 4 for s, t in part)
    assert sum(len(part) for part in parts(splits)) < 700


def test_too_small_corpus_raises_with_numbers() -> None:
    with pytest.raises(ValueError) as info:
        split_corpus(make_corpus(100), n_clients=3, client_size=40, test_size=10, public_size=10, seed=0)
    message = str(info.value)
    assert "100 usable pairs" in message and "140" in message


def test_too_small_for_equal_shares_raises() -> None:
    with pytest.raises(ValueError, match="corpus too small"):
        split_corpus(make_corpus(12), n_clients=3, client_size=None, test_size=5, public_size=5, seed=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_clients": 0, "client_size": 10, "test_size": 1, "public_size": 1},
        {"n_clients": 1, "client_size": 0, "test_size": 1, "public_size": 1},
        {"n_clients": 1, "client_size": 10, "test_size": -1, "public_size": 1},
    ],
)
def test_invalid_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        split_corpus(make_corpus(100), seed=0, **kwargs)
