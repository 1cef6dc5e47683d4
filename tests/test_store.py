import torch

from trustformer.runtime.store import ClientState, DiskStore, MemoryStore


def _state():
    return ClientState(
        model={"w": torch.arange(6.0).reshape(2, 3)},
        optimizer={"state": {}, "param_groups": []},
        protocol={"labels": torch.tensor([0, 1])},
        rounds_done=2,
    )


def test_memory_store_keeps_independent_copies():
    store = MemoryStore()
    state = _state()
    store.save("c0", state)
    state.model["w"].zero_()
    loaded = store.load("c0")
    assert torch.equal(loaded.model["w"], torch.arange(6.0).reshape(2, 3))
    assert store.load("c1") is None


def test_disk_store_round_trip_and_atomic_replace(tmp_path):
    store = DiskStore(tmp_path)
    store.save("c0", _state())
    loaded = store.load("c0")
    assert torch.equal(loaded.protocol["labels"], torch.tensor([0, 1])) and loaded.rounds_done == 2
    assert [p.name for p in (tmp_path / "c0").iterdir()] == ["state.pt"]  # no temp files left


def test_disk_store_failed_write_keeps_previous_state(tmp_path, monkeypatch):
    store = DiskStore(tmp_path)
    store.save("c0", _state())

    def crash(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    newer = _state()
    newer.rounds_done = 3
    try:
        store.save("c0", newer)
    except OSError:
        pass
    else:  # pragma: no cover
        raise AssertionError("the write should have failed")
    assert store.load("c0").rounds_done == 2
    assert [p.name for p in (tmp_path / "c0").iterdir()] == ["state.pt"]
