"""What a run writes (``metrics.jsonl``, ``summary.json``: :mod:`.recorder`) and its mirror in experiment
trackers (TensorBoard, MLflow: :mod:`.tracking`)."""
