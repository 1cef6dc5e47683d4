"""The numbers the Trustformer paper publishes (Section 7.3), to put beside ours.

Table III: data in transit between one client and the server per epoch (KB; the FedAvg figure,
782,003 KB, is the paper's whole model, about 200 M float32 parameters with a 250k vocabulary, so
"KB" reads as KiB). Table IV: seconds per epoch (training, clustering, aggregation, total).
Table V: total hours for Agg_fr = 1, 2, 5, 10 by Eq. 5 with e = 10 epochs. Figure 6 (BLEU, METEOR,
BERTScore F1) is published only as a chart: there are no quality numbers to compare with.

Keys: a strategy name, or ``trustformer@<beta>`` for a Trustformer row.
"""

from __future__ import annotations

PAPER_EPOCHS = 10  # e in Eq. 5 (the paper trains 10 epochs)
PAPER_AGG_EVERY = (1, 2, 5, 10)
PAPER_MODEL_KIB = 782_003  # Table III, FedAvg row: one whole model
PAPER_SETUP = (
    "3 clients × 20,000 WMT19 ru-en pairs, 1,000 held-out test pairs, Transformer d_model 256, 8 heads, "
    "6+6 layers, FFN 512, XLM-R tokenizer (250k pieces), 10 epochs, GPU"
)

NAMES = {
    "fedavg": "FedAvg",
    "dp-fedavg": "DP-FedAvg",
    "dp-fedsam": "DP-FedSAM",
    "dp-blur-lus": "DP-BLUR-LUS",
    "trustformer": "Trustformer",
    "local": "No aggregation",
    "centralized": "Centralized",
}
ORDER = ("fedavg", "dp-fedavg", "dp-fedsam", "dp-blur-lus", "trustformer", "local", "centralized")

_BETAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

# Table III (KB per client per epoch)
TABLE3_KIB: dict[str, float] = {
    "fedavg": 782_003,
    "dp-fedavg": 782_003,
    "dp-fedsam": 782_003,
    "dp-blur-lus": 515_952,
    **{
        f"trustformer@{b}": v
        for b, v in zip(
            _BETAS, (78_019, 156_127, 234_140, 312_248, 390_368, 468_380, 546_488, 624_500, 702_608), strict=True
        )
    },
}

# Table IV (seconds per epoch): training, clustering, aggregation, total (as printed)
TABLE4_S: dict[str, tuple[float, float, float, float]] = {
    "fedavg": (479, 0, 17, 496),
    "dp-fedavg": (563, 0, 11, 664),  # printed total; 563 + 0 + 11 = 574
    "dp-fedsam": (442, 0, 10, 452),
    "dp-blur-lus": (417, 0, 4, 421),
    **{
        f"trustformer@{b}": v
        for b, v in zip(
            _BETAS,
            (
                (491, 564, 1, 1_056),
                (484, 1_287, 4, 1_775),
                (478, 1_090, 5, 1_573),
                (473, 2_310, 7, 2_790),
                (479, 3_291, 10, 3_780),
                (475, 3_438, 11, 3_924),
                (476, 3_296, 15, 3_787),
                (472, 2_502, 17, 2_991),
                (477, 1_156, 19, 1_652),
            ),
            strict=True,
        )
    },
}

# Table V (hours) for Agg_fr = 1, 2, 5, 10
TABLE5_H: dict[str, tuple[float, float, float, float]] = {
    "fedavg": (2.08, 1.71, 1.48, 1.40),
    "dp-fedavg": (1.87, 1.72, 1.62, 1.59),
    "dp-fedsam": (1.50, 1.36, 1.28, 1.25),
    "dp-blur-lus": (1.27, 1.21, 1.18, 1.17),
    **{
        f"trustformer@{b}": v
        for b, v in zip(
            _BETAS,
            (
                (2.90, 2.16, 1.68, 1.52),
                (5.03, 3.19, 2.08, 1.71),
                (4.49, 2.90, 1.96, 1.64),
                (7.93, 4.62, 2.63, 1.97),
                (10.78, 4.85, 3.22, 2.27),
                (11.17, 6.24, 3.29, 2.30),
                (10.90, 6.11, 3.23, 2.28),
                (8.64, 4.99, 2.77, 2.04),
                (5.05, 3.19, 2.07, 1.69),
            ),
            strict=True,
        )
    },
}


def paper_key(strategy: str, beta: float | None) -> str:
    """The key of a method in the tables above (Trustformer rows are per β, rounded to 0.1)."""
    if strategy == "trustformer" and beta is not None:
        return f"trustformer@{round(beta, 1)}" if abs(beta * 10 - round(beta * 10)) < 1e-9 else f"trustformer@{beta}"
    return strategy


def eq5_total_s(
    train_s: float, client_exchange_s: float, aggregate_s: float, *, epochs: int, agg_every: int, exchanges: bool = True
) -> float:
    """Eq. 5: T_total = e·max_i T_l + (e / Agg_fr)·max_i (T_c + T_agg), from per-epoch times.

    ``train_s`` is max_i T_l^(i) (seconds per epoch); ``client_exchange_s`` is max_i T_c^(i) (the
    client's work for one exchange: clustering for Trustformer, clipping/noising/applying for the
    others); ``aggregate_s`` is T_agg (server, per exchange). A strategy that never exchanges
    (local, centralized) pays the first term only.
    """
    total = epochs * train_s
    if exchanges:
        total += epochs / agg_every * (client_exchange_s + aggregate_s)
    return total


def paper_eq5_check_h(key: str) -> tuple[float, ...] | None:
    """Eq. 5 applied to the paper's own Table IV (hours, Agg_fr = 1, 2, 5, 10): a consistency check of
    Table V (the Trustformer rows agree within a few %, the baselines' do not)."""
    if key not in TABLE4_S:
        return None
    train, cluster, aggregate, _total = TABLE4_S[key]
    return tuple(
        eq5_total_s(train, cluster, aggregate, epochs=PAPER_EPOCHS, agg_every=a) / 3600 for a in PAPER_AGG_EVERY
    )
