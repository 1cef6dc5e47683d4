"""The numbers the FedPC paper publishes (Section 5), to put beside ours.

Table 1: centralized accuracy (CIFAR-10: ResNet50 FIXUP, 250 epochs; LGGS: U-Net, 35 epochs).
Table 2: test accuracy on CIFAR-10, class-stratified imbalanced split (Section 5.2.2), N = 3…10.
Table 3: test "accuracy" on the LGG segmentation set (LGGS) with the same kind of split; the paper does
not say which accuracy, read here as pixel accuracy (it prints no Dice).
Table 4: test accuracy on CIFAR-10 split by a Dirichlet distribution (Section 5.2.3), N = 3, 5, 7, 10.
Figure 6: bytes exchanged per epoch against N, published only as a chart; Eq. 8 gives its FedPC curve,
D = V(N+1) + V(N−1)/16, and 2VN the baselines' (V: 35 MB for ResNet50 FIXUP, 119 MB for U-Net), with
"at least 31.25%" saved (N = 3) and "up to 42.20%" (N = 10).

Tables 2–4 are headed "FedPC | Phong et al. [2] | FedAvg [1]" while the text cites Phong et al. as [1]
and FedAvg as [2]; the columns are taken as headed. Values are (mean, standard deviation) as printed;
Table 4 prints no deviation (None).
"""

from __future__ import annotations

PAPER_SETUP = {
    "image-classification": "CIFAR-10 (50,000 training / 10,000 test images), ResNet50 FIXUP, momentum SGD, "
    "batch 128/64/32 per worker, lr 0.01 decayed by steps, 250 epochs, GPUs",
    "segmentation": "LGG MRI segmentation (Kaggle, 80:20 split), U-Net at 256×256, Adam, batch 16/8/4 per "
    "worker, lr 0.01 decayed by steps, 35 epochs, GPUs",
}
PAPER_DATASET = {"image-classification": "CIFAR-10", "segmentation": "LGGS"}
METHODS = ("fedpc", "phong", "fedavg")  # the column order of Tables 2-4
NAMES = {"fedpc": "FedPC", "phong": "Phong et al.", "fedavg": "FedAvg", "centralized": "Centralized"}

# Table 1: centralized training (mean, std)
TABLE1 = {"image-classification": (0.9172, 0.0008), "segmentation": (0.9959, 0.0004)}

# Table 2: CIFAR-10, class-stratified imbalanced split; N -> method -> (mean, std)
TABLE2: dict[int, dict[str, tuple[float, float | None]]] = {
    n: dict(zip(METHODS, row, strict=False))
    for n, row in {
        3: ((0.9009, 0.0031), (0.9101, 0.0030), (0.9113, 0.0014)),
        4: ((0.8914, 0.0030), (0.9119, 0.0024), (0.9044, 0.0053)),
        5: ((0.8819, 0.0024), (0.9115, 0.0038), (0.9021, 0.0030)),
        6: ((0.8752, 0.0041), (0.9134, 0.0034), (0.8992, 0.0029)),
        7: ((0.8697, 0.0011), (0.9102, 0.0028), (0.8935, 0.0001)),
        8: ((0.8632, 0.0057), (0.9117, 0.0026), (0.8906, 0.0013)),
        9: ((0.8471, 0.0011), (0.9095, 0.0010), (0.8824, 0.0013)),
        10: ((0.8388, 0.0015), (0.9120, 0.0011), (0.8772, 0.0023)),
    }.items()
}

# Table 3: LGGS, imbalanced split; N -> method -> (mean, std)
TABLE3: dict[int, dict[str, tuple[float, float | None]]] = {
    n: dict(zip(METHODS, row, strict=False))
    for n, row in {
        3: ((0.9952, 0.0001), (0.9966, 0.0001), (0.9959, 0.0001)),
        4: ((0.9951, 0.0003), (0.9913, 0.0044), (0.9955, 0.0005)),
        5: ((0.9887, 0.0001), (0.9962, 0.0001), (0.9926, 0.0034)),
        6: ((0.9915, 0.0025), (0.9936, 0.0042), (0.9944, 0.0012)),
        7: ((0.9914, 0.0023), (0.9926, 0.0055), (0.9942, 0.0012)),
        8: ((0.9925, 0.0010), (0.9912, 0.0043), (0.9904, 0.0019)),
        9: ((0.9901, 0.0024), (0.9936, 0.0043), (0.9938, 0.0006)),
        10: ((0.9887, 0.0001), (0.9959, 0.0005), (0.9887, 0.0002)),
    }.items()
}

# Table 4: CIFAR-10, Dirichlet split; N -> method -> (value, None)
TABLE4: dict[int, dict[str, tuple[float, float | None]]] = {
    n: {m: (v, None) for m, v in zip(METHODS, row, strict=False)}
    for n, row in {
        3: (0.8927, 0.9051, 0.9016),
        5: (0.8564, 0.8955, 0.8879),
        7: (0.8317, 0.8941, 0.8751),
        10: (0.8001, 0.8934, 0.8540),
    }.items()
}

# Figure 6 (Section 5.2.4): model sizes and the savings the text states
FIG6_MODEL_MB = {"image-classification": 35, "segmentation": 119}
FIG6_SAVED = {3: 0.3125, 10: 0.4220}  # "at least 31.25%", "up to 42.20%" less than 2VN


def eq8_bytes(v: float, n: int) -> float:
    """Eq. 8: FedPC's bytes per epoch, D = V(N+1) + V(N−1)/16 (V: one float32 model)."""
    return v * (n + 1) + v * (n - 1) / 16


def baseline_bytes(v: float, n: int) -> float:
    """FedAvg's and Phong et al.'s bytes per epoch, 2VN."""
    return 2 * v * n


def published(table: str, n: int, method: str) -> tuple[float, float | None] | None:
    """(mean, std) printed in ``table`` ("table2" | "table3" | "table4") for N = ``n``, or None."""
    return {"table2": TABLE2, "table3": TABLE3, "table4": TABLE4}[table].get(n, {}).get(method)


def fmt(value: tuple[float, float | None] | None) -> str:
    """A printed value as in the paper: ``0.9009 ± 0.0031`` (or ``0.8927``)."""
    if value is None:
        return ""
    mean, std = value
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"
