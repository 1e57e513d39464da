#!/usr/bin/env bash
# One-shot CUDA backend check on a lent NVIDIA machine (H200). Run ONCE from the repository root:
#
#   device run:  command = "bash benchmarks/cuda_device_check.sh"   carry = ["build/cuda-wheels"]   timeout_s = 540
#
# The device machine has no network. Its image has python3 3.12 with cupy-cuda13x, numba, numpy, pytest, psutil,
# hypothesis and setuptools, but not jsonschema (a core dependency of moetier): build/cuda-wheels/ (ignored by git
# via build/, carried) holds jsonschema and its pure deps + rpds-py for cp312 manylinux. To refresh them here:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d build/cuda-wheels jsonschema jsonschema-specifications referencing rpds-py
#
# Steps (each bounded by `timeout`, total well under 8 minutes; progress lines start with [cuda-check +Ns]):
#   1. nvidia-smi: device name, driver, memory
#   2. venv with system site packages; pip install --no-index -e '.[cpu,test,cudaXX]' (XX = 13 when the image's
#      CuPy is cupy-cuda13x, else 12) finding jsonschema in build/cuda-wheels; falls back to PYTHONPATH=.
#   3. pack the tiny-ci store; `moetier run tiny-ci-cuda --backend cuda` (CLI path, all lanes)
#   4. pytest tests/test_cuda_backend.py -v
#   5. benchmarks/bench_cuda.py --json
#   6. $OUT/cuda_run_record.json: device (nvidia-smi), versions, pass/fail counts, bench headline, timings
# Files in $OUT: check.log, junit.xml, cli_run.json, bench_cuda.json, cuda_run_record.json
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/out/cuda-check}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
T0=$(date +%s)
log() { echo "[cuda-check +$(( $(date +%s) - T0 ))s] $*"; }
ROOT="$(pwd)"

# 1. device ------------------------------------------------------------------------------------------------------
log "device"
SMI="$(nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader 2>&1 | head -1)"
SMI_RC=$?
echo "$SMI"
nvidia-smi 2>&1 | head -15

# 2. environment -------------------------------------------------------------------------------------------------
log "environment"
SYSPY="$(command -v python3)"
EXTRA=cuda12
if "$SYSPY" -c "import importlib.metadata as m; m.version('cupy-cuda13x')" 2>/dev/null; then EXTRA=cuda13; fi
INSTALL=editable
PY=/tmp/moetier-venv/bin/python
if ! timeout 120 "$SYSPY" -m venv --system-site-packages /tmp/moetier-venv; then
  log "venv creation failed; using $SYSPY with PYTHONPATH"
  PY="$SYSPY"; INSTALL=pythonpath
fi
if [ "$INSTALL" = editable ]; then
  if ! timeout 180 "$PY" -m pip install -q --no-index --find-links build/cuda-wheels --no-build-isolation \
        -e ".[cpu,test,$EXTRA]"; then
    log "editable install failed (offline); installing the carried wheels and using PYTHONPATH"
    timeout 120 "$PY" -m pip install -q --no-index --no-deps build/cuda-wheels/*.whl || true
    INSTALL=pythonpath
  fi
fi
if [ "$INSTALL" = pythonpath ]; then export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"; fi
"$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for m in ("numpy", "numba", "cupy", "jsonschema", "pytest", "moetier"):
    try:
        mod = importlib.import_module(m)
        print(f"  {m} {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"  {m} MISSING: {type(e).__name__}: {e}")
import cupy
print("  cupy.cuda.is_available():", cupy.cuda.is_available(), "runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "driver", cupy.cuda.runtime.driverGetVersion())
EOF

# 3. tiny store + CLI run ----------------------------------------------------------------------------------------
log "pack tiny store"
STORE=/tmp/moetier-tiny-ci
timeout 120 "$PY" -m moetier store pack moetier-tiny-ci-int8 --out "$STORE"
PACK_RC=$?
log "moetier run tiny-ci-cuda --backend cuda"
timeout 120 "$PY" -m moetier run tiny-ci-cuda --store "$STORE" --backend cuda --conc 1 2 --steps 20 --no-record \
  --json > "$OUT/cli_run.json"
CLI_RC=$?
head -c 1500 "$OUT/cli_run.json"; echo

# 4. tests -------------------------------------------------------------------------------------------------------
log "pytest tests/test_cuda_backend.py"
timeout 300 "$PY" -m pytest tests/test_cuda_backend.py -v -rs -p no:cacheprovider --junitxml="$OUT/junit.xml"
TEST_RC=$?

# 5. bench -------------------------------------------------------------------------------------------------------
log "bench_cuda"
timeout 200 "$PY" benchmarks/bench_cuda.py --json --reps 5 --out "$OUT/bench_cuda.json" > /dev/null
BENCH_RC=$?

# 6. run record --------------------------------------------------------------------------------------------------
log "run record"
SMI="$SMI" SMI_RC=$SMI_RC PACK_RC=$PACK_RC CLI_RC=$CLI_RC TEST_RC=$TEST_RC BENCH_RC=$BENCH_RC INSTALL=$INSTALL \
EXTRA=$EXTRA T0=$T0 OUTDIR="$OUT" "$PY" - <<'EOF'
import json, os, platform, subprocess, time
import xml.etree.ElementTree as ET
e = os.environ
rec = {"kind": "cuda-device-check", "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "device_nvidia_smi": e["SMI"], "nvidia_smi_rc": int(e["SMI_RC"]), "host": platform.node(),
       "python": platform.python_version(), "install": e["INSTALL"], "extra": e["EXTRA"],
       "rc": {"pack": int(e["PACK_RC"]), "cli_run": int(e["CLI_RC"]), "pytest": int(e["TEST_RC"]),
              "bench": int(e["BENCH_RC"])},
       "seconds": int(time.time()) - int(e["T0"])}
try:
    import cupy
    rec["cupy"] = cupy.__version__
    rec["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    rec["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
except Exception as ex:
    rec["cupy"] = f"unavailable: {ex}"
try:
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    rec["git_head"] = git.stdout.strip() or None
except Exception:
    rec["git_head"] = None
out = e["OUTDIR"]
try:
    root = ET.parse(os.path.join(out, "junit.xml")).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = []
    for s in suites:
        for tc in s.iter("testcase"):
            st = "passed"
            for tag in ("failure", "error", "skipped"):
                el = tc.find(tag)
                if el is not None:
                    st = tag if tag != "failure" else "failed"
                    tests.append({"name": tc.get("name"), "status": st, "message": (el.get("message") or "")[:300]})
                    break
            else:
                tests.append({"name": tc.get("name"), "status": st})
    rec["tests"] = tests
    rec["tests_summary"] = {k: sum(t["status"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
except Exception as ex:
    rec["tests"] = f"junit unreadable: {ex}"
try:
    b = json.load(open(os.path.join(out, "bench_cuda.json")))
    rec["bench"] = {k: b.get(k) for k in ("device", "d2d_copy_gbps", "h2d_pinned_gbps", "gpu_target_met", "skipped")}
    rec["bench"]["geometries"] = [{k: g.get(k) for k in ("geometry", "gpu_kernel_gbps", "gpu_fraction_of_d2d",
                                                           "gpu_one_expert_ms", "zerocopy_gbps",
                                                           "zerocopy_fraction_of_h2d", "push_gbps",
                                                           "push_fraction_of_h2d")} for g in b.get("geometries", [])]
except Exception as ex:
    rec["bench"] = f"unreadable: {ex}"
try:
    c = json.load(open(os.path.join(out, "cli_run.json")))
    rec["cli_run"] = c if len(json.dumps(c)) < 4000 else "see cli_run.json"
except Exception as ex:
    rec["cli_run"] = f"unreadable: {ex}"
json.dump(rec, open(os.path.join(out, "cuda_run_record.json"), "w"), indent=2)
print(json.dumps({k: rec[k] for k in ("device_nvidia_smi", "rc", "seconds")}))
print("tests:", rec.get("tests_summary"))
print("bench:", json.dumps(rec.get("bench"))[:1500])
EOF
log "done (pytest rc=$TEST_RC, bench rc=$BENCH_RC, cli rc=$CLI_RC)"
[ "$TEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ] && [ "$CLI_RC" -eq 0 ]
