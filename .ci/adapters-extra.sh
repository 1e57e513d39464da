#!/usr/bin/env bash
# Optional CI job: the exllamav3 adapter's torch-dependent tests (tests/test_adapter_exllamav3_*.py) in the CPU-torch
# venv that .ci/torch-extra.sh builds (.venv-torch: torch CPU, exllamav3 1.6.5 with --no-deps and its import-time
# requirements; that script also runs the EXL3 oracle check). Here the venv gets what moetier itself and the tests
# import, then the adapter tests run against the real exllamav3 Python layer with the stand-in extension. In the main
# venv the same tests skip with their reason (no torch / exllamav3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/torch-extra.sh
.venv-torch/bin/pip install -q jsonschema psutil xxhash numba pytest hypothesis
# moetier itself without dependencies (the ones above are the installed subset): its moetier.backends entry points,
# so that `moetier conformance --backend exllamav3` finds the adapter as a user's install would
.venv-torch/bin/pip install -q --no-deps -e .
PYTHONPATH="$PWD" .venv-torch/bin/python -m pytest -q -p no:cacheprovider -o addopts= -rs \
    tests/test_adapter_surface.py tests/test_adapter_exllamav3_standin.py tests/test_adapter_exllamav3_surface.py \
    tests/test_adapter_exllamav3_attach.py tests/test_adapter_exllamav3_load.py \
    tests/test_adapter_exllamav3_backend.py tests/test_adapter_registration.py
PYTHONPATH="$PWD" .venv-torch/bin/python -m moetier adapter check exllamav3 | tail -1
# the conformance suite on the adapter's backend, unattached: its cpu lane, transfers and the residency rule
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PYTHONPATH="$PWD" .venv-torch/bin/python -m moetier conformance --backend exllamav3 --report "$tmp/conf-exllamav3.json" \
    | tail -3
