"""The learning tasks: translation, image classification and segmentation (FedPC's experiments).

- :mod:`.run`: the task of a run (``config.task``) as the round loop uses it;
- :mod:`.translation`: translation (``translation_workload.py``) behind that interface;
- :mod:`.base`: the ``Task`` protocol the image tasks implement and their shared training loop;
- :mod:`.image_data`, :mod:`.seg_data`: offline data (Fashion-MNIST, digits, CIFAR-10; MRI brain
  extraction, LGG);
- :mod:`.partition`: IID, FedPC's class-stratified imbalanced and Dirichlet client splits;
- :mod:`.image_metrics`: accuracy, per-class accuracy, Dice, IoU, pixel accuracy;
- :mod:`.image`, :mod:`.segmentation`: the two tasks with their presets;
- :mod:`.bench`: centralized and FedAvg timing runs that the ``small`` presets were chosen from.

Submodules are imported on demand (torch models, nibabel and flwr-datasets are not needed for translation).
"""
