#!/usr/bin/env bash
# Startup cost of confinement: `shim ... -- true` with filesystem rules (a writable repo
# root with its mandatory deny set, a read mask), seccomp, Landlock and the channel
# binding, against a per-authority socket (standalone-mediator mode) and in embedded mode,
# with transparent capture (the default: TUN device, netlink, stub resolver) and without.
# Goal: median under 20 ms, capture on. Prints the medians; RUNS=N to change the run count;
# SHIM=/path/to/shim measures that binary instead of building target/release/shim.
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

work=$(mktemp -d)
srv=
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/repo/.git/hooks" "$work/repo/src"
echo "[core]" > "$work/repo/.git/config"
echo "secret" > "$work/secret"
# Stand-in for the mediator's per-authority socket: the shim connects to it only when the
# command opens a proxy connection, which `true` does not.
python3 -c 'import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); time.sleep(3600)' "$work/authority.sock" &
srv=$!
for _ in $(seq 50); do [ -S "$work/authority.sock" ] && break; sleep 0.1; done

cd "$work/repo"
hyperfine -N --warmup 10 --runs "${RUNS:-100}" --export-json "$work/result.json" \
    -n "bare true" "true" \
    -n "shim (socket)" "$shim --mediator-socket $work/authority.sock --allow-write $work/repo --deny-read $work/secret -- true" \
    -n "shim (embedded)" "$shim --allow example.com --allow-write $work/repo --deny-read $work/secret -- true" \
    -n "socket, no capture" "$shim --no-capture --mediator-socket $work/authority.sock --allow-write $work/repo --deny-read $work/secret -- true" \
    -n "embedded, no capture" "$shim --no-capture --allow example.com --allow-write $work/repo --deny-read $work/secret -- true" >&2
python3 - "$work/result.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f'{r["command"]:>20}: median {r["median"]*1000:6.2f} ms  (mean {r["mean"]*1000:.2f} ± {r["stddev"]*1000:.2f} ms)')
PY
