"""The image tasks behind the Task protocol: shards, seeded models, local training, scores, configs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trustformer.config import ConfigError, SegmentationConfig, image_preset, seg_preset
from trustformer.core.local_rules import sam_step
from trustformer.tasks import seg_data
from trustformer.tasks.base import Task, TaskConfigError, derive_seed
from trustformer.tasks.image import ImageClassificationTask, augment_batch
from trustformer.tasks.segmentation import SegmentationTask
from trustformer_lab.bench.image_tasks_bench import fedavg_average, run

torch.set_num_threads(1)

HAS_MRI = (seg_data.MRICRON_DIR / "ch2bet.nii.gz").exists()


@pytest.fixture(scope="module")
def digits():
    return ImageClassificationTask(image_preset("tiny"), seed=0)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_image_task_satisfies_protocol_and_describes_itself(digits):
    assert isinstance(digits, Task)
    d = digits.describe()
    assert d["dataset"] == "digits" and d["train_images"] == 1438 and d["test_images"] == 359
    assert d["parameters"] == d["model_bytes_float32"] // 4 and d["config"]["layers"] == [1, 1]


def test_derive_seed_matches_the_translation_workload():
    from trustformer.tasks.translation_workload import derive_seed as workload_seed

    assert derive_seed(0, "model-init") == workload_seed(0, "model-init")


def test_client_shards_partitions(digits):
    iid = digits.client_shards(3, "iid", seed=0)
    assert sum(len(s) for s in iid) == len(digits.train)
    strat = digits.client_shards(3, "stratified", seed=0)
    counts = np.array(digits.shard_class_counts(strat))
    assert counts.sum() == len(digits.train) and len({len(s) for s in strat}) == 3
    share = counts.sum(1) / counts.sum()
    class_share = counts / counts.sum(0, keepdims=True)  # each class cut in the client shares
    assert np.abs(class_share - share[:, None]).max() < 0.02
    dirichlet = digits.client_shards(3, "dirichlet", seed=0, alpha=0.1)
    assert sum(len(s) for s in dirichlet) == len(digits.train)
    with pytest.raises(TaskConfigError, match="partition must be one of"):
        digits.client_shards(3, "by-writer")


def test_build_model_is_seeded_and_leaves_global_rng_alone(digits):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = digits.build_model(7), digits.build_model(7)
    assert torch.equal(torch.rand(1), before)
    assert all(torch.equal(x, y) for x, y in zip(weights(a).values(), weights(b).values(), strict=True))
    c = digits.build_model(8)
    assert not torch.equal(a.stem.weight, c.stem.weight)


def test_local_training_learns_and_is_deterministic(digits):
    shard = digits.client_shards(2, "iid", seed=0)[0]
    results, states = [], []
    for _ in range(2):
        model = digits.build_model(0)
        opt = digits.build_optimizer(model)
        results.append(digits.train_local(model, opt, shard, seed=11, epochs=2, batch_size=32))
        states.append(weights(model))
    r = results[0]
    assert r["steps"] == 2 * -(-len(shard) // 32) and r["examples"] == 2 * len(shard)
    assert r["train_loss"] == results[1]["train_loss"]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    model = digits.build_model(0)
    model.load_state_dict(states[0])
    metrics = digits.final_metrics(model)
    assert metrics["accuracy"] > 0.5  # from 0.1 at initialisation
    assert metrics["test_loss"] == pytest.approx(digits.test_loss(model))
    assert metrics["test_loss"] < np.log(10)
    assert set(metrics["per_class_accuracy"]) == set(digits.test.classes)


def test_protocol_local_step_runs_on_the_image_model(digits):
    """A protocol's own step (DP-FedSAM's SAM through ``model.loss``) plugs into train_local."""
    calls = []

    def sam(model, optimizer, inputs, targets):
        found = []

        def closure():
            loss_sum, n = model.loss(inputs, targets)
            found.append((loss_sum.detach(), n))
            return loss_sum / n

        sam_step([p for p in model.parameters() if p.requires_grad], closure, optimizer, rho=0.05)
        calls.append(1)
        return found[0]

    model = digits.build_model(0)
    shard = digits.train.head(64)
    r = digits.train_local(model, digits.build_optimizer(model), shard, seed=1, epochs=1, batch_size=32, step=sam)
    assert len(calls) == r["steps"] == 2 and r["examples"] == 64


def test_augment_batch_is_seeded_and_keeps_shape():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    a = augment_batch(x, "crop-flip", torch.Generator().manual_seed(0))
    b = augment_batch(x, "crop-flip", torch.Generator().manual_seed(0))
    assert a.shape == x.shape and torch.equal(a, b)
    flipped = augment_batch(x, "flip", torch.Generator().manual_seed(0))
    for i in range(2):
        assert torch.equal(flipped[i], x[i]) or torch.equal(flipped[i], x[i].flip(-1))


def test_image_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="^image.dataset = 'mnist' is not one of"):
        image_preset("small", dataset="mnist")
    with pytest.raises(ConfigError, match="^image.data_dir must name the CIFAR-10"):
        image_preset("small", dataset="cifar10")
    with pytest.raises(ConfigError, match="^image.lr = 0.0 must be > 0"):
        image_preset("small", lr=0)
    with pytest.raises(ConfigError, match="^image.batch_size = 2.5 must be an integer"):
        image_preset("small", batch_size=2.5)
    with pytest.raises(ConfigError, match="^image.widths = .* must give one width"):
        image_preset("small", layers=[1, 1], widths=[8])
    with pytest.raises(ConfigError, match="^image.momentum"):
        image_preset("small", momentum=1.0)
    with pytest.raises(ConfigError, match="^preset = 'huge' is not one of"):
        image_preset("huge")
    paper = image_preset("paper", data_dir="/some/cifar")
    assert paper.block == "bottleneck" and paper.layers == (3, 4, 6, 3)


def test_fedavg_average_weights_by_size():
    a = {"w": torch.tensor([0.0, 2.0])}
    b = {"w": torch.tensor([3.0, 2.0])}
    assert torch.allclose(fedavg_average([a, b], [1, 2])["w"], torch.tensor([2.0, 2.0]))


def test_bench_fedavg_loop_on_digits(digits):
    rows = run(digits, epochs=1, clients=3, partition="iid", local_epochs=1, seed=0, log=lambda m: None)
    assert rows[0]["epoch"] == 1 and 0.0 <= rows[0]["accuracy"] <= 1.0


def test_segmentation_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="^segmentation.dataset = 'brats' is not one of"):
        seg_preset("small", dataset="brats")
    with pytest.raises(ConfigError, match="^segmentation.data_dir must name the LGG"):
        seg_preset("small", dataset="lgg")
    with pytest.raises(ConfigError, match="^segmentation.test_fraction"):
        seg_preset("small", test_fraction=1.0)
    with pytest.raises(ConfigError, match="^segmentation.norm = 'batch' is not one of"):
        seg_preset("small", norm="batch")
    assert seg_preset("paper", data_dir="/x").base_width == 64


@pytest.mark.skipif(not HAS_MRI, reason="Debian's mricron-data is not installed")
def test_segmentation_task_on_mri_slices():
    task = SegmentationTask(seg_preset("tiny"), seed=0)
    assert isinstance(task, Task)
    shards = task.client_shards(3, "stratified", seed=0)
    assert sum(len(s) for s in shards) == len(task.train)
    units = [set(s.units.tolist()) for s in shards]
    assert not (units[0] & units[1]) and not (units[1] & units[2])
    with pytest.raises(TaskConfigError, match="dirichlet"):
        task.client_shards(3, "dirichlet")
    model = task.build_model(0)
    before = task.final_metrics(model)
    r = task.train_local(model, task.build_optimizer(model), task.train, seed=3, epochs=2)
    after = task.final_metrics(model)
    assert r["steps"] == 2 * -(-len(task.train) // 8)
    assert after["dice"] > max(before["dice"], 0.6)
    assert after["test_loss"] < before["test_loss"]
    assert set(after) >= {"dice", "iou", "pixel_accuracy", "dice_per_image", "test_loss"}
    samples = task.sample_predictions(model, n=3)
    assert len(samples) == 3 and samples[0]["image"].shape == samples[0]["prediction"].shape
    # seeded: the same training again gives the same weights
    again = task.build_model(0)
    task.train_local(again, task.build_optimizer(again), task.train, seed=3, epochs=2)
    assert all(torch.equal(x, y) for x, y in zip(weights(model).values(), weights(again).values(), strict=True))


def test_segmentation_task_on_lgg_layout(tmp_path):
    rng = np.random.default_rng(0)
    patients = {}
    for p in range(5):
        slices = []
        for _ in range(2):
            img = rng.integers(0, 60, size=(16, 16, 3), dtype=np.uint8)
            msk = np.zeros((16, 16), np.uint8)
            msk[3:8, 4:12] = 255
            img[msk > 0] += 150  # a bright "tumour"
            slices.append((img, msk))
        patients[f"TCGA_P{p}"] = slices
    seg_data.write_lgg_sample(tmp_path, patients)
    cfg = SegmentationConfig(
        dataset="lgg",
        data_dir=str(tmp_path),
        size=16,
        depth=2,
        base_width=4,
        groups=2,
        lr=3e-2,
        batch_size=4,
        test_fraction=0.2,
    )
    task = SegmentationTask(cfg, seed=0)
    assert task.describe()["test_units"] == 1 and len(task.test) == 2
    shards = task.client_shards(2, "iid", seed=0)
    assert sorted(len(s.unit_ids()) for s in shards) == [2, 2]  # whole patients per client
    model = task.build_model(0)
    before = task.test_loss(model)
    task.train_local(model, task.build_optimizer(model), task.train, seed=0, epochs=12)
    after = task.final_metrics(model)
    assert after["test_loss"] < before and after["dice"] > 0.9


def test_lr_decay_follows_local_epochs_and_travels_with_the_optimizer():
    from trustformer.tasks.base import decay_learning_rate

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert decay_learning_rate(opt, 1.0, 0.5) == pytest.approx(0.1)  # nothing done yet
    assert decay_learning_rate(opt, 1.0, 0.5) == pytest.approx(0.1 / 1.5)
    state = opt.state_dict()
    fresh = torch.optim.SGD(model.parameters(), lr=0.1)
    fresh.load_state_dict(state)  # a client's next round
    assert decay_learning_rate(fresh, 1.0, 1.0) == pytest.approx(0.1 / 2.0)
    digits = ImageClassificationTask(image_preset("tiny", lr_decay=1.0), seed=0)
    m = digits.build_model(0)
    r = digits.train_local(m, digits.build_optimizer(m), digits.train.head(64), seed=0, epochs=2, batch_size=32)
    assert r["lr"] == pytest.approx(0.01 / 2.5)  # the last step started after 1.5 local epochs
    with pytest.raises(ConfigError, match="^image.lr_decay"):
        image_preset("tiny", lr_decay=-1)


def test_figures_are_written(tmp_path, digits):
    from trustformer.tasks.figures import mask_figure, partition_figure

    truth = np.zeros((6, 5), bool)
    truth[1:4, 1:4] = True
    pred = np.zeros((6, 5), bool)
    pred[1:4, 2:5] = True
    samples = [
        {"unit": "axial-090", "image": np.random.default_rng(0).random((6, 5)), "truth": truth, "prediction": pred}
    ]
    out = mask_figure(samples, tmp_path / "masks.png", title="test")
    assert out.stat().st_size > 1000
    counts = digits.shard_class_counts(digits.client_shards(3, "dirichlet", seed=0, alpha=0.3))
    assert partition_figure(counts, digits.train.classes, tmp_path / "split.png").exists()
    with pytest.raises(ValueError, match="clients × 10 classes"):
        partition_figure([[1, 2]], digits.train.classes, tmp_path / "bad.png")
