#!/usr/bin/env bash
# Install, then train the embedded default: 3 clients, FedAvg, small preset, real ru→en data, CPU.
# Extra arguments go to `trustformer run` (e.g. --strategy local, --rounds 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/trustformer run "$@"
