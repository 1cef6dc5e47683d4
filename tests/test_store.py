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


def test_a_client_that_sat_out_a_round_keeps_the_snapshot_a_resent_round_starts_from(tmp_path):
    """Client sampling: a client trains rounds 1 and 3, not 2. A server resumed from its round-2 checkpoint sends
    round 3 again, whose ``train`` loads the latest snapshot at or before (2, end): round 1's, which saving
    round 3's snapshots must not have dropped. Only older rounds go."""
    from trustformer.runtime.store import ROUND_END, TRAINED

    def state(value: float) -> ClientState:
        return ClientState(model={"w": torch.tensor(value)}, optimizer={}, protocol={}, rounds_done=0)

    for store in (MemoryStore(), DiskStore(tmp_path)):
        for rnd in (1, 3, 4, 6):
            store.save("c", state(float(rnd)), at=(rnd, TRAINED))
            if rnd == 3:  # killed after it trained round 3, before it applied: the resent round starts from round 1
                assert store.load("c", upto=(2, ROUND_END)).model["w"].item() == 1.5
            store.save("c", state(float(rnd) + 0.5), at=(rnd, ROUND_END))
            if rnd == 3:  # and after it applied round 3, the same
                assert store.load("c", upto=(2, ROUND_END)).model["w"].item() == 1.5
        assert store.points("c") == [(4, TRAINED), (4, ROUND_END), (6, TRAINED), (6, ROUND_END)]
        assert store.load("c", upto=(5, ROUND_END)).model["w"].item() == 4.5
