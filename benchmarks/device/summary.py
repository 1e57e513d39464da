"""What benchmarks/device/check.sh brings back: its work folder's results gathered into $OUT.

    python benchmarks/device/summary.py --work W --out OUT [--dry-run]

Writes into OUT at most 8 files (a device run brings no more back, each named in letters, digits, '.', '_', '-'):

* summary.json - every step's exit status, seconds, timeout and last log lines; the device (nvidia-smi's line);
  ``ok``: every started step exited 0; ``stage2``: ran, or why not;
* conformance-cuda.json (the suite's report) and conformance-cuda.md (the same as a markdown table);
* kernels.json, run-record.json, probe.md, stage2.json - each where its step made it;
* logs.tar.gz - every step's whole log, the run's JSON, the probe's samples and bench_cuda.py's JSON.

Exit status: 0 when every started step passed, 1 otherwise (the summary says which).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import time
from pathlib import Path

MAX_FILES = 8
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
KEPT = ("conformance-cuda.json", "kernels.json", "run-record.json", "probe.md", "stage2.json")
TAIL = 20


def conformance_md(report: dict) -> str:
    c = report.get("counts", {})
    lines = [f"# conformance: backend {report.get('backend')}", "",
             f"{c.get('pass', 0)} passed, {c.get('fail', 0)} failed, {c.get('skip', 0)} skipped "
             f"in {report.get('seconds', 0)} s" + (f"; unavailable: {report['unavailable']}"
                                                    if report.get("unavailable") else ""),
             "", "| check | outcome | seconds | reason |", "|---|---|---|---|"]
    for ch in report.get("checks", []):
        reason = str(ch.get("reason", "")).replace("|", "\\|")
        lines.append(f"| {ch['check']} | {ch['outcome']} | {ch.get('seconds', '')} | {reason} |")
    return "\n".join(lines) + "\n"


def steps(work: Path) -> list:
    out = []
    path = work / "steps.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        s = json.loads(line)
        log = work / "logs" / f"{s['step']}.log"
        s["log_tail"] = log.read_text(errors="replace").splitlines()[-TAIL:] if log.exists() else []
        out.append(s)
    return out


def device_name(work: Path) -> str | None:
    log = work / "logs" / "device.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line.startswith("torch device ") or ("NVIDIA" in line and "," in line):
            return line.strip()
    return None


def gather(work: Path, out: Path, dry_run: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = steps(work)
    started = [s for s in rows if s["rc"] is not None]
    files = []
    for name in KEPT:
        if (work / name).exists():
            shutil.copyfile(work / name, out / name)
            files.append(name)
    if (work / "conformance-cuda.json").exists():
        (out / "conformance-cuda.md").write_text(conformance_md(json.loads((work / "conformance-cuda.json")
                                                                          .read_text())))
        files.append("conformance-cuda.md")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for p in sorted(work.glob("logs/*.log")) + [work / n for n in ("run.json", "probe.jsonl", "bench_cuda.json")]:
            if p.exists():
                tar.add(p, arcname=p.relative_to(work).as_posix())
    files.append("logs.tar.gz")
    stage2 = next((s for s in rows if s["step"] == "stage2"), None)
    summary = {"kind": "device-check", "dry_run": dry_run, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "device": device_name(work), "ok": bool(started) and all(s["rc"] == 0 for s in started),
               "failed": [s["step"] for s in started if s["rc"] != 0],
               "stage2": "not in this run" if stage2 is None else (stage2.get("note") or f"exit {stage2['rc']}"),
               "steps": rows, "files": sorted(files + ["summary.json"])}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    present = sorted(p.name for p in out.iterdir())
    bad = [n for n in present if not NAME.match(n) or not (out / n).is_file()]
    if len(present) > MAX_FILES or bad:
        raise SystemExit(f"summary: {out} holds {len(present)} entries {present} (a device run brings back at most "
                         f"{MAX_FILES} plain files named in letters, digits, '.', '_', '-')")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True, help="check.sh's work folder")
    ap.add_argument("--out", required=True, help="where the results go ($OUT)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    s = gather(Path(a.work), Path(a.out), a.dry_run)
    for r in s["steps"]:
        print(f"{r['step']:12s} rc {r['rc']!s:4s} {r['seconds']:4d} s  {r.get('note', '')}")
    print(f"device: {s['device']}; {'all steps passed' if s['ok'] else 'failed: ' + ', '.join(s['failed'])}; "
          f"files in {a.out}: {', '.join(s['files'])}")
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
