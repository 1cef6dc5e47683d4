#!/usr/bin/env bash
# Install, then run the test suite. Extra arguments go to pytest.
# TRUSTFORMER_SKIP_INSTALL=1 skips the installation (an environment installed before).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TRUSTFORMER_SKIP_INSTALL:-0}" != 1 ]; then
  bash scripts/install.sh
fi
# The environment's own commands first: the deployment tests start Flower's flower-superlink,
# flower-supernode and flwr, which live next to this Python.
export PATH="$PWD/.venv/bin:$PATH"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
exec .venv/bin/python -m pytest -q "$@"
