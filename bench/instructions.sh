#!/usr/bin/env bash
# Repeatable cost figure: user-space instructions the mediator executes per
# request, counted by valgrind's callgrind. Wall-clock rates on a shared 2-core machine
# vary by 20-30% run to run; instruction counts repeat to within a few percent, so they
# show what a code change did. Kernel time (syscalls, the loopback TCP stack) is not
# counted: see bench/run.sh for CPU seconds.
#
# Usage: bash bench/instructions.sh [MEDIATOR_BINARY]   (default: target/release/mediator)
# Knobs: REQUESTS (2000; forward-rate does twice as many), MODES ("connect-rate
# socks-rate forward-rate"), VIAS ("unix tcp"). Everything stays on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REQUESTS=${REQUESTS:-2000}
MODES=${MODES:-connect-rate socks-rate forward-rate}
VIAS=${VIAS:-unix tcp}
if ! command -v valgrind >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y valgrind >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y valgrind >/dev/null; }
fi
if [ $# -ge 1 ]; then
    med=$1
    cargo build --release -p bench >&2
else
    cargo build --release -p bench -p mediator >&2
    med=${CARGO_TARGET_DIR:-$ROOT/target}/release/mediator
fi
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release

work=$(mktemp -d /tmp/mediator-instructions.XXXXXX)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$bin/origin" --listen 127.0.0.1:0 >"$work/origin.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$work/origin.out" && break; sleep 0.1; done
origin=$(awk '/^listening/ {print $2}' "$work/origin.out")
[ -n "$origin" ] || { echo "origin did not start" >&2; exit 1; }

printf '| mode | channel | requests | instructions per request |\n|---|---|---:|---:|\n'
for mode in $MODES; do
    n=$REQUESTS
    [ "$mode" = forward-rate ] && n=$(( REQUESTS * 2 ))
    for via in $VIAS; do
        run=$work/$mode-$via
        mkdir -p "$run/sockets"
        port=$("$bin/loadgen" free-port)
        hash=$(printf %s bench-token-0 | sha256sum | cut -d' ' -f1)
        cat >"$run/mediator.toml" <<EOT
[listen]
socket_dir = "$run/sockets"
tcp = "127.0.0.1:$port"
[resolver]
# Never consulted: every target is an IP literal.
nameservers = ["127.0.0.1:53"]
[upstream]
mode = "direct"
[log]
decisions = "$run/decisions.log"
[[authority]]
name = "agent-0"
allow = ["127.0.0.1"]
allow_private = ["127.0.0.0/8"]
token_sha256 = "$hash"
EOT
        valgrind --tool=callgrind --callgrind-out-file="$run/cg.out" \
            "$med" --config "$run/mediator.toml" 2>"$run/stderr" &
        mpid=$!
        pids+=($mpid)
        for _ in $(seq 600); do grep -q '^ready' "$run/stderr" && break; sleep 0.1; done
        grep -q '^ready' "$run/stderr" || { cat "$run/stderr" >&2; exit 1; }
        case $via in
            tcp) args=(--via "tcp:127.0.0.1:$port" --user agent-0 --password bench-token-0) ;;
            unix) args=(--via "unix:$run/sockets/agent-0.sock") ;;
        esac
        # Warm up (first connections fill caches and pools), zero the counters, measure.
        "$bin/loadgen" run --origin "$origin" --mode "$mode" --concurrency 4 --duration 120 \
            --warmup 0 --max-requests 200 --timeout 30 "${args[@]}" >/dev/null
        callgrind_control -z "$mpid" >/dev/null 2>&1
        "$bin/loadgen" run --origin "$origin" --mode "$mode" --concurrency 4 --duration 120 \
            --warmup 0 --max-requests "$n" --timeout 30 "${args[@]}" >"$run/load.json"
        callgrind_control -d "$mpid" >/dev/null 2>&1
        kill "$mpid"; wait "$mpid" 2>/dev/null || true
        done_n=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"])' "$run/load.json" 2>/dev/null || echo "$n")
        ir=$(callgrind_annotate "$run/cg.out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
        printf '| %s | %s | %s | %s |\n' "$mode" "$via" "$done_n" "$(( ir / done_n ))"
    done
done
