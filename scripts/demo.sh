#!/usr/bin/env bash
# Set up a virtual environment and run the main job: train an MLP on scikit-learn's digits with
# nfc, show the loss falling and the test accuracy, and time the same step in PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[data,progress,plot,torch]'
exec .venv/bin/nfc train examples/mlp_digits.nf --data digits --epochs 10 --compare-torch "$@"
