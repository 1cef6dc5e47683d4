"""Image and segmentation data loaders: idx files, digits, CIFAR-10 batches, MRI slices, LGG TIFFs."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from trustformer.tasks import image_data, seg_data
from trustformer.tasks.image_data import ImageDataError
from trustformer.tasks.seg_data import SegDataError


def write_idx(path, array: np.ndarray) -> None:
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def fake_fashion_folder(tmp_path, n_train=12, n_test=5):
    rng = np.random.default_rng(0)
    data = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels)
        data[prefix] = (images, labels)
    return data


def test_idx_offsets_and_fashion_loader(tmp_path):
    data = fake_fashion_folder(tmp_path)
    labels_raw = gzip.decompress((tmp_path / "train-labels-idx1-ubyte.gz").read_bytes())
    images_raw = gzip.decompress((tmp_path / "train-images-idx3-ubyte.gz").read_bytes())
    # the documented layout: labels at offset 8, images at offset 16
    assert labels_raw[8:] == data["train"][1].tobytes()
    assert images_raw[16:] == data["train"][0].tobytes()
    train, test = image_data.load_fashion_mnist(tmp_path)
    assert train.images.shape == (12, 1, 28, 28) and test.images.shape == (5, 1, 28, 28)
    assert torch.equal(train.images[:, 0], torch.from_numpy(data["train"][0]))
    assert torch.equal(test.labels, torch.from_numpy(data["t10k"][1].astype(np.int64)))
    assert train.classes[9] == "Ankle boot"


def test_idx_rejects_bad_files(tmp_path):
    bad = tmp_path / "x-idx1-ubyte.gz"
    with gzip.open(bad, "wb") as f:
        f.write(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(ImageDataError, match="header says"):
        image_data.read_idx(bad)
    with gzip.open(bad, "wb") as f:
        f.write(b"\x12\x34\x08\x01")
    with pytest.raises(ImageDataError, match="magic"):
        image_data.read_idx(bad)
    with pytest.raises(ImageDataError, match="dataset-fashion-mnist"):
        image_data.load_fashion_mnist(tmp_path / "nowhere")


@pytest.mark.skipif(
    not (image_data.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian's dataset-fashion-mnist is not installed",
)
def test_debian_fashion_mnist_test_labels():
    labels = image_data.read_idx(image_data.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
    assert labels.shape == (10_000,)
    assert np.bincount(labels).tolist() == [1000] * 10  # the test set is balanced


def test_digits_split_is_seeded_and_disjoint():
    a_train, a_test = image_data.load_digits_split(seed=3)
    b_train, b_test = image_data.load_digits_split(seed=3)
    assert torch.equal(a_test.images, b_test.images)
    assert len(a_train) + len(a_test) == 1797 and len(a_test) == 359
    assert a_train.images.dtype == torch.uint8 and int(a_train.images.max()) == 255
    c_train, _ = image_data.load_digits_split(seed=4)
    assert not torch.equal(a_train.labels, c_train.labels)


@pytest.mark.parametrize("bytes_keys", [True, False])
def test_cifar10_python_format(tmp_path, bytes_keys):
    rng = np.random.default_rng(1)
    expected = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        imgs = rng.integers(0, 256, size=(4, 3, 32, 32), dtype=np.uint8)
        labels = rng.integers(0, 10, size=4)
        image_data.write_cifar_batch(tmp_path / name, imgs, labels, bytes_keys=bytes_keys)
        expected.append((imgs, labels))
    train, test = image_data.load_cifar10(tmp_path)
    assert train.images.shape == (20, 3, 32, 32) and test.images.shape == (4, 3, 32, 32)
    assert torch.equal(train.images[:4], torch.from_numpy(expected[0][0]))
    assert train.labels.tolist()[4:8] == expected[1][1].tolist()
    assert test.classes[0] == "airplane"


def test_cifar10_plane_order(tmp_path):
    # a row of 3072 values is R plane, G plane, B plane: a pure-red pixel (0,0) lands in channel 0
    row = np.zeros((1, 3072), dtype=np.uint8)
    row[0, 0] = 255  # R at (0, 0)
    row[0, 1024 + 33] = 200  # G at (1, 1)
    row[0, 2048 + 1023] = 7  # B at (31, 31)
    with open(tmp_path / "b", "wb") as f:
        pickle.dump({b"data": row, b"labels": [3]}, f)
    images, labels = image_data.read_cifar_batch(tmp_path / "b")
    assert images[0, 0, 0, 0] == 255 and images[0, 1, 1, 1] == 200 and images[0, 2, 31, 31] == 7
    assert labels.tolist() == [3]


def test_cifar10_errors_name_the_problem(tmp_path):
    with pytest.raises(ImageDataError, match="lacks data_batch_1"):
        image_data.load_cifar10(tmp_path)
    with open(tmp_path / "b", "wb") as f:
        pickle.dump({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}, f)
    with pytest.raises(ImageDataError, match="N×3072"):
        image_data.read_cifar_batch(tmp_path / "b")
    with open(tmp_path / "c", "wb") as f:
        pickle.dump({"labels": [0]}, f)
    with pytest.raises(ImageDataError, match="no 'data' entry"):
        image_data.read_cifar_batch(tmp_path / "c")


def test_to_float_uses_fixed_dataset_statistics():
    images = torch.full((2, 1, 4, 4), 255, dtype=torch.uint8)
    x = image_data.to_float(images, "fashion-mnist")
    assert torch.allclose(x, torch.full_like(x, (1.0 - 0.2860) / 0.3530))


@pytest.mark.skipif(
    not (seg_data.MRICRON_DIR / "ch2bet.nii.gz").exists(), reason="Debian's mricron-data is not installed"
)
def test_mri_brain_extraction_slices():
    data = seg_data.load_brain_extraction(downsample_factor=4)
    assert data.images.shape[1:] == (1, 54, 45) and data.masks.shape == (len(data), 1, 54, 45)
    assert 130 <= len(data) <= 155  # axial slices with ≥ 1 % brain
    assert set(data.masks.unique().tolist()) == {0, 1}
    assert 0.2 < float(data.masks.float().mean()) < 0.45
    # the T1 image is bright inside the brain and the mask is not the whole slice
    inside = data.images[data.masks.bool()].mean()
    assert float(inside) > float(data.images.mean())
    train, test = seg_data.split_units(data, test_fraction=0.2, seed=0)
    assert len(test) == round(0.2 * len(data)) and len(train) + len(test) == len(data)
    assert not set(train.units.tolist()) & set(test.units.tolist())


def lgg_patients(rng, n_patients=4, n_slices=3, size=16):
    patients = {}
    for p in range(n_patients):
        slices = []
        for _ in range(n_slices):
            img = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            msk = np.zeros((size, size), np.uint8)
            msk[4:9, 5:11] = 255
            slices.append((img, msk))
        patients[f"TCGA_XX_{p:04d}_20000101"] = slices
    return patients


def test_lgg_layout_loads_and_splits_by_patient(tmp_path):
    rng = np.random.default_rng(0)
    patients = lgg_patients(rng, n_patients=5)
    seg_data.write_lgg_sample(tmp_path, patients)
    data = seg_data.load_lgg(tmp_path, size=16)  # the parent of kaggle_3m is accepted
    assert data.images.shape == (15, 3, 16, 16) and data.masks.shape == (15, 1, 16, 16)
    first = patients[sorted(patients)[0]][0][0]
    assert torch.allclose(data.images[0], torch.from_numpy(first).permute(2, 0, 1).float() / 255)
    assert int(data.masks[0].sum()) == 5 * 6
    assert data.unit_names == tuple(sorted(patients))
    train, test = seg_data.split_units(data, test_fraction=0.2, seed=1)
    assert len(test.unit_ids()) == 1 and len(train.unit_ids()) == 4
    assert not set(train.units.tolist()) & set(test.units.tolist())
    half = seg_data.load_lgg(tmp_path / "kaggle_3m", size=8)
    assert half.images.shape == (15, 3, 8, 8) and int(half.masks[0].sum()) > 0


def test_lgg_missing_mask_is_reported(tmp_path):
    rng = np.random.default_rng(0)
    base = seg_data.write_lgg_sample(tmp_path, lgg_patients(rng, n_patients=1, n_slices=2))
    next(base.glob("*/*_2_mask.tif")).unlink()
    with pytest.raises(SegDataError, match=r"slice\(s\) \[2\] have no _mask.tif"):
        seg_data.load_lgg(tmp_path)
    with pytest.raises(SegDataError, match="data_dir"):
        seg_data.load_lgg("")
