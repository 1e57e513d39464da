#!/usr/bin/env bash
# The exllamav3 adapter against the engine's real CUDA kernels (benchmarks/exllamav3_gpu_check.py says what is
# checked). Needs an NVIDIA GPU, a CUDA build of torch (>= 2.6) and nvcc. Usage:
#   benchmarks/exllamav3_gpu_check.sh OUT.json [CHECKPOINT_DIR RECIPE_ID [--compare-plain]]
# A checkpoint is loaded by moetier_load (its routed experts never read from it: it may exceed VRAM plus RAM);
# --compare-plain also loads it by the engine alone as the reference (only for one that fits the GPU).
# Installs exllamav3 1.6.5 into the active Python (pip, no dependencies beyond its import-time ones, keeping the
# installed torch), builds its extension by importing it once (torch.utils.cpp_extension JIT, about 177 CUDA/C++
# sources: expect well over ten minutes on 16 cores; the time is printed and written beside the record), then runs
# the checks. Exit status: that of the checks (0 all passed, 1 a check failed, 2 no CUDA device).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: exllamav3_gpu_check.sh OUT.json [CHECKPOINT_DIR RECIPE_ID [--compare-plain]]}
py=${PYTHON:-python3}
"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)' || {
    echo "exllamav3_gpu_check: no CUDA device (or no CUDA torch)" >&2; exit 2; }
"$py" -m pip install -q numpy jsonschema psutil xxhash safetensors tokenizers rich typing_extensions ninja pillow \
    pyyaml marisa_trie pydantic llguidance
"$py" -m pip install -q --no-deps 'exllamav3==1.6.5'
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
t0=$(date +%s)
"$py" -c 'import exllamav3.ext as e; assert not getattr(e.exllamav3_ext, "__moetier_standin__", False)'
t1=$(date +%s)
echo "exllamav3 extension build + import: $((t1 - t0)) s (MAX_JOBS=$MAX_JOBS)"
echo "{\"build_s\": $((t1 - t0)), \"max_jobs\": $MAX_JOBS}" > "${out%.json}.build.json"
if [ $# -ge 3 ]; then
    PYTHONPATH="$PWD" "$py" benchmarks/exllamav3_gpu_check.py --out "$out" --checkpoint "$2" --recipe "$3" "${@:4}"
else
    PYTHONPATH="$PWD" "$py" benchmarks/exllamav3_gpu_check.py --out "$out"
fi
