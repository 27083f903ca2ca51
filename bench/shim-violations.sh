#!/usr/bin/env bash
# Cost of reporting filesystem violations (design 18): unpacking 5,000 small files (50
# directories of 100 files of 1 KiB) into a write root, bare, inside the shim, and inside
# the shim with `--violations`; and the shim's start (`-- true`) against a bare
# `unshare -Urnmpf true`, with an empty write root and with the 5,000 unpacked files in
# it (the shim reads every directory of a write root at start, for nested repositories).
# Goals: unpacking with --violations at most 1.2x without it; shim start within 3x the
# bare unshare. Works on a tmpfs when WORK names one (the disk otherwise). Every run
# starts with the disk settled (`sync`): the unpacking's writeback would otherwise slow
# whatever comes next (the shim's placeholders are written to the host's disk at start),
# so the start runs come first.
# RUNS=N to change the run count; SHIM=/path/to/shim measures that binary.
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
mkdir -p "$work/src" "$work/out" "$work/empty"
for d in $(seq 50); do
    mkdir -p "$work/src/d$d"
    for f in $(seq 100); do head -c 1024 /dev/zero > "$work/src/d$d/f$f"; done
done
tar -C "$work/src" -cf "$work/files.tar" .
rm -rf "$work/src"
unpack="tar -xf $work/files.tar -C $work/out"
clean="rm -rf $work/out && mkdir $work/out && sync"
flags="--no-capture --allow example.com --allow-write $work/out"
empty="--no-capture --allow example.com --allow-write $work/empty"

# Start first, before the unpacking runs churn the disk: an empty write root, and one
# holding the 5,000 files.
mkdir -p "$work/full"
tar -xf "$work/files.tar" -C "$work/full"
sync
hyperfine -N --warmup 10 --runs "${RUNS:-100}" --export-json "$work/start.json" \
    -n "unshare -Urnmpf true" "unshare -Urnmpf true" \
    -n "shim true" "$shim $empty -- true" \
    -n "shim true, 5,000 files" "$shim --no-capture --allow example.com --allow-write $work/full -- true" \
    -n "shim true --violations" "$shim $empty --violations $work/v.jsonl -- true" >&2
hyperfine -N --warmup 3 --runs "${RUNS:-20}" --prepare "sh -c '$clean'" \
    --export-json "$work/unpack.json" \
    -n "bare tar" "$unpack" \
    -n "shim tar" "$shim $flags -- $unpack" \
    -n "shim tar --violations" "$shim $flags --violations $work/v.jsonl -- $unpack" >&2
python3 - "$work/start.json" "$work/unpack.json" <<'PY'
import json, sys
for f in sys.argv[1:]:
    rs = {r["command"]: r["median"] * 1000 for r in json.load(open(f))["results"]}
    for name, ms in rs.items():
        print(f"{name:>24}: median {ms:7.2f} ms")
    names = list(rs)
    if "shim tar" in rs:
        print(f"{'violations / shim':>24}: {rs['shim tar --violations'] / rs['shim tar']:.2f}x (goal <= 1.2x)")
    else:
        base = rs['unshare -Urnmpf true']
        print(f"{'shim / unshare':>24}: {rs['shim true'] / base:.2f}x (goal <= 3x)")
        print(f"{'5,000 files / unshare':>24}: {rs['shim true, 5,000 files'] / base:.2f}x (goal <= 3x)")
PY
