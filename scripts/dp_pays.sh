#!/usr/bin/env bash
# docs/bench/dp-pays.json and docs/bench/dp-pays-curve.png: every row of docs/privacy.md "Where a DP federation
# pays", from seed 0's public start. Runs go to runs/dp-pays/ and are reused once finished (add --no-run to
# assemble only). docs/bench/dp-pays-seed1.json: the deciding rows (public + fedavg, dp ε=8) again with seed 1,
# from seed 1's own public start (the seed draws the split, so the pairs the public model may see change too).
set -euo pipefail
cd "$(dirname "$0")/.."
R="privacy.unit=record privacy.delta=1e-5 model.adapters=lora model.lora_rank=16 model.lora_alpha=32"
D="$R privacy.epsilon=8 privacy.noise=distributed secure.mode=secagg privacy.batch_size=256 federation.rounds=40 privacy.distributed_lr=16"
ROWS=(
  --row "dp ε=8 distributed: $D"
  --row "dp ε=8 distributed b=8: $D privacy.noise_bands=8"
  --row "public + fedavg @ 1000/owner: data.client_size=1000"
  --row "dp ε=8 @ 1000/owner: $R privacy.epsilon=8 data.client_size=1000"
  --row "dp ε=1 @ 1000/owner: $R privacy.epsilon=1 data.client_size=1000"
  --row "public + fedavg @ all/owner: data.client_size=0"
  --row "dp ε=8 @ all/owner: $R privacy.epsilon=8 data.client_size=0"
  --row "dp ε=1 @ all/owner: $R privacy.epsilon=1 data.client_size=0"
)
PY=".venv/bin/python"
[ -x "$PY" ] || PY=python
"$PY" scripts/dp_pays.py --json docs/bench/dp-pays.json --plot docs/bench/dp-pays-curve.png "${ROWS[@]}" "$@"
"$PY" scripts/dp_pays.py --json docs/bench/dp-pays-seed1.json --seeds 1 --only "public + fedavg,dp ε=8" "$@"
