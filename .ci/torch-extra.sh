#!/usr/bin/env bash
# Optional CI job: the EXL3 codec (moetier/bytes/exl3.py) against exllamav3 1.6.5's own torch code, bit-exact where
# the oracle is exact (tests/oracle/exl3_golden.py --check; it also fails if tests/data/exl3_golden.npz is stale).
# torch is the CPU wheel (a fraction of the default CUDA build's size). exllamav3 goes in with --no-deps so that pip
# neither swaps torch for a CUDA build nor tries to compile the extension; the oracle script stands in for the
# extension (adapters/exllamav3/standin.py). The second pip line is exllamav3's own import-time requirements, plus
# triton, which the CUDA torch builds bring along and exllamav3 imports at module level.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-torch
.venv-torch/bin/pip install -q -U pip
.venv-torch/bin/pip install -q 'torch==2.13.0+cpu' numpy safetensors
.venv-torch/bin/pip install -q tokenizers rich typing_extensions ninja pillow pyyaml marisa_trie pydantic llguidance triton
.venv-torch/bin/pip install -q --no-deps 'exllamav3==1.6.5'
.venv-torch/bin/python tests/oracle/exl3_golden.py --check
