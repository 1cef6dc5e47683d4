"""Deterministic splitting of a parallel corpus into test, public and per-client shards.

Client shards follow ``partition``:

* ``iid``: consecutive slices of one shuffled list (every client sees every domain in proportion);
* ``domain``: each client holds whole domains (e.g. LibreOffice help modules), disjoint between
  clients — domains are dealt largest first to the client with the fewest pairs so far;
* ``dirichlet``: each domain's pairs are divided between the clients in Dirichlet(α) proportions
  (flwr-datasets' ``DirichletPartitioner`` over a ``datasets.Dataset``, Hsu et al. 2019): α → ∞ is
  IID, small α gives each client a few dominant domains.

The test and public splits are always drawn first from the shuffled corpus, so the shared test set
covers every domain in proportion and does not depend on the partition or the client sizes.

With ``own_test_size``, every client also holds out that many pairs of what it is dealt, before its
training shard is cut: its own-distribution test set (its domains, never trained on by anyone), which
also gives the membership attack its non-members.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from trustformer.data.tsv import Pair

__all__ = ["PARTITIONS", "Splits", "split_corpus"]

PARTITIONS = ("iid", "domain", "dirichlet")


@dataclass(frozen=True)
class Splits:
    """A corpus split into pairwise-disjoint parts.

    ``public`` is for tokenizer training only and belongs to no client; ``clients`` holds one shard
    per client; ``test`` is the shared held-out test set. With a corpus that names domains,
    ``client_domains`` (and ``test_domains``) give the number of pairs of each domain per part.
    """

    public: list[Pair]
    clients: list[list[Pair]]
    test: list[Pair]
    client_domains: list[dict[str, int]] = field(default_factory=list)
    test_domains: dict[str, int] = field(default_factory=dict)
    client_tests: list[list[Pair]] = field(default_factory=list)  # each client's held-out own-distribution pairs

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
    domains: Sequence[str] | None = None,
    partition: str = "iid",
    alpha: float = 0.5,
    client_sizes: Sequence[int] | None = None,
    own_test_size: int = 0,
) -> Splits:
    """Split pairs into a held-out test set, a public split and ``n_clients`` shards.

    Pairs are deduplicated by source text (so no source sentence can land in two parts), optionally
    filtered to at most ``max_words`` words per side, sorted, and shuffled with ``random.Random(seed)``.
    The shuffled list is then cut in order: test set, public split, then the client pool, which is
    divided by ``partition`` (module docstring). ``domains`` (parallel to ``pairs``) labels each pair;
    ``domain`` and ``dirichlet`` need it. Client ``i`` gets ``client_sizes[i]`` pairs if given, else
    ``client_size``; ``None`` shares the pool (iid: equally; other partitions: all a client is dealt).
    ``own_test_size`` pairs of what each client is dealt are held out first (``Splits.client_tests``).

    Raises ``ValueError`` when the corpus is too small for the requested sizes or the partition
    cannot be made (the message names the option to change).
    """
    _check_arguments(n_clients, client_size, test_size, public_size, max_words)
    if partition not in PARTITIONS:
        raise ValueError(f"partition {partition!r} is not one of {', '.join(PARTITIONS)}")
    if client_sizes is not None and (len(client_sizes) != n_clients or any(size < 1 for size in client_sizes)):
        raise ValueError(
            f"client_sizes {list(client_sizes)} must give a size >= 1 for each of the "
            f"{n_clients} clients (data.client_sizes)"
        )
    if partition != "iid" and domains is None:
        raise ValueError(
            f"partition {partition!r} needs a domain for every pair: the corpus has none "
            '(a TSV file needs a third column `domain`; or use data.partition = "iid")'
        )
    if domains is not None:
        pairs = list(pairs)
        if len(domains) != len(pairs):
            raise ValueError(f"{len(domains)} domains given for {len(pairs)} pairs")
    given, usable, domain_of = _usable_pairs(pairs, max_words, domains)
    rng = random.Random(seed)
    rng.shuffle(usable)

    available = len(usable) - test_size - public_size
    test = usable[:test_size]
    public = usable[test_size : test_size + public_size]
    pool = usable[test_size + public_size :]
    own_tests: list[list[Pair]] = []
    if partition == "iid":
        available -= own_test_size * n_clients
        sizes = (
            list(client_sizes)
            if client_sizes is not None
            else [client_size if client_size is not None else max(available, 0) // n_clients] * n_clients
        )
        needed = test_size + public_size + sum(max(size, 1) + own_test_size for size in sizes)
        if min(sizes) < 1 or available < sum(sizes):
            raise ValueError(
                _too_small_message(
                    given, len(usable), max_words, test_size, public_size, n_clients, client_size, needed, client_sizes
                )
            )
        starts = [sum(sizes[:i]) + own_test_size * i for i in range(n_clients)]
        own_tests = [pool[start : start + own_test_size] for start in starts]
        clients = [
            pool[start + own_test_size : start + own_test_size + size]
            for start, size in zip(starts, sizes, strict=True)
        ]
    else:
        wanted = list(client_sizes) if client_sizes is not None else [client_size] * n_clients
        labels = [domain_of[source] for source, _ in pool]
        groups = (
            _deal_domains(labels, n_clients)
            if partition == "domain"
            else _dirichlet_groups(labels, n_clients, alpha, seed, wanted)
        )
        clients = []
        for i, indices in enumerate(groups):
            shard = [pool[j] for j in indices]
            random.Random(f"{seed}/client/{i}").shuffle(shard)
            size = wanted[i]
            if len(shard) < (size or 1) + own_test_size:
                dealt = sorted(Counter(labels[j] for j in indices))
                raise ValueError(
                    f"partition {partition!r}: client {i} is dealt {len(shard)} pairs (domains {', '.join(dealt)}), "
                    f"fewer than the {size or 1} requested + {own_test_size} held out (data.own_test_size); lower "
                    "data.client_size / data.client_sizes (0 = all a client is dealt) or data.own_test_size"
                    + (", or raise data.alpha" if partition == "dirichlet" else "")
                )
            own_tests.append(shard[:own_test_size])
            shard = shard[own_test_size:]
            clients.append(shard[:size] if size is not None else shard)
    client_domains = (
        [dict(sorted(Counter(domain_of[s] for s, _ in shard).items())) for shard in clients] if domain_of else []
    )
    test_domains = dict(sorted(Counter(domain_of[s] for s, _ in test).items())) if domain_of else {}
    return Splits(
        public=public,
        clients=clients,
        test=test,
        client_domains=client_domains,
        test_domains=test_domains,
        client_tests=own_tests if own_test_size else [],
    )


def _deal_domains(labels: Sequence[str], n_clients: int) -> list[list[int]]:
    """Whole domains per client, disjoint: largest domain first to the client with the fewest pairs."""
    by_domain: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_domain.setdefault(label, []).append(index)
    if len(by_domain) < n_clients:
        raise ValueError(
            f"partition 'domain' needs at least as many domains as clients: the client pool has "
            f"{len(by_domain)} ({', '.join(sorted(by_domain))}) for {n_clients} clients; use fewer "
            'clients or data.partition = "dirichlet"'
        )
    groups: list[list[int]] = [[] for _ in range(n_clients)]
    for label in sorted(by_domain, key=lambda d: (-len(by_domain[d]), d)):
        target = min(range(n_clients), key=lambda i: (len(groups[i]), i))
        groups[target].extend(by_domain[label])
    return groups


def _dirichlet_groups(
    labels: Sequence[str], n_clients: int, alpha: float, seed: int, wanted: Sequence[int | None]
) -> list[list[int]]:
    """Dirichlet(α) shares of every domain per client, by flwr-datasets' ``DirichletPartitioner``."""
    try:
        from datasets import Dataset
        from flwr_datasets.partitioner import DirichletPartitioner
    except ImportError as exc:  # pragma: no cover - both are dependencies
        raise ValueError(f"partition 'dirichlet' needs flwr-datasets and datasets ({exc})") from exc
    smallest = min((size for size in wanted if size is not None), default=1)
    partitioner = DirichletPartitioner(
        num_partitions=n_clients,
        partition_by="domain",
        alpha=alpha,
        min_partition_size=smallest,
        self_balancing=False,
        shuffle=True,
        seed=seed % 2**32,
    )
    partitioner.dataset = Dataset.from_dict({"index": list(range(len(labels))), "domain": list(labels)})
    try:
        return [list(partitioner.load_partition(i)["index"]) for i in range(n_clients)]
    except ValueError as exc:
        raise ValueError(
            f"partition 'dirichlet' (alpha {alpha}) found no split giving every client at least "
            f"{smallest} pairs ({exc}); lower data.client_size / data.client_sizes or raise data.alpha"
        ) from exc


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


def _usable_pairs(
    pairs: Iterable[Pair], max_words: int | None, domains: Sequence[str] | None = None
) -> tuple[int, list[Pair], dict[str, str]]:
    """Count the given pairs; return them deduplicated by source, length-filtered and sorted, and the
    domain of each kept source (empty without domains)."""
    given = 0
    by_source: dict[str, str] = {}
    domain_of: dict[str, str] = {}
    labelled = (
        sorted(zip(pairs, domains, strict=True)) if domains is not None else [(pair, "") for pair in sorted(pairs)]
    )
    for (source, target), domain in labelled:
        given += 1
        if max_words is not None and (len(source.split()) > max_words or len(target.split()) > max_words):
            continue
        if source not in by_source:  # sorted input: the smallest target wins
            by_source[source] = target
            if domains is not None:
                domain_of[source] = domain
    return given, sorted(by_source.items()), domain_of


def _too_small_message(
    given: int,
    usable: int,
    max_words: int | None,
    test_size: int,
    public_size: int,
    n_clients: int,
    client_size: int | None,
    needed: int,
    client_sizes: Sequence[int] | None = None,
) -> str:
    """Explain, with numbers, why the corpus cannot be split as requested."""
    filters = "deduplicated by source" + (f", at most {max_words} words per side" if max_words else "")
    per_client = f"{client_size}" if client_size is not None else "at least 1 (remainder shared)"
    if client_sizes is not None:
        per_client = f"({', '.join(map(str, client_sizes))})"
    return (
        f"corpus too small: {usable} usable pairs ({filters}; {given} given), but test_size={test_size} "
        f"+ public_size={public_size} + {n_clients} clients x {per_client} pairs needs {needed}. "
        "Use a larger corpus or smaller sizes."
    )
