#!/usr/bin/env bash
# Set everything up (system packages, package, test tools) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
exec .venv/bin/python -m pytest "$@"
