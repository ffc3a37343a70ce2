#!/usr/bin/env bash
# Set up a virtual environment with every extra and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[cuda,test,torch,distributed]'
exec .venv/bin/python -m pytest -q "$@"
