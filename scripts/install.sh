#!/usr/bin/env bash
# Install Trustformer and its test dependencies into ./.venv (created if missing). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch first, pinned to the CPU build: any other torch requirement would pull CUDA packages.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test]"
# The default corpus is built from Debian's LibreOffice help packages (apt-get download):
# make sure the package lists know them.
if command -v apt-cache >/dev/null 2>&1 && ! apt-cache show libreoffice-help-ru >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
  else
    echo "note: run 'sudo apt-get update' once so the default corpus can be downloaded," \
         "or bring your own with --data FILE.tsv" >&2
  fi
fi
