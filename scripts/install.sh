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
# METEOR's WordNet synonyms: the WordNet 3.0 database from Debian (NLTK's own download needs the internet).
# Trustformer lays it out for NLTK in its cache on first use (no root needed for that part).
if [ ! -f /usr/share/wordnet/data.noun ] && [ -z "${WNSEARCHDIR:-}" ] && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-cache show wordnet-base >/dev/null 2>&1 || apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      wordnet-base wordnet-sense-index >/dev/null
  else
    echo "note: METEOR needs WordNet: 'sudo apt-get install wordnet-base wordnet-sense-index'" \
         "(or --set eval.meteor=false)" >&2
  fi
fi
# Image tasks: Fashion-MNIST (image classification) and the ch2 MRI template with its skull-stripped
# version (segmentation) come from Debian, offline.
if { [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] \
     || [ ! -f /usr/share/mricron/templates/ch2bet.nii.gz ]; } && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-cache show dataset-fashion-mnist >/dev/null 2>&1 || apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      dataset-fashion-mnist mricron-data >/dev/null
  else
    echo "note: the image tasks need 'sudo apt-get install dataset-fashion-mnist mricron-data'" >&2
  fi
fi
