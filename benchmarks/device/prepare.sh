#!/usr/bin/env bash
# Run on a development machine (with a package index) before a GPU session: puts every Python wheel the GPU image
# lacks into benchmarks/device/wheels/ (ignored by git; a device run carries it beside the working tree), lists them
# with their sizes and refuses a folder over 64 MiB (what a device run may carry). Usage:
#
#   bash benchmarks/device/prepare.sh            # the wheels moetier needs there, plus stage two's (exllamav3 1.6.5)
#   bash benchmarks/device/prepare.sh --check    # only list and size-check the folder as it is
#
# What the image lacks (its package list: .library/device/KINDS.md, the issue's image description): of moetier's own
# dependencies (pyproject.toml) only jsonschema, with its dependencies referencing, jsonschema-specifications and
# rpds-py (attrs is there); dpctl is not needed on an NVIDIA machine. Stage two (exllamav3's real kernels) adds the
# exllamav3 1.6.5 wheel (pure Python plus the CUDA sources its first import compiles) and its import-time
# requirements the image lacks: marisa-trie, pydantic (with pydantic-core, annotated-types, typing-inspection and a
# typing-extensions new enough for it) and llguidance. Every wheel is cp312 manylinux x86_64 or pure Python, one
# version per name, fetched with --no-deps (the names above are the whole set: the image has the rest). The index
# may hold no llguidance as new as exllamav3 1.6.5 asks for (>= 1.7): the newest there is taken, and pip, installing
# with --no-deps, does not object; whether the engine imports with it shows only in stage two's log.
set -euo pipefail
cd "$(dirname "$0")"
DIR=wheels
LIMIT=$((64 * 1024 * 1024))
CORE=(jsonschema jsonschema-specifications referencing rpds-py)
STAGE2=("exllamav3==1.6.5" marisa-trie pydantic pydantic-core annotated-types typing-inspection typing-extensions
        llguidance)

check() {
    [ -d "$DIR" ] || { echo "prepare: $PWD/$DIR does not exist (run prepare.sh without --check first)" >&2; exit 2; }
    local total=0 n=0 f size
    for f in "$DIR"/*.whl; do
        [ -e "$f" ] || continue
        size=$(stat -c %s "$f"); total=$((total + size)); n=$((n + 1))
        printf '%10d  %s\n' "$size" "$(basename "$f")"
    done
    printf '%10d  total, %d wheels (limit %d)\n' "$total" "$n" "$LIMIT"
    dups=$(for f in "$DIR"/*.whl; do [ -e "$f" ] && basename "$f" | cut -d- -f1 | tr 'A-Z-' 'a-z_'; done | sort | uniq -d)
    if [ -n "$dups" ]; then echo "prepare: more than one version of: $dups (pip install stops on two)" >&2; exit 2; fi
    if [ "$total" -gt "$LIMIT" ]; then
        echo "prepare: $DIR holds $total bytes, over the 64 MiB a device run carries" >&2; exit 2
    fi
}

if [ "${1:-}" = "--check" ]; then check; exit 0; fi
[ $# -eq 0 ] || { echo "usage: prepare.sh [--check]" >&2; exit 2; }
rm -rf "$DIR.tmp"
mkdir -p "$DIR.tmp"
py=${PYTHON:-python3}
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR.tmp" "${CORE[@]}" "${STAGE2[@]}"
rm -rf "$DIR"
mv "$DIR.tmp" "$DIR"
check
