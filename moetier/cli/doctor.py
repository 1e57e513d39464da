"""`moetier doctor`: what on this machine works for moetier, and the one command that fixes what does not.

Contract
--------
``moetier doctor [--recipe ID] [--store-dir DIR] [--json]`` checks, in order: Python and package versions; numba;
dpctl and the OpenCL / Level Zero devices it sees; cupy and its GPU; O_DIRECT on the filesystem of DIR (an aligned
O_DIRECT read of a temporary file written there); transparent huge pages; free disk on DIR against the recipe's
store size; RAM against the recipe's RAM budget; the registry in use; the recipe's records and trace.

Each check is ``{"name", "status": ok|warn|fail|skip, "detail", "fix"}``; ``fix`` is one command (or one action)
when the status is not ok; a missing package's fix installs the extra the way this copy was installed (an
editable install of the source checkout it runs from, else the installed distribution's extra). The recipe *can run* when its records resolve and its trace loads (so it can be
simulated) and, when its engines are ones a moetier backend runs (numba-cpu -> cpu, sycl-opencl-cpu -> sycl,
cuda-cupy -> cuda), that backend works here, the RAM budget fits this machine's memory and the store fits on DIR.
A recipe whose engines are another program's (a reference machine's, such as exllamav3-cuda) is checked for
simulation only, and the output says so. Exit status: 0 when the recipe can run, 1 otherwise, 2 on bad arguments.
"""
from __future__ import annotations

import mmap
import os
import platform
import sys
import tempfile
from pathlib import Path

from moetier.errors import UserError

ENGINE_BACKEND = {"numba-cpu": "cpu", "sycl-opencl-cpu": "sycl", "cuda-cupy": "cuda"}
BACKEND_CHECK = {"cpu": "numba (", "sycl": "dpctl (", "cuda": "cupy ("}
PACKAGES = ("numpy", "jsonschema", "psutil", "xxhash", "rich", "matplotlib", "numba", "dpctl", "cupy", "ray")


def register(sub, parser_class) -> None:
    from moetier.cli.common import DEFAULT_RECIPE
    p = sub.add_parser("doctor", help="check this machine: packages, devices, O_DIRECT, huge pages, disk; exit 0 "
                       "when the recipe can run")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe to check (default {DEFAULT_RECIPE})")
    p.add_argument("--store-dir", default=".", help="where the recipe's store is or will be (O_DIRECT and free "
                   "disk are checked there; default: the current directory)")
    p.add_argument("--json", action="store_true", help="machine-readable output: {checks, can_run, level}")
    p.set_defaults(fn=cmd_doctor)


def _check(name, status, detail, fix=None) -> dict:
    return {"name": name, "status": status, "detail": detail, "fix": fix if status != "ok" else None}


def _version(mod: str):
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:                                   # pragma: no cover
        return None
    for dist in (mod, {"cupy": "cupy-cuda12x"}.get(mod, mod), {"cupy": "cupy-cuda13x"}.get(mod, mod)):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def source_checkout(package_file: str) -> Path | None:
    """The repository root when moetier runs from a source checkout (editable install or PYTHONPATH), else None.

    A checkout has moetier's pyproject.toml beside the package; a wheel leaves the package alone in site-packages."""
    root = Path(package_file).resolve().parent.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "moetier"' in text else None


def install(extra: str | None = None) -> str:
    """The pip line that installs moetier (with ``extra``) the way this copy was installed: an editable install of
    the checkout it runs from, or the extra of the installed distribution (a wheel has no checkout to point at)."""
    import moetier
    root = source_checkout(moetier.__file__)
    suffix = f"[{extra}]" if extra else ""
    where = f"-e '{root}{suffix}'" if root else f"'moetier{suffix}'"
    return f"{sys.executable} -m pip install {where}"


def check_python() -> list[dict]:
    from moetier import __version__
    ok = sys.version_info >= (3, 10)
    out = [_check("python", "ok" if ok else "fail", f"Python {platform.python_version()} ({sys.executable}); "
                  f"moetier {__version__}", "install Python >= 3.10")]
    vers = {m: _version(m) for m in PACKAGES}
    core_missing = [m for m in ("numpy", "jsonschema", "psutil", "xxhash", "rich") if not vers[m]]
    out.append(_check("packages", "fail" if core_missing else "ok",
                      ", ".join(f"{m} {v or '-'}" for m, v in vers.items()),
                      f"{install()} (missing: {', '.join(core_missing)})"))
    return out


def check_numba() -> dict:
    try:
        import numba
    except ImportError:
        return _check("numba (cpu backend)", "fail", "not installed", install("cpu"))
    return _check("numba (cpu backend)", "ok", f"numba {numba.__version__}, {numba.config.NUMBA_NUM_THREADS} threads")


def check_dpctl() -> dict:
    try:
        from backends.sycl.backend import import_dpctl     # points OpenCL at the venv's CPU runtime, as runs do
        dpctl = import_dpctl()
    except Exception:                                      # BackendUnavailable, or ImportError of the package
        return _check("dpctl (sycl backend)", "fail", "not installed", install("sycl"))
    try:
        devs = dpctl.get_devices()
    except Exception as e:                                 # a broken runtime raises its own types
        return _check("dpctl (sycl backend)", "fail", f"dpctl {dpctl.__version__}: listing devices failed: {e}",
                      install("sycl") + " (brings Intel's OpenCL CPU runtime)")
    names = [f"{d.backend.name}:{d.device_type.name} {d.name}" for d in devs]
    if not names:
        return _check("dpctl (sycl backend)", "fail", f"dpctl {dpctl.__version__}: no OpenCL / Level Zero device",
                      install("sycl") + " (brings Intel's OpenCL CPU runtime)")
    return _check("dpctl (sycl backend)", "ok", f"dpctl {dpctl.__version__}: " + "; ".join(names))


def check_cupy() -> dict:
    try:
        import cupy
    except ImportError:
        return _check("cupy (cuda backend)", "skip", "not installed (only needed with an NVIDIA GPU)",
                      install("cuda12") + " (cuda13 for a CUDA 13 driver)")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(n)]
    except Exception as e:                                 # CUDARuntimeError without a driver
        return _check("cupy (cuda backend)", "fail", f"cupy {cupy.__version__}: no usable GPU ({e})",
                      "install the NVIDIA driver (nvidia-smi must list the GPU)")
    if not names:
        return _check("cupy (cuda backend)", "fail", f"cupy {cupy.__version__}: no GPU",
                      "install the NVIDIA driver (nvidia-smi must list the GPU)")
    return _check("cupy (cuda backend)", "ok", f"cupy {cupy.__version__}: " + "; ".join(names))


def o_direct(dirpath) -> tuple[bool, str]:
    """Whether an aligned O_DIRECT read of a file in ``dirpath`` works: (works, what happened)."""
    if not hasattr(os, "O_DIRECT"):
        return False, f"this OS ({platform.system()}) has no O_DIRECT"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".moetier-doctor-", dir=dirpath)
    except OSError as e:
        return False, f"cannot create a file in {dirpath}: {e.strerror}"
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(8192))
            f.flush()
            os.fsync(f.fileno())
        buf = mmap.mmap(-1, 8192)                          # page-aligned, as O_DIRECT needs
        try:
            dfd = os.open(tmp, os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            return False, f"open(O_DIRECT) refused: {e.strerror}"
        try:
            n = os.preadv(dfd, [buf], 4096)
        except OSError as e:
            return False, f"aligned O_DIRECT read failed: {e.strerror}"
        finally:
            os.close(dfd)
        return n == 4096, f"aligned 4 KiB O_DIRECT read: {n} bytes"
    finally:
        os.unlink(tmp)


def check_o_direct(dirpath) -> dict:
    ok, what = o_direct(dirpath)
    return _check(f"O_DIRECT on {dirpath}", "ok" if ok else "warn", what,
                  "put the store on a local ext4/xfs disk (tmpfs and some overlay filesystems refuse O_DIRECT; "
                  "reads then go through the page cache): --store-dir /var/tmp")


def check_huge_pages() -> dict:
    p = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    try:
        mode = p.read_text().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return _check("transparent huge pages", "skip", "not reported by this kernel", None)
    ok = mode in ("always", "madvise")
    return _check("transparent huge pages", "ok" if ok else "warn", f"mode {mode} (the RAM slot pool asks with "
                  "madvise)", f"echo madvise | sudo tee {p}")


def store_bytes(R) -> int:
    st = R.model.get("store") or {}
    return int((st.get("record_bytes") or R.expert_bytes) * R.keys)


def check_disk(R, dirpath) -> dict:
    import shutil
    need = store_bytes(R)
    try:
        free = shutil.disk_usage(dirpath).free
    except OSError as e:
        return _check(f"free disk on {dirpath}", "fail", f"cannot stat: {e.strerror}", "--store-dir DIR (a writable "
                      "directory)")
    ok = free >= need
    return _check(f"free disk on {dirpath}", "ok" if ok else "fail", f"{free / 1e9:.1f} GB free; the store of "
                  f"{R.model_id} needs {need / 1e9:.1f} GB", f"free {(need - free) / 1e9:.1f} GB there, or "
                  "--store-dir on a larger disk")


def check_ram(R) -> dict:
    import psutil
    total = psutil.virtual_memory().total
    need = float(R.raw.get("budget", {}).get("ram_gb") or 0) * 1e9
    ok = need <= total
    return _check("RAM", "ok" if ok else "fail", f"{total / 1e9:.1f} GB here; the recipe's budget.ram_gb is "
                  f"{need / 1e9:.1f} GB", f"a recipe whose budget.ram_gb fits (try it first: moetier sim {R.id} "
                  f"--set budget.ram_gb={max(1, int(total / 1e9 * 0.6))})")


def check_registry() -> dict:
    from moetier.core import records as spec
    n = {k: len(spec.record_ids(k)) for k in spec.KINDS}
    return _check("registry", "ok", f"{spec.REGISTRY} (" + ", ".join(f"{v} {k}" for k, v in n.items()) + ")")


def check_recipe(recipe: str):
    """(check, resolved recipe or None) for the recipe's records and trace."""
    from moetier.core import records as spec
    from moetier.cli.common import find_path
    from moetier.traces.format import load_trace
    try:
        R = spec.resolve(recipe)
    except UserError as e:
        return _check(f"recipe {recipe}", "fail", str(e), "moetier list recipe (the recipes there are)"), None
    if not R.trace:
        return _check(f"recipe {recipe}", "warn", "records resolve; no trace named (give --trace to sim)",
                      f"moetier trace gen --model {R.model_id} --out my.npz"), R
    try:
        load_trace(find_path(R.trace), None, layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
    except UserError as e:
        return _check(f"recipe {recipe}", "fail", f"records resolve; trace: {e}",
                      f"moetier trace gen --model {R.model_id} --out my.npz"), R
    return _check(f"recipe {recipe}", "ok", f"records resolve ({R.model_id} on {R.hardware_id}); trace {R.trace} "
                  "loads"), R


def diagnose(recipe: str, store_dir) -> dict:
    store_dir = str(store_dir)
    checks = check_python() + [check_numba(), check_dpctl(), check_cupy(), check_o_direct(store_dir),
                               check_huge_pages(), check_registry()]
    rc, R = check_recipe(recipe)
    checks.append(rc)
    can_sim = rc["status"] != "fail" and all(c["status"] != "fail" for c in checks[:2])
    backends = sorted({ENGINE_BACKEND[e] for e in (R.raw.get("engines") or []) if e in ENGINE_BACKEND}) \
        if R is not None else []
    level = "run" if backends else "sim"
    can_run = can_sim
    if R is not None and backends:
        mods = [BACKEND_CHECK[b] for b in backends]
        need = [c for c in checks if any(c["name"].startswith(m) for m in mods)]
        extra = [check_disk(R, store_dir), check_ram(R)]
        checks += extra
        can_run = can_sim and all(c["status"] == "ok" for c in need + extra)
    elif R is not None:
        checks.append(_check("run here", "skip", f"the recipe's engines ({', '.join(R.raw.get('engines') or [])}) "
                             "are not moetier backends: it is checked for simulation (moetier sim / table)",
                             "moetier doctor --recipe tiny-local-cpu (a recipe this machine runs for real)"))
    return {"recipe": recipe, "level": level, "backends": backends, "can_run": bool(can_run), "checks": checks}


MARK = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}


def cmd_doctor(args) -> int:
    from moetier.cli.common import _emit
    from moetier.cli.render import table
    from moetier.core import records as spec
    if not os.path.isdir(args.store_dir):
        raise UserError(f"doctor: --store-dir {args.store_dir}: not a directory")
    if args.recipe not in spec.record_ids("recipe"):
        raise UserError(f"doctor: --recipe {args.recipe!r}: no such recipe (moetier list recipe)")
    d = diagnose(args.recipe, args.store_dir)
    if args.json:
        _emit(d)
        return 0 if d["can_run"] else 1
    table(["check", "status", "detail"], [[c["name"], MARK[c["status"]], c["detail"]] for c in d["checks"]],
          title="moetier doctor")
    fixes = [c for c in d["checks"] if c["fix"] and c["status"] in ("fail", "warn")]
    if fixes:
        print()
        for c in fixes:
            print(f"fix {c['name']}: {c['fix']}")
    what = (f"run for real on {', '.join(d['backends'])}" if d["level"] == "run" else "be simulated")
    print(f"\nrecipe {d['recipe']}: {'can' if d['can_run'] else 'can NOT'} {what} here")
    return 0 if d["can_run"] else 1
