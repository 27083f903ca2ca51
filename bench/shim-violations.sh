#!/usr/bin/env bash
# Cost of reporting filesystem violations (design 18): unpacking 5,000 small files (50
# directories of 100 files of 1 KiB) into a write root, bare, inside the shim, and inside
# the shim with `--violations`; and the shim's start (`-- true`) against a bare
# `unshare -Urnmpf true`. Goals: unpacking with --violations at most 1.2x without it;
# shim start within 3x the bare unshare. Works on a tmpfs when WORK names one (the disk
# otherwise). RUNS=N to change the run count; SHIM=/path/to/shim measures that binary.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v hyperfine >/dev/null; then
    apt-get install -y hyperfine >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y hyperfine >/dev/null; }
fi
if [ -n "${SHIM:-}" ]; then
    shim=$(realpath "$SHIM")
else
    cargo build --release -p shim >/dev/null
    shim="$PWD/target/release/shim"
fi

work=$(mktemp -d "${WORK:-${TMPDIR:-/tmp}}/shim-violations.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/out"
for d in $(seq 50); do
    mkdir -p "$work/src/d$d"
    for f in $(seq 100); do head -c 1024 /dev/zero > "$work/src/d$d/f$f"; done
done
tar -C "$work/src" -cf "$work/files.tar" .
rm -rf "$work/src"
unpack="tar -xf $work/files.tar -C $work/out"
clean="rm -rf $work/out && mkdir $work/out"
flags="--no-capture --allow example.com --allow-write $work/out"

hyperfine -N --warmup 3 --runs "${RUNS:-20}" --prepare "sh -c '$clean'" \
    --export-json "$work/unpack.json" \
    -n "bare tar" "$unpack" \
    -n "shim tar" "$shim $flags -- $unpack" \
    -n "shim tar --violations" "$shim $flags --violations $work/v.jsonl -- $unpack" >&2
hyperfine -N --warmup 10 --runs "${RUNS:-100}" --export-json "$work/start.json" \
    -n "unshare -Urnmpf true" "unshare -Urnmpf true" \
    -n "shim true" "$shim $flags -- true" \
    -n "shim true --violations" "$shim $flags --violations $work/v.jsonl -- true" >&2
python3 - "$work/unpack.json" "$work/start.json" <<'PY'
import json, sys
for f in sys.argv[1:]:
    rs = {r["command"]: r["median"] * 1000 for r in json.load(open(f))["results"]}
    for name, ms in rs.items():
        print(f"{name:>24}: median {ms:7.2f} ms")
    names = list(rs)
    if "shim tar" in rs:
        print(f"{'violations / shim':>24}: {rs['shim tar --violations'] / rs['shim tar']:.2f}x (goal <= 1.2x)")
    else:
        print(f"{'shim / unshare':>24}: {rs['shim true'] / rs['unshare -Urnmpf true']:.2f}x (goal <= 3x)")
PY
