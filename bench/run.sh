#!/usr/bin/env bash
# Benchmark harness: the mediator beside direct, Squid and tinyproxy, all on
# loopback. Builds release binaries, installs Squid and tinyproxy from Debian if missing,
# starts an origin, the mediator (100 authorities; TCP listener with a credential and a
# Unix socket per authority), Squid and tinyproxy with minimal configs in a temp dir, then
# runs every mode at concurrency 1 and 32 against each path REPS times (interleaved), the
# idle-tunnel memory test and the criterion micro-benchmarks of the policy crate. Prints a
# Markdown table with ratios to direct and to the best peer of the same run and writes it
# to bench/results/latest.md (raw JSON lines beside it). Stops everything it started.
#
# Knobs (environment): REPS (2), DURATION (4 s measured per run), WARMUP (1 s),
# IDLE_TUNNELS (10000), IDLE_PEERS (1: also Squid and tinyproxy), CRITERION (1),
# THROUGHPUT_BYTES (268435456 per request), KEEP (1: keep the temp dir), SHIM_STARTUP
# (a saved output of bench/shim-startup.sh for the report's shim start-up goal; that is
# not measured here), TLS (1: then bench/tls-terminate.sh, TLS termination against Squid
# ssl-bump and mitmproxy, its report appended), CAPTURE (1: then bench/shim-capture.sh, a
# captured download against the proxy path), ANCHORS (1: then bench/anchors.sh, the
# mediator beside HAProxy, microsocks, Dante, tinyproxy, `unshare` and a bare tar, its
# report appended; 0 skips it). On a shared machine run it under `nice`: every program
# measured then yields alike, and the reports record the load average.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-2}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
IDLE_TUNNELS=${IDLE_TUNNELS:-10000}
IDLE_PEERS=${IDLE_PEERS:-1}
CRITERION=${CRITERION:-1}
THROUGHPUT_BYTES=${THROUGHPUT_BYTES:-268435456}
TLS=${TLS:-1}
CAPTURE=${CAPTURE:-1}
ANCHORS=${ANCHORS:-1}
started=$(date +%s)
log() { printf '[bench %4ds] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }

# Each idle tunnel costs the mediator two descriptors (and the origin and the load
# generator one each): raise the soft limit, and the hard one when we may.
want_fds=$(( IDLE_TUNNELS * 2 + 4096 ))
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$want_fds" ]; then
    ulimit -Hn "$want_fds" 2>/dev/null || true
fi
ulimit -Sn "$want_fds" 2>/dev/null || ulimit -Sn "$(ulimit -Hn)"
log "open files limit: $(ulimit -n)"

# --- peers from Debian --------------------------------------------------------------
need=()
command -v squid >/dev/null || need+=(squid)
command -v tinyproxy >/dev/null || need+=(tinyproxy)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y "${need[@]}" >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null; }
fi
# The packages' own services (where an init system started them) are not ours to use.

# --- build ---------------------------------------------------------------------------
log "building release binaries"
cargo build --release -p bench -p mediator >&2
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release

# --- temp dir and cleanup ------------------------------------------------------------
work=$(mktemp -d /tmp/mediator-bench.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    if [ "${KEEP:-0}" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port() { "$bin/loadgen" free-port; }
wait_port() { # wait until 127.0.0.1:$1 accepts, up to 10 s
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    log "nothing listening on 127.0.0.1:$1"; return 1
}

# --- origin ----------------------------------------------------------------------------
"$bin/origin" --listen 127.0.0.1:0 >"$work/origin.out" 2>"$work/origin.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$work/origin.out" && break; sleep 0.1; done
origin=$(awk '/^listening/ {print $2}' "$work/origin.out")
[ -n "$origin" ] || { log "origin did not start"; cat "$work/origin.err" >&2; exit 1; }
log "origin on $origin"

# --- mediator: 100 authorities ---------------------------------------------------------
# start_mediator NAME: a mediator with its own config, socket dir and decision log under
# $work/NAME, 100 authorities agent-0..agent-99 (token bench-token-I) allowed to reach
# 127.0.0.1; sets med_pid and med_port.
token_hashes=()
for i in $(seq 0 99); do
    token_hashes+=("$(printf %s "bench-token-$i" | sha256sum | cut -d' ' -f1)")
done
start_mediator() {
    local dir=$work/$1 i
    med_port=$(port)
    mkdir -p "$dir/sockets"
    {
        cat <<EOF
[listen]
socket_dir = "$dir/sockets"
tcp = "127.0.0.1:$med_port"

[resolver]
# Never consulted (every target is an IP literal); any lookup would stay on loopback.
nameservers = ["127.0.0.1:53"]

[upstream]
mode = "direct"

[timeouts]
idle_tunnel = 600
shutdown_grace = 1

[limits]
# The idle-tunnel test holds up to IDLE_TUNNELS tunnels of one authority: the derived
# per-authority cap (a quarter of what the descriptors allow) would stop it early, and
# the TCP listener stops accepting at seven eighths of max_connections.
max_connections = $(( IDLE_TUNNELS * 8 / 7 + 100 ))
authority_connections = $(( IDLE_TUNNELS + 100 ))

[log]
decisions = "$dir/decisions.log"
EOF
        for i in $(seq 0 99); do
            printf '\n[[authority]]\nname = "agent-%d"\nallow = ["127.0.0.1"]\nallow_private = ["127.0.0.0/8"]\ntoken_sha256 = "%s"\n' \
                "$i" "${token_hashes[$i]}"
        done
    } >"$dir/mediator.toml"
    "$bin/mediator" --config "$dir/mediator.toml" 2>"$dir/stderr" &
    med_pid=$!
    pids+=($med_pid)
    for _ in $(seq 100); do grep -q '^ready' "$dir/stderr" && break; sleep 0.1; done
    grep -q '^ready' "$dir/stderr" || { log "mediator did not start"; cat "$dir/stderr" >&2; exit 1; }
    log "mediator $1 (pid $med_pid): $(grep '^ready' "$dir/stderr")"
}
start_mediator mediator
mdir=$work/mediator

# --- squid -----------------------------------------------------------------------------
squid_port=$(port)
mkdir -p "$work/squid"
cat >"$work/squid/squid.conf" <<EOF
http_port 127.0.0.1:$squid_port
visible_hostname bench-squid
pid_filename none
cache deny all
cache_mem 8 MB
access_log none
cache_store_log none
cache_log $work/squid/cache.log
logfile_rotate 0
coredump_dir $work/squid
netdb_filename none
pinger_enable off
dns_nameservers 127.0.0.1
max_filedescriptors $want_fds
shutdown_lifetime 1 seconds
acl bench_clients src 127.0.0.0/8
acl bench_dst dst 127.0.0.0/8
http_access allow bench_clients bench_dst
http_access deny all
EOF
chown -R proxy: "$work/squid" 2>/dev/null || true
squid -N -f "$work/squid/squid.conf" >"$work/squid/stdout" 2>&1 &
squid_pid=$!
pids+=($squid_pid)
wait_port "$squid_port" || { cat "$work/squid/stdout" "$work/squid/cache.log" >&2 || true; exit 1; }
log "squid $(squid -v | head -1 | awk '{print $4}') on 127.0.0.1:$squid_port (pid $squid_pid)"

# --- tinyproxy ---------------------------------------------------------------------------
tp_port=$(port)
mkdir -p "$work/tinyproxy"
cat >"$work/tinyproxy/tinyproxy.conf" <<EOF
User nobody
Group nogroup
Port $tp_port
Listen 127.0.0.1
Timeout 600
LogFile "$work/tinyproxy/tinyproxy.log"
LogLevel Critical
MaxClients $(( IDLE_TUNNELS + 1000 ))
Allow 127.0.0.1
DisableViaHeader Yes
EOF
chmod 777 "$work/tinyproxy"
tinyproxy -d -c "$work/tinyproxy/tinyproxy.conf" >"$work/tinyproxy/stdout" 2>&1 &
tp_pid=$!
pids+=($tp_pid)
wait_port "$tp_port" || { cat "$work/tinyproxy/stdout" >&2; exit 1; }
log "tinyproxy $(tinyproxy -v | awk '{print $2}') on 127.0.0.1:$tp_port (pid $tp_pid)"

# --- memory at rest ------------------------------------------------------------------------
sleep 1
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
hwm() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }
printf '{"mediator":%s,"squid":%s,"tinyproxy":%s}\n' \
    "$(rss $med_pid)" "$(rss $squid_pid)" "$(rss $tp_pid)" >"$work/rest.json"

# --- load runs -------------------------------------------------------------------------------
targets=(direct squid tinyproxy mediator-tcp mediator-unix)
modes=(connect-rate socks-rate forward-rate tunnel-throughput)
runs=0
for _ in $(seq "$REPS"); do for m in "${modes[@]}"; do for c in 1 32; do for t in "${targets[@]}"; do
    case $t in squid | tinyproxy) [ "$m" = socks-rate ] && continue ;; esac
    runs=$((runs + 1))
done; done; done; done
log "$runs load runs of ${WARMUP}+${DURATION} s each"
results=$work/results.jsonl
n=0
for rep in $(seq "$REPS"); do
    for m in "${modes[@]}"; do
        for c in 1 32; do
            for t in "${targets[@]}"; do
                args=(--origin "$origin" --mode "$m" --concurrency "$c" --duration "$DURATION" --warmup "$WARMUP" --bytes "$THROUGHPUT_BYTES" --label "$t")
                case $t in
                    direct) args+=(--via direct) ;;
                    squid) [ "$m" = socks-rate ] && continue; args+=(--via "tcp:127.0.0.1:$squid_port" --proxy-pid "$squid_pid") ;;
                    tinyproxy) [ "$m" = socks-rate ] && continue; args+=(--via "tcp:127.0.0.1:$tp_port" --proxy-pid "$tp_pid") ;;
                    mediator-tcp) args+=(--via "tcp:127.0.0.1:$med_port" --user agent-0 --password bench-token-0 --proxy-pid "$med_pid") ;;
                    mediator-unix) args+=(--via "unix:$mdir/sockets/agent-0.sock" --proxy-pid "$med_pid") ;;
                esac
                n=$((n + 1))
                printf '[bench %4ds] [%d/%d] ' "$(( $(date +%s) - started ))" "$n" "$runs" >&2
                "$bin/loadgen" run "${args[@]}" | sed "s/^{/{\"rep\":$rep,/" >>"$results"
                # The decision log would otherwise grow by hundreds of MB; the mediator
                # appends (O_APPEND), so truncating is safe.
                : >"$mdir/decisions.log"
                sleep 0.3
            done
        done
    done
done
printf '{"mediator":%s,"squid":%s,"tinyproxy":%s}\n' \
    "$(hwm $med_pid)" "$(hwm $squid_pid)" "$(hwm $tp_pid)" >"$work/peak.json"

# --- idle tunnels ---------------------------------------------------------------------------
# Each mediator channel through a fresh mediator: after the load runs its heap holds freed
# memory that new tunnels would reuse, hiding their cost. A mediator tunnel holds two
# descriptors; the hard limit may be below what IDLE_TUNNELS needs when we may not raise it.
idle_count=$IDLE_TUNNELS
fd_room=$(( ($(ulimit -n) - 200) / 2 ))
if [ "$fd_room" -lt "$idle_count" ]; then
    log "open files limit $(ulimit -n) (hard $(ulimit -Hn)) allows $fd_room tunnels, not $IDLE_TUNNELS"
    idle_count=$fd_room
fi
idle=$work/idle.jsonl
: >"$idle"
idle_run() { # label via-args...
    local label=$1; shift
    log "idle tunnels: $idle_count through $label"
    "$bin/loadgen" idle-tunnels --origin "$origin" --count "$idle_count" --label "$label" "$@" >>"$idle" \
        || log "idle test through $label failed"
    sleep 1
}
kill "$med_pid" 2>/dev/null || true
start_mediator idle-tcp
idle_run mediator-tcp --via "tcp:127.0.0.1:$med_port" --user agent-0 --password bench-token-0 --proxy-pid "$med_pid"
kill "$med_pid" 2>/dev/null || true
start_mediator idle-unix
idle_run mediator-unix --via "unix:$work/idle-unix/sockets/agent-0.sock" --proxy-pid "$med_pid"
kill "$med_pid" 2>/dev/null || true
if [ "$IDLE_PEERS" = 1 ]; then
    idle_run squid --via "tcp:127.0.0.1:$squid_port" --proxy-pid "$squid_pid"
    idle_run tinyproxy --via "tcp:127.0.0.1:$tp_port" --proxy-pid "$tp_pid"
fi

# The peers are done: stop them before the micro-benchmarks.
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done

# --- criterion -------------------------------------------------------------------------------
if [ "$CRITERION" = 1 ]; then
    log "criterion micro-benchmarks (policy)"
    rm -rf "$ROOT/target/criterion/canonicalize_host" "$ROOT/target/criterion/grant_decide" "$ROOT/target/criterion/classify"
    cargo bench -p bench --bench policy -- --warm-up-time 0.5 --measurement-time 1.5 --noplot >"$work/criterion.txt" 2>&1 \
        || { log "criterion failed"; tail -20 "$work/criterion.txt" >&2; }
fi

# --- report ----------------------------------------------------------------------------------
mkdir -p "$ROOT/bench/results"
cp "$results" "$ROOT/bench/results/latest.jsonl"
cat "$idle" >>"$ROOT/bench/results/latest.jsonl"
shim_args=()
[ -n "${SHIM_STARTUP:-}" ] && shim_args=(--shim-startup "$SHIM_STARTUP")
python3 "$ROOT/bench/report.py" "${shim_args[@]}" \
    --results "$results" --idle "$idle" --rest "$work/rest.json" --peak "$work/peak.json" \
    --criterion "$ROOT/target/criterion" --elapsed "$(( $(date +%s) - started ))" \
    --settings "REPS=$REPS DURATION=${DURATION}s WARMUP=${WARMUP}s THROUGHPUT_BYTES=$THROUGHPUT_BYTES; idle tunnels $idle_count (asked $IDLE_TUNNELS, open files limit $(ulimit -n))" \
    | tee "$ROOT/bench/results/latest.md"
log "wrote bench/results/latest.md"

# --- capture ---------------------------------------------------------------------------------
# A download captured by the shim against the proxy path and direct (bench/shim-capture.sh).
if [ "$CAPTURE" = 1 ]; then
    log "capture at proxy speed (bench/shim-capture.sh)"
    cargo build --release -p shim >&2
    if SHIM="$bin/shim" MEDIATOR="$bin/mediator" ORIGIN="$bin/origin" RUNS=$REPS \
        bash "$ROOT/bench/shim-capture.sh" >"$work.capture.md"; then
        { echo; echo "## Capture (bench/shim-capture.sh)"; echo; cat "$work.capture.md"; } >>"$ROOT/bench/results/latest.md"
        cat "$work.capture.md"
    else
        log "bench/shim-capture.sh failed"
    fi
    rm -f "$work.capture.md"
fi

# --- TLS termination ---------------------------------------------------------------------------
# Against Squid ssl-bump and mitmproxy: its own script (its own origin and peers), its
# report appended.
if [ "$TLS" = 1 ]; then
    log "TLS termination (bench/tls-terminate.sh)"
    if REPS=$REPS DURATION=$DURATION WARMUP=$WARMUP bash "$ROOT/bench/tls-terminate.sh" >"$work.tls.md"; then
        { echo; cat "$work.tls.md"; } >>"$ROOT/bench/results/latest.md"
        cat "$work.tls.md"
    else
        log "bench/tls-terminate.sh failed"
    fi
    rm -f "$work.tls.md"
fi

# --- the limit anchors -------------------------------------------------------------------------
# HAProxy, microsocks, Dante, tinyproxy, `unshare`, a bare tar, each beside the mediator in
# one run: its own script (its own origins and peers), its report appended.
if [ "$ANCHORS" = 1 ]; then
    log "the limit anchors (bench/anchors.sh)"
    if REPS=$REPS DURATION=$DURATION WARMUP=$WARMUP THROUGHPUT_BYTES=$THROUGHPUT_BYTES \
        bash "$ROOT/bench/anchors.sh" >"$work.anchors.md"; then
        { echo; cat "$work.anchors.md"; } >>"$ROOT/bench/results/latest.md"
        cat "$work.anchors.md"
    else
        log "bench/anchors.sh failed"
    fi
    rm -f "$work.anchors.md"
fi
