#!/usr/bin/env bash
# The first-light check on a lent NVIDIA GPU, offline, in one command that ends inside 8 minutes (docs/backend-cuda.md,
# "On a lent GPU"). Prepare first, on a machine with a package index: bash benchmarks/device/prepare.sh. Then one
# device run, from the repository root:
#
#   command: bash benchmarks/device/check.sh     carry: ["benchmarks/device/wheels"]     timeout_s: 540
#
# Everything it keeps goes to $OUT (at most 8 files, the device run's limit): summary.json (every step's exit status,
# seconds and log tail, the device), conformance-cuda.json and .md, kernels.json, run-record.json, probe.md,
# stage2.json and logs.tar.gz (every step's whole log). Each step runs under `timeout`, inside what is left of the
# budget (CHECK_BUDGET_S, default 450 s); a failing step is recorded and the next one runs.
#
#   setup       the carried wheels installed offline (pip --no-index --no-deps --target: the image's python3 is
#               itself a venv, so a nested venv would not see its torch and cupy), then moetier from the tree the
#               same way (no dependency resolution); PYTHONPATH puts the tree first
#   device      nvidia-smi, torch and cupy versions, the compute capability
#   doctor      moetier doctor --recipe tiny-ci-cuda --json
#   conformance moetier conformance --backend cuda (the full suite): report JSON, rendered to markdown
#   tests       tests/test_cuda_backend.py (the backend's own GPU tests; they skip without a GPU)
#   kernels     benchmarks/device/kernel_figures.py: gpu lane bytes/s over d2d copy for int8, int4g32 and EXL3,
#               push and drain over one-call cudaMemcpyAsync, interleaved rounds, min / median / max
#   run         moetier run tiny-ci-cuda --backend cuda with the probe (NVML counters) on: the run record holds
#               measured tok/s beside the simulator's, and plan parity (NVMe reads per token, run vs simulator)
#   probe       moetier probe report --write: utilization (GPU util, VRAM, PCIe, power) into the run record
#   bench       benchmarks/bench_cuda.py --quick --json: the lane costs `bench_cuda.py --apply` writes into the
#               cuda-cupy engine record afterwards, without a GPU (bench_cuda.json is in logs.tar.gz)
#   stage2      only when at least STAGE2_MIN_S (default 300 s) of the budget is left: exllamav3 1.6.5 installed
#               from the carried wheel, its extension built (MAX_JOBS=nproc, TORCH_CUDA_ARCH_LIST of this device;
#               the build time printed), then benchmarks/device/exllamav3_checks.py on the tiny EXL3 model with
#               the engine's real kernels. `check.sh --only stage2` runs it alone (a second device run).
#
# `check.sh --dry-run` (CI, no GPU): every step that needs no GPU runs for real on this machine (doctor, the cuda
# conformance suite - which skips with its reason -, the kernel figures' no-GPU path, a tiny run on the cpu backend with
# the probe, the probe report, the summary); the others are checked to exist and parse (bash -n, py_compile, --help).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
KIT="$ROOT/benchmarks/device"
DRY=0
ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --only) ONLY="${2:?--only needs a step name}"; shift ;;
        *) echo "check.sh: unknown argument $1 (expected --dry-run, --only STEP)" >&2; exit 2 ;;
    esac
    shift
done
OUT="${OUT:-$ROOT/out/device-check}"
mkdir -p "$OUT"
W="$(mktemp -d /tmp/moetier-device.XXXXXX)"
mkdir -p "$W/logs"
export MOETIER_REGISTRY="$W/registry" PYTHONUNBUFFERED=1
BUDGET=${CHECK_BUDGET_S:-450}
STAGE2_MIN=${STAGE2_MIN_S:-300}
T0=$(date +%s)
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-$KIT/wheels}
RUN_ID="device-tiny-ci-cuda"
cd "$ROOT"

left() { echo $((BUDGET - ($(date +%s) - T0))); }

# step NAME FUNCTION CAP_S: FUNCTION runs under timeout (CAP_S, or what is left of the budget less 15 s for the
# summary); its exit status, seconds and log go to $W/steps.jsonl and $W/logs/NAME.log
step() {
    local name=$1 fn=$2 cap=$3 t rc s0
    if [ -n "$ONLY" ] && [ "$ONLY" != "$name" ] && [ "$name" != setup ]; then return; fi
    t=$(( $(left) - 15 ))
    [ "$t" -gt "$cap" ] && t=$cap
    s0=$(date +%s)
    if [ "$t" -lt 5 ]; then
        rc=124; echo "no time left in the ${BUDGET} s budget" > "$W/logs/$name.log"
    else
        echo "[check +$((s0 - T0))s] $name (timeout ${t} s)"
        export -f "$fn"
        timeout --kill-after=5 "$t" bash -c "$fn" > "$W/logs/$name.log" 2>&1
        rc=$?
    fi
    echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - s0 )), \"timeout_s\": $t}" >> "$W/steps.jsonl"
    tail -n 3 "$W/logs/$name.log" | sed "s/^/  $name| /"
}
export ROOT KIT W PY WHEELS DRY RUN_ID OUT STAGE2_MIN

s_setup() {
    set -e
    if [ "$DRY" = 1 ]; then
        bash -n "$KIT/check.sh" && bash -n "$KIT/prepare.sh"
        "$PY" -m py_compile "$KIT/kernel_figures.py" "$KIT/summary.py" "$KIT/exllamav3_checks.py"
        if [ -d "$WHEELS" ]; then
            bash "$KIT/prepare.sh" --check
            # the whole set installs offline for the image's Python (cp312 manylinux), as the device run does
            "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/xsite" --python-version 3.12 \
                --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --only-binary=:all: "$WHEELS"/*.whl
            echo "the carried wheels install offline for cp312: $(ls "$W/xsite" | grep -c dist-info) distributions"
        else
            echo "no $WHEELS here (prepare.sh makes it)"
        fi
        "$PY" -c 'import jsonschema, moetier, backends.cuda.backend; print("imports ok")'
        return
    fi
    mkdir -p "$W/site"
    ls "$WHEELS"/*.whl
    core=$(ls "$WHEELS"/*.whl | grep -E '/(jsonschema|jsonschema_specifications|referencing|rpds_py)-')
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" $core
    if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$W/site" "$ROOT"; then
        echo "moetier's own install failed (old setuptools?): running it from the tree (PYTHONPATH) alone"
    fi
    PYTHONPATH="$ROOT:$W/site" "$PY" -c 'import jsonschema, moetier, cupy; print("imports ok, cupy", cupy.__version__)'
}

s_device() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id,pcie.link.gen.max,pcie.link.width.max \
        --format=csv || echo "nvidia-smi: not here"
    "$PY" - <<'EOF'
import platform
print("python", platform.python_version())
for m in ("numpy", "numba", "cupy", "torch", "pynvml", "jsonschema"):
    try:
        mod = __import__(m)
        print(f"{m} {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"{m} missing ({type(e).__name__}: {e})")
try:
    import torch
    if torch.cuda.is_available():
        print("torch device", torch.cuda.get_device_name(0), "cc %d.%d" % torch.cuda.get_device_capability(0))
except Exception as e:
    print("torch cuda:", e)
EOF
}

s_doctor() {
    # without a GPU the cuda recipe cannot run (exit 1): the dry run asks about the cpu one, the same checks otherwise
    recipe=tiny-ci-cuda; [ "$DRY" = 1 ] && recipe=tiny-ci-cpu
    "$PY" -m moetier doctor --recipe "$recipe" --store-dir "$W" --json
}

s_conformance() {
    rc=0
    "$PY" -m moetier conformance --backend cuda --report "$W/conformance-cuda.json" || rc=$?
    # on a CPU machine the suite skips every check and exits 2 (no device): that is the dry run's pass
    if [ "$DRY" = 1 ] && [ "$rc" = 2 ]; then rc=0; fi
    return $rc
}

s_tests() { "$PY" -m pytest -q -rs -p no:cacheprovider -o addopts= tests/test_cuda_backend.py; }

s_kernels() { "$PY" "$KIT/kernel_figures.py" --out "$W/kernels.json"; }

s_run() {
    set -e
    if [ "$DRY" = 1 ]; then recipe=tiny-ci-cpu; backend=cpu; steps=8; conc=1; else
        recipe=tiny-ci-cuda; backend=cuda; steps=40; conc="1 2"; fi
    "$PY" -m moetier store pack moetier-tiny-ci-int8 --out "$W/store" --quiet
    "$PY" -m moetier run "$recipe" --store "$W/store" --backend "$backend" --conc $conc --steps "$steps" \
        --record "$RUN_ID" --probe "$W/probe.jsonl" --json --quiet > "$W/run.json"
    "$PY" - "$W/run.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for row in r["table"]:
    print(f"C{row['conc']}: measured {row['measured_tok_s']:.1f} tok/s, simulator {row['sim_tok_s']:.1f}; "
          f"NVMe reads/token run {row['reads_per_token']:.3f} vs simulator {row['sim_nvme_per_tok']:.3f}; "
          f"checksum failures {row['checksum_failures']}")
    assert abs(row["reads_per_token"] - row["sim_nvme_per_tok"]) < 1e-9, "plan parity: the run's reads differ"
    assert row["checksum_failures"] == 0
EOF
}

s_probe() {
    set -e
    "$PY" -m moetier probe report "$RUN_ID" --write --quiet > /dev/null
    "$PY" -m moetier probe report "$RUN_ID" --quiet > "$W/probe.md"
    cp "$MOETIER_REGISTRY/runs/$RUN_ID.json" "$W/run-record.json"
    head -n 20 "$W/probe.md"
}

s_bench() { "$PY" "$ROOT/benchmarks/bench_cuda.py" --quick --reps 5 --json --out "$W/bench_cuda.json" > /dev/null; }

s_stage2() {
    set -e
    if [ "$DRY" = 1 ]; then
        "$PY" "$KIT/exllamav3_checks.py" --help > /dev/null
        "$PY" "$KIT/exllamav3_checks.py" --arch-list || true     # no torch / no GPU here: says so
        return
    fi
    whl=$(ls "$WHEELS"/*.whl | grep -E '/(exllamav3|marisa_trie|pydantic|pydantic_core|annotated_types|typing_inspection|typing_extensions|llguidance)-')
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" $whl
    export TORCH_CUDA_ARCH_LIST="$("$PY" "$KIT/exllamav3_checks.py" --arch-list)" MAX_JOBS=$(nproc)
    export TORCH_EXTENSIONS_DIR="$W/torch_ext"
    echo "building exllamav3's extension: TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
    "$PY" "$KIT/exllamav3_checks.py" --out "$W/stage2.json"
}

budget_for_stage2() {
    if [ "$DRY" = 1 ] || [ "$ONLY" = stage2 ] || [ "$(left)" -ge "$STAGE2_MIN" ]; then return 0; fi
    echo "{\"step\": \"stage2\", \"rc\": null, \"seconds\": 0, \"timeout_s\": 0, \"note\": \"not started: $(left) s of the budget left, stage two needs $STAGE2_MIN s (run check.sh --only stage2)\"}" >> "$W/steps.jsonl"
    return 1
}

if [ "$DRY" = 0 ]; then export PYTHONPATH="$ROOT:$W/site${PYTHONPATH:+:$PYTHONPATH}"; else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"; fi
step setup s_setup 120
step device s_device 30
step doctor s_doctor 60
step conformance s_conformance 180
step tests s_tests 90
step kernels s_kernels 150
step run s_run 120
step probe s_probe 60
step bench s_bench 120
if budget_for_stage2; then step stage2 s_stage2 600; fi
"$PY" "$KIT/summary.py" --work "$W" --out "$OUT" $([ "$DRY" = 1 ] && echo --dry-run)
rc=$?
rm -rf "$W"
exit $rc
