#!/usr/bin/env bash
# The exl3xpu adapter on an Intel Arc GPU (benchmarks/exl3xpu_arc_check.py says what is checked). Needs an XPU build
# of torch, the oneAPI 2025.3 compiler (icpx) and exl3xpu's source tree or wheel (exl3xpu is not on PyPI). Usage:
#   benchmarks/exl3xpu_arc_check.sh OUT.json [EXL3XPU_SRC]
# Installs exl3xpu from EXL3XPU_SRC (a source tree: built with EXL3_AOT=1 for the B70, `-device bmg`; or a wheel) into
# the active Python unless it is already installed, prints and records how long the build took, then runs the checks.
# EXL3_MOE_LIB must name exl3xpu's _moe.so (shipped in the B70 image; exl3xpu loads it on first use).
# Exit status: that of the checks (0 all passed, 1 a check failed, 2 no XPU or exl3xpu's own ops did not load - never
# a fall-back to moetier's stand-in ops -, 3 passed but the attached tiny model on the real op not checked).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: exl3xpu_arc_check.sh OUT.json [EXL3XPU_SRC]}
py=${PYTHON:-python3}
"$py" -c 'import torch, sys; sys.exit(0 if hasattr(torch, "xpu") and torch.xpu.is_available() else 2)' || {
    echo "exl3xpu_arc_check: no Intel XPU (or no XPU torch)" >&2; exit 2; }
"$py" -m pip install -q numpy jsonschema psutil xxhash safetensors numba
t0=$(date +%s)
if ! "$py" -c 'import exl3xpu' 2>/dev/null; then
    src=${2:?exl3xpu is not installed: pass its source tree or wheel as EXL3XPU_SRC}
    EXL3_AOT=1 "$py" -m pip install -q --no-build-isolation --no-deps "$src"
fi
t1=$(date +%s)
echo "exl3xpu build + install: $((t1 - t0)) s"
echo "{\"build_s\": $((t1 - t0))}" > "${out%.json}.build.json"
PYTHONPATH="$PWD" "$py" -m moetier adapter check exl3xpu
PYTHONPATH="$PWD" "$py" benchmarks/exl3xpu_arc_check.py --out "$out"
