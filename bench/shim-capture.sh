#!/usr/bin/env bash
# Capture at proxy speed (design 15): one large download by curl inside the shim bound to
# a standalone mediator, three ways, in one run: captured (`curl --noproxy '*'`: the
# child's TCP goes through the shim's TUN and user-space stack), through the proxy
# variables (`curl` with HTTP_PROXY: the mediator's Unix channel via the shim's relay),
# and direct (no shim, no mediator). Prints MB/s, the shim's and the mediator's CPU
# seconds per GB, and the goals: captured >= 0.8x the proxy path; the shim's CPU per GB
# at most 2x the mediator's on the proxy path. Loopback and the sandbox's own namespace
# only. Knobs: BYTES (1000000000), RUNS (3), SHIM and MEDIATOR (binaries: nothing is built
# when both are given).
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES=${BYTES:-1000000000}
RUNS=${RUNS:-3}
if [ -n "${SHIM:-}" ] && [ -n "${MEDIATOR:-}" ]; then
    shim=$(realpath "$SHIM"); mediator=$(realpath "$MEDIATOR")
    origin_bin=$(realpath "${ORIGIN:-target/release/origin}")
else
    cargo build --release -p shim -p mediator -p bench >/dev/null
    shim=$PWD/target/release/shim; mediator=$PWD/target/release/mediator
    origin_bin=$PWD/target/release/origin
fi
work=$(mktemp -d)
chmod 755 "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

"$origin_bin" --listen 127.0.0.1:0 >"$work/origin.out" 2>/dev/null &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$work/origin.out" && break; sleep 0.05; done
port=$(awk '/^listening/ {print $2}' "$work/origin.out" | cut -d: -f2)

mkdir -p "$work/sockets" "$work/rw"
cat >"$work/mediator.toml" <<TOML
[listen]
socket_dir = "$work/sockets"
[resolver]
hosts = { "origin.test" = ["127.0.0.1"] }
[log]
decisions = "$work/decisions.json"
[[authority]]
name = "bench"
allow = ["origin.test:$port"]
allow_private = ["127.0.0.1/32"]
TOML
"$mediator" --config "$work/mediator.toml" 2>"$work/mediator.err" &
med=$!
pids+=($med)
for _ in $(seq 100); do [ -S "$work/sockets/bench.sock" ] && break; sleep 0.05; done

cpu() { # CPU seconds of a process tree (utime + stime + children's)
    local t=0 p
    for p in $1 $(pgrep -P "$1" 2>/dev/null || true); do
        [ -r "/proc/$p/stat" ] || continue
        t=$(( t + $(awk '{print $14 + $15 + $16 + $17}' "/proc/$p/stat") ))
    done
    echo "$t"
}
hz=$(getconf CLK_TCK)
url="http://origin.test:$port/bytes/$BYTES"
results=$work/results
: >"$results"
run() { # label, then the command
    local label=$1; shift
    local m0 s0 t0 t1 m1 spid s1
    m0=$(cpu "$med")
    t0=$(date +%s.%N)
    "$@" &
    spid=$!
    s1=0
    # The shim's own CPU: sampled until it exits (its children are the child tree, which
    # is curl's, not the shim's work: only the shim process itself is counted).
    while kill -0 "$spid" 2>/dev/null; do
        s0=$(awk '{print $14 + $15}' "/proc/$spid/stat" 2>/dev/null || echo "$s1")
        s1=$s0
        sleep 0.05
    done
    wait "$spid"
    t1=$(date +%s.%N)
    m1=$(cpu "$med")
    echo "$label $t0 $t1 $(( m1 - m0 )) $s1" >>"$results"
}
direct_curl=(curl -s -o /dev/null --resolve "origin.test:$port:127.0.0.1" "$url")
for _ in $(seq "$RUNS"); do
    run direct "${direct_curl[@]}"
    run proxy "$shim" --mediator-socket "$work/sockets/bench.sock" --allow-write "$work/rw" --quiet-denials \
        -- curl -s -o /dev/null "$url"
    run capture "$shim" --mediator-socket "$work/sockets/bench.sock" --allow-write "$work/rw" --quiet-denials \
        -- curl -s --noproxy '*' -o /dev/null "$url"
done
python3 - "$results" "$BYTES" "$hz" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    label, t0, t1, med, shim = line.split()
    rows.setdefault(label, []).append((float(t1) - float(t0), int(med), int(shim)))
n, hz = int(sys.argv[2]), int(sys.argv[3])
gb = n / 1e9
stats = {}
print(f"| path | MB/s (runs) | mediator CPU s/GB | shim CPU s/GB |")
print("|---|---:|---:|---:|")
for label in ["direct", "proxy", "capture"]:
    rs = rows.get(label, [])
    mbs = [n / t / 1e6 for t, _, _ in rs]
    med = statistics.median(m / hz / gb for _, m, _ in rs)
    shim = statistics.median(s / hz / gb for _, _, s in rs)
    stats[label] = (statistics.median(mbs), med, shim)
    print(f"| {label} | {statistics.median(mbs):.0f} ({' / '.join(f'{x:.0f}' for x in mbs)}) | {med:.2f} | {shim:.2f} |")
cap, prox = stats["capture"], stats["proxy"]
r = cap[0] / prox[0]
print(f"\n- captured / proxy path: {r:.2f}x (goal >= 0.8x): {'met' if r >= 0.8 else 'missed'}")
c = cap[2] / prox[1] if prox[1] else float('nan')
print(f"- shim CPU per GB captured / mediator CPU per GB on the proxy path: {c:.2f}x (goal <= 2x): {'met' if c <= 2 else 'missed'}")
PY
