"""What keeping client state on disk (``runtime.store``) costs per client and round on a preset's model, against
memory: each round a client loads its last snapshot, saves one after training, loads it and saves the round's end.

    python scripts/store_cost.py            # the demo's model (small)
    python scripts/store_cost.py --preset tiny

Prints the median time per client and round of each store, side by side, and their difference.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from trustformer.config import load_config
from trustformer.runtime.store import ROUND_END, TRAINED, ClientState, DiskStore, MemoryStore
from trustformer.tasks.run import load_task


def per_round(store, state: ClientState, rounds: int = 8) -> float:
    times = []
    for rnd in range(1, rounds + 1):
        started = time.perf_counter()
        store.load("client-0", upto=(rnd - 1, ROUND_END))
        store.save("client-0", state, at=(rnd, TRAINED))
        store.load("client-0", upto=(rnd, TRAINED))
        store.save("client-0", state, at=(rnd, ROUND_END))
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    args = parser.parse_args()
    task = load_task(load_config(args.preset, None, {}))
    model = task.initial_model()
    optimizer = task.new_optimizer(model)
    sum(p.sum() for p in model.parameters()).backward()
    optimizer.step()  # the optimizer's moments exist, as after a round
    state = ClientState(model=model.state_dict(), optimizer=optimizer.state_dict(), protocol={}, rounds_done=1)
    memory = per_round(MemoryStore(), state)
    with tempfile.TemporaryDirectory(dir=".") as folder:
        disk = per_round(DiskStore(folder), state)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.preset}: {params:,} parameters; per client and round: memory {memory:.3f} s, disk {disk:.3f} s, "
        f"disk costs {disk - memory:+.3f} s"
    )


if __name__ == "__main__":
    main()
