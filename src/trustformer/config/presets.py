"""The presets (``--preset``): what each changes from the section defaults, for every task and for the image tasks."""

from __future__ import annotations

from typing import Any

# Presets change only what differs from the defaults above (the `small` demo).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "data": {"vocab_size": 300, "client_size": 60, "test_size": 40, "public_size": 1500, "max_words": 12},
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64, "max_len": 24},
        "train": {"batch_size": 16, "batch_tokens": 160, "warmup_steps": 2},
        "federation": {"rounds": 2},
        "eval": {"bleu_size": 20},
        # a model this small runs faster on one thread than on two (thread start-up dominates)
        "runtime": {"threads": 1},
    },
    "small": {},
    "paper": {  # Table II of the Trustformer paper (GPU-sized)
        "data": {
            "source": "wmt19",
            "tokenizer": "hf",
            "tokenizer_name": "xlm-roberta-base",
            "client_size": 20000,
            "test_size": 1000,
            "public_size": 20000,
            "max_words": 0,
        },
        "model": {
            "d_model": 256,
            "n_heads": 8,
            "n_encoder_layers": 6,
            "n_decoder_layers": 6,
            "d_ff": 512,
            "max_len": 50,
            "dropout": 0.1,
        },
        # Table II literally: Adam with L2-coupled weight decay 0.01 on every parameter, constant lr 1e-3,
        # no label smoothing or clipping (docs/data.md "Training recipe": what this costs on `small`)
        "train": {
            "optimizer": "adam",
            "lr": 1e-3,
            "weight_decay": 0.01,
            "betas": [0.9, 0.999],
            "schedule": "constant",
            "warmup_steps": 0,
            "clip_norm": 0.0,
            "label_smoothing": 0.0,
            "batch_size": 20,
            "batch_tokens": 0,
        },
        "federation": {"rounds": 10},
        "eval": {"bleu_size": 1000, "bertscore_model": "roberta-large"},  # bert-score's default for English
    },
}


# What each preset changes for an image task, on top of PRESETS[preset] and the section defaults (the `small`
# values), and the rounds (epochs) each is meant for. `paper`: FedPC's ResNet-50 FIXUP on CIFAR-10 (momentum SGD,
# lr 0.01 decayed with the local steps, batch 128, 250 epochs; Section 5.1) and its U-Net (depth 4, width 64) on
# LGG 256x256 slices (35 epochs), both for a GPU. What the `small` values were chosen from: docs/benchmarks.md
# ("Image tasks").
TASK_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "image-classification": {
        "tiny": {
            "image": {
                "dataset": "digits",
                "layers": [1, 1],
                "widths": [8, 16],
                "stem_stride": 1,
                "optimizer": "adam",
                "lr": 0.01,
                "lr_decay": 0.0,
                "weight_decay": 0.0,
                "batch_size": 32,
            },
            "federation": {"rounds": 2},
        },
        "small": {"federation": {"rounds": 8}},
        "paper": {
            "image": {
                "dataset": "cifar10",
                "block": "bottleneck",
                "layers": [3, 4, 6, 3],
                "widths": [64, 128, 256, 512],
                "stem": "cifar",
                "stem_stride": 1,
                "stem_width": 64,
                "optimizer": "sgd",
                "lr": 0.01,
                "lr_decay": 0.01,
                "momentum": 0.9,
                "weight_decay": 5e-4,
                "batch_size": 128,
                "augment": "crop-flip",
            },
            "federation": {"rounds": 250},
        },
    },
    "segmentation": {
        "tiny": {
            "segmentation": {"downsample": 4, "depth": 2, "base_width": 4, "groups": 4, "lr": 1e-2, "batch_size": 8},
            "federation": {"rounds": 2},
        },
        "small": {"federation": {"rounds": 30}},
        "paper": {
            "segmentation": {
                "dataset": "lgg",
                "size": 256,
                "depth": 4,
                "base_width": 64,
                "groups": 8,
                "optimizer": "adam",
                "lr": 0.01,
                "lr_decay": 0.1,
                "batch_size": 16,
                "augment": "flip",
            },
            "federation": {"rounds": 35},
        },
    },
}
