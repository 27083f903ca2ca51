#!/usr/bin/env bash
# Fairness benchmark: the latency a well-behaved authority sees while another tenant, or an
# unauthenticated local process, abuses the shared mediator (design section 13). All on
# loopback. The mediator runs with NO [limits] keys under the soft open-files limit a
# systemd service gets (prlimit --nofile=1024:<hard>), with three authorities: `victim`
# (TCP listener, with a token), `abuser` (its Unix socket and the TCP listener) and
# `quiet` (its Unix socket). For each scenario the abuse starts, settles, and the victim's
# CONNECT tunnels are measured at concurrency 1 (bench/src/bin/loadgen/main.rs connect-rate:
# one new tunnel per request); `quiet` is measured the same way over its Unix socket.
#
# Scenarios: baseline; hold (the abuser holds as many tunnels as it is granted, on its
# socket and over TCP); flood (12,000 silent TCP connections kept up); storm (the abuser
# opens and closes tunnels as fast as it can over 32 connections); slow (2,000 clients
# sending one byte of a head per second); asks (the abuser, whose grant misses 127.0.0.2
# and who asks the host, storms CONNECTs there that nobody answers: max_pending_asks held,
# the rest refused ask_overloaded at once; design section 20).
#
# Prints a Markdown table (p50, p99, max, errors per scenario) and writes it with the raw
# JSON lines to bench/results/fairness.md. Knobs: DURATION (5 s measured), SETTLE (3 s).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DURATION=${DURATION:-5}
SETTLE=${SETTLE:-3}
started=$(date +%s)
log() { printf '[fairness %4ds] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }

ulimit -Sn "$(ulimit -Hn)"
hard=$(ulimit -Hn)
log "building release binaries"
cargo build --release -p bench -p mediator >&2
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release

work=$(mktemp -d /tmp/mediator-fairness.XXXXXX)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$bin/origin" --listen 127.0.0.1:0 >"$work/origin.out" 2>"$work/origin.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$work/origin.out" && break; sleep 0.1; done
origin=$(awk '/^listening/ {print $2}' "$work/origin.out")
log "origin on $origin"

port=$("$bin/loadgen" free-port)
hash() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
mkdir -p "$work/sockets"
cat >"$work/mediator.toml" <<EOF
[listen]
socket_dir = "$work/sockets"
tcp = "127.0.0.1:$port"

[resolver]
nameservers = ["127.0.0.1:53"]

[timeouts]
idle_tunnel = 600
shutdown_grace = 1

[log]
decisions = "$work/decisions.log"

[[authority]]
name = "victim"
allow = ["127.0.0.1"]
allow_private = ["127.0.0.0/8"]
token_sha256 = "$(hash victim-token)"

[[authority]]
name = "abuser"
allow = ["127.0.0.1"]
allow_private = ["127.0.0.0/8"]
token_sha256 = "$(hash abuser-token)"
ask = "admin"
# Short, so that the held ones end when the scenario does (abuse stops on SIGINT only
# once its held requests are answered).
ask_timeout_s = 5

[[authority]]
name = "quiet"
allow = ["127.0.0.1"]
allow_private = ["127.0.0.0/8"]
EOF
prlimit --nofile=1024:"$hard" -- "$bin/mediator" --config "$work/mediator.toml" 2>"$work/stderr" &
med_pid=$!
pids+=($med_pid)
for _ in $(seq 100); do grep -q '^ready' "$work/stderr" && break; sleep 0.1; done
ready=$(grep '^ready' "$work/stderr") || { cat "$work/stderr" >&2; exit 1; }
log "$ready"

measure() { # measure SCENARIO: the victim over TCP, quiet over its socket
    local s=$1
    "$bin/loadgen" run --mode connect-rate --concurrency 1 --duration "$DURATION" --warmup 1 \
        --via "tcp:127.0.0.1:$port" --user victim --password victim-token --origin "$origin" \
        --timeout 30 --label "$s victim/tcp" >>"$work/results.jsonl"
    "$bin/loadgen" run --mode connect-rate --concurrency 1 --duration "$DURATION" --warmup 1 \
        --via "unix:$work/sockets/quiet.sock" --origin "$origin" \
        --timeout 30 --label "$s quiet/unix" >>"$work/results.jsonl"
}
abuse() { # abuse KIND ARGS...: runs in the background for the scenario
    "$bin/abuse" --kind "$1" --origin "$origin" --duration 600 "${@:2}" >>"$work/abuse.jsonl" &
    abuse_pids+=($!)
    pids+=($!)
}
stop_abuse() {
    local p
    for p in "${abuse_pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${abuse_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    abuse_pids=()
    sleep 2
}
abuse_pids=()

log "baseline"
measure baseline

log "hold: the abuser holds as many tunnels as it is granted (socket and TCP)"
abuse hold-tunnels --via "unix:$work/sockets/abuser.sock" --count 5000 --parallel 64
abuse hold-tunnels --via "tcp:127.0.0.1:$port" --user abuser --password abuser-token --count 5000 --parallel 64
sleep "$SETTLE"; measure hold; stop_abuse

log "flood: 12,000 silent TCP connections kept up"
abuse silent-flood --via "tcp:127.0.0.1:$port" --count 12000 --parallel 128
sleep "$SETTLE"; measure flood; stop_abuse

log "storm: the abuser opens and closes tunnels as fast as it can"
abuse connect-storm --via "unix:$work/sockets/abuser.sock" --parallel 32
sleep "$SETTLE"; measure storm; stop_abuse

log "slow: 2,000 slow heads"
abuse slow-heads --via "tcp:127.0.0.1:$port" --count 2000 --parallel 64
sleep "$SETTLE"; measure slow; stop_abuse

log "asks: the abuser storms questions nobody answers (outside its grant)"
"$bin/abuse" --kind connect-storm --via "unix:$work/sockets/abuser.sock" \
    --origin "127.0.0.2:${origin##*:}" --parallel 32 --duration 600 >>"$work/abuse.jsonl" &
abuse_pids+=($!); pids+=($!)
sleep "$SETTLE"; measure asks; stop_abuse

mkdir -p bench/results
python3 - "$work/results.jsonl" "$ready" "$(git rev-parse --short HEAD)" <<'PY' | tee bench/results/fairness.md
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"Fairness run at commit {sys.argv[3]} (mediator: {sys.argv[2]})\n")
print("| scenario | client | tunnels/s | p50 ms | p99 ms | max ms | errors |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    scenario, client = r["label"].split(" ", 1)
    print(f"| {scenario} | {client} | {r['rate']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r.get('max_ms', 0):.2f} | {r['errors']} |")
PY
cp "$work/results.jsonl" bench/results/fairness.jsonl
cp "$work/abuse.jsonl" bench/results/fairness-abuse.jsonl 2>/dev/null || true
log "done"
