#!/usr/bin/env bash
# Set up a virtual environment and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[data,progress]'
exec .venv/bin/nfc opt examples/mlp.nf "$@"
