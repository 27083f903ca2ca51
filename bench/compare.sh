#!/usr/bin/env bash
# Two builds of the mediator side by side: the CONNECT and absolute-form forwarding rates
# (the load generator's connect-rate and forward-rate, concurrency 1 and 32) through the
# mediator built from BASE (default: the merge base with main) and through the one of the
# working tree, interleaved in one run so that a busy machine slows both alike. Prints
# one row per mode and concurrency with each side's median and the ratio new/old.
#
#   bench/compare.sh [BASE]        knobs: REPS (3), DURATION (4 s), WARMUP (1 s)
#
# On loopback only: an origin of bench/, each mediator with one authority on its TCP
# listener (a credential) allowing 127.0.0.1. Stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=${1:-$(git merge-base HEAD main)}
REPS=${REPS:-3}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release
work=$(mktemp -d /tmp/mediator-compare.XXXXXX)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { printf '[compare] %s\n' "$*" >&2; }

# --- the two builds: BASE from an exported tree, in a target directory of its own (kept
# between runs): sharing the working tree's would let cargo take one tree's workspace
# crates for the other's, their paths being the same relative to each root ---
log "building $BASE"
mkdir -p "$work/base"
git archive "$BASE" | tar -x -C "$work/base"
base_target=${CARGO_TARGET_DIR:-$ROOT/target}/compare-base
(cd "$work/base" && CARGO_TARGET_DIR=$base_target cargo build --release -p mediator >&2)
cp "$base_target/release/mediator" "$work/mediator-old"
log "building the working tree"
cargo build --release -p mediator -p bench >&2
cp "$bin/mediator" "$work/mediator-new"

"$bin/origin" --listen 127.0.0.1:0 >"$work/origin.out" 2>"$work/origin.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$work/origin.out" && break; sleep 0.1; done
origin=$(awk '/^listening/ {print $2}' "$work/origin.out")
[ -n "$origin" ] || { log "origin did not start"; exit 1; }

hash=$(printf %s bench-token | sha256sum | cut -d' ' -f1)
declare -A port
for side in old new; do
    port[$side]=$("$bin/loadgen" free-port)
    cat >"$work/$side.toml" <<EOF
[listen]
tcp = "127.0.0.1:${port[$side]}"
[resolver]
nameservers = ["127.0.0.1:53"]
[timeouts]
idle_tunnel = 600
shutdown_grace = 1
[log]
decisions = "$work/$side.log"
[registry]
state_dir = "$work/$side.state"
[[authority]]
name = "agent-0"
allow = ["127.0.0.1"]
allow_private = ["127.0.0.0/8"]
token_sha256 = "$hash"
EOF
    "$work/mediator-$side" --config "$work/$side.toml" 2>"$work/$side.err" &
    pids+=($!)
    eval "pid_$side=$!"
    for _ in $(seq 100); do grep -q '^ready' "$work/$side.err" && break; sleep 0.1; done
    grep -q '^ready' "$work/$side.err" || { log "mediator $side did not start"; cat "$work/$side.err" >&2; exit 1; }
done

results=$work/results.jsonl
for rep in $(seq "$REPS"); do
    for mode in connect-rate forward-rate; do
        for c in 1 32; do
            for side in old new; do
                pid_var=pid_$side
                "$bin/loadgen" run --origin "$origin" --mode "$mode" --concurrency "$c" \
                    --duration "$DURATION" --warmup "$WARMUP" --label "$side" \
                    --via "tcp:127.0.0.1:${port[$side]}" --user agent-0 --password bench-token \
                    --proxy-pid "${!pid_var}" | sed "s/^{/{\"rep\":$rep,/" >>"$results"
                : >"$work/$side.log"
            done
        done
    done
done

python3 - "$results" "$BASE" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def rate(r):
    for k in ("rate", "per_sec", "requests_per_sec", "ops_per_sec"):
        if k in r:
            return float(r[k])
    return float(r.get("count", 0)) / float(r.get("duration", 1))
print(f"old = {sys.argv[2][:12]}, new = the working tree; median of {max(r['rep'] for r in rows)} runs each")
print("| mode | concurrency | old /s | new /s | new/old |")
print("|---|---:|---:|---:|---:|")
keys = sorted({(r["mode"], r["concurrency"]) for r in rows})
for mode, c in keys:
    med = {s: statistics.median(rate(r) for r in rows if (r["mode"], r["concurrency"], r["label"]) == (mode, c, s)) for s in ("old", "new")}
    print(f"| {mode} | {c} | {med['old']:.0f} | {med['new']:.0f} | {med['new'] / med['old']:.3f} |")
EOF
