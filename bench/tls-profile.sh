#!/usr/bin/env bash
# Where a TLS-terminated keep-alive request's work goes, the mediator's and HAProxy's at
# the same work: TLS from the client, one HTTP/1.1 GET /small parsed, judged (the
# mediator) and forwarded over verified TLS to nginx, the answer back (as in
# bench/anchors.sh: the mediator through a CONNECT tunnel it terminates, HAProxy in HTTP
# mode with http-reuse always), CONCURRENCY keep-alive connections of target/release/tlsload.
#
#   TOOL=callgrind (the default): each under valgrind's callgrind for the whole run (the
#     counters are not zeroed after the warm-up: zeroing while threads run charges the
#     frames then on the stack with their callees' work; the start and the 2 x CONCURRENCY
#     handshakes are in the count, a few percent at these lengths); prints the user-space
#     instructions per request (requests counted by nginx) by component and by function
#     (bench/profile-summary.py), and the mediator's own functions by inclusive count.
#     Counts repeat to within a few percent whatever the machine's load; the kernel is not
#     counted.
#   TOOL=perf: `perf record` (cpu-clock samples, DWARF call graphs) of each at full speed;
#     prints the CPU per request, the samples by object (the kernel, the program, its
#     libraries) and the top symbols by their own samples, and, with inferno installed
#     (`cargo install inferno`), writes the folded stacks and a flame graph per program
#     to OUT (the perf data itself, hundreds of MB, is not kept).
#
# MODE=new profiles new connections instead (a full handshake each, one request on it:
# the figures per request are then per connection).
#
# Knobs: TOOL, MODE (keepalive or new), DURATION (measured seconds: callgrind 30, perf 6), WARMUP (callgrind 2,
# perf 1), CONCURRENCY (8), TOP (25), WHO ("mediator haproxy"), OUT
# (target/tls-profile: the raw profiles), BUILD (1: build first; 0: take target/release as
# it is), MEDIATOR (another mediator binary to profile). Installs valgrind, perf, haproxy
# and nginx from Debian when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOL=${TOOL:-callgrind}
case $TOOL in
    callgrind) DURATION=${DURATION:-30}; WARMUP=${WARMUP:-2} ;;
    perf) DURATION=${DURATION:-6}; WARMUP=${WARMUP:-1} ;;
    *) echo "TOOL is callgrind or perf" >&2; exit 2 ;;
esac
CONCURRENCY=${CONCURRENCY:-8}
MODE=${MODE:-keepalive}
case $MODE in
    keepalive) what="TLS-terminated keep-alive requests" ;;
    new) what="new TLS-terminated connections (a full handshake, one request each)" ;;
    *) echo "MODE is keepalive or new" >&2; exit 2 ;;
esac
TOP=${TOP:-25}
WHO=${WHO:-mediator haproxy}
OUT=${OUT:-$ROOT/target/tls-profile}
started=$(date +%s)
log() { printf '[tls-profile %4ds] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }

need=()
command -v haproxy >/dev/null || need+=(haproxy)
command -v nginx >/dev/null || need+=(nginx)
command -v openssl >/dev/null || need+=(openssl)
[ "$TOOL" = callgrind ] && ! command -v valgrind >/dev/null && need+=(valgrind)
[ "$TOOL" = perf ] && ! command -v perf >/dev/null && need+=(linux-perf)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y "${need[@]}" >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null; }
fi
if [ "${BUILD:-1}" = 1 ]; then
    log "building release binaries"
    cargo build --release -p bench -p mediator >&2
fi
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release

work=$(mktemp -d /tmp/tls-profile.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
HOST=localhost
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
mkdir -p "$OUT"

pki=$work/pki
bench_pki "$pki"
bench_nginx "$work/nginx" "$pki"
log "nginx on $HOST:$nginx_port"

# The subject runs under WRAP (callgrind) or plain (perf).
wrap=()
[ "$TOOL" = callgrind ] && wrap=(valgrind --tool=callgrind --callgrind-out-file="$work/cg.out")

# summary_callgrind LABEL REQUESTS: the profile's tables, to stdout.
summary_callgrind() {
    local label=$1 n=$2 ours=()
    cp "$work/cg.out.1" "$OUT/$label.callgrind"
    [ "$label" = mediator ] && ours=(--ours "mediator::")
    printf '\n### %s\n\n' "$label"
    python3 "$ROOT/bench/profile-summary.py" --file "$OUT/$label.callgrind" --requests "$n" \
        --top "$TOP" "${ours[@]}"
}

summary_perf() {
    local label=$1 n=$2 cpu=$3
    printf '\n### %s: %s requests, %s s CPU per 1,000 (perf cpu-clock)\n\n' "$label" "$n" "$cpu"
    printf '| share of samples | where |\n|---:|---|\n'
    perf report -i "$work/perf.data" --no-children --sort dso -g none --stdio 2>/dev/null \
        | awk '/^ +[0-9.]+%/ && k < 6 { printf "| %s | %s |\n", $1, $2; k++ }'
    printf '\n| share of samples | where | symbol |\n|---:|---|---|\n'
    perf report -i "$work/perf.data" --no-children --sort dso,sym -g none --stdio 2>/dev/null \
        | awk -v top="$TOP" '/^ +[0-9.]+%/ && k < top {
            pct = $1; dso = $2; $1 = ""; $2 = ""; $3 = ""; sub(/^ +/, ""); gsub(/\|/, "\\|");
            printf "| %s | %s | `%s` |\n", pct, dso, $0; k++ }'
    if command -v inferno-collapse-perf >/dev/null; then
        perf script -i "$work/perf.data" 2>/dev/null >"$work/perf.txt"
        inferno-collapse-perf <"$work/perf.txt" >"$OUT/$label.folded"
        inferno-flamegraph --minwidth 1 --title "$label: $what" \
            <"$OUT/$label.folded" >"$OUT/$label.svg"
        log "flame graph: $OUT/$label.svg"
    fi
}

profile() { # profile LABEL tlsload-args...
    local label=$1 a b tl
    shift
    log "$label: $TOOL, ${WARMUP}+${DURATION} s at c=$CONCURRENCY"
    "$bin/tlsload" --host "$HOST" --mode "$MODE" --concurrency "$CONCURRENCY" \
        --duration "$DURATION" --warmup "$WARMUP" --label "$label" "$@" >"$work/load.json" &
    tl=$!
    if [ "$TOOL" = callgrind ]; then
        # The whole run is counted (see the top): so are its requests.
        a=$(origin_counts)
        wait "$tl"
        b=$(origin_counts)
        callgrind_control -d "$subject" >/dev/null 2>&1
    else
        sleep "$WARMUP"
        a=$(origin_counts)
        perf record -e cpu-clock -F 1999 --call-graph dwarf,32768 -p "$subject" \
            -o "$work/perf.data" -- sleep "$DURATION" 2>/dev/null >&2
        b=$(origin_counts)
        wait "$tl"
    fi
    read -r _ a_req <<<"$a"
    read -r _ b_req <<<"$b"
    local n=$(( b_req - a_req - 1 ))
    if [ "$TOOL" = callgrind ]; then
        summary_callgrind "$label" "$n"
    else
        summary_perf "$label" "$n" \
            "$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["proxy_cpu_s_per_1000"], 4))' "$work/load.json")"
    fi
    kill "$subject" 2>/dev/null || true
    wait "$subject" 2>/dev/null || true
}

printf '## %s, c=%s (bench/tls-profile.sh, TOOL=%s)\n' "${what^}" "$CONCURRENCY" "$TOOL"
printf '\n%s, commit %s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(git rev-parse --short HEAD)"
for who in $WHO; do
    case $who in
        mediator)
            mediator_config "$work/mediator" "$pki" 1
            start_mediator "$work/mediator" "${wrap[@]}"
            subject=$med_pid
            profile mediator --via "tcp:127.0.0.1:$med_port" --origin "127.0.0.1:$nginx_port" \
                --user tls-bench --password tls-token --ca "$pki/proxy-ca.pem" --proxy-pid "$med_pid"
            ;;
        haproxy)
            haproxy_config "$work/haproxy.cfg" "$pki"
            start_haproxy "$work/haproxy.cfg" "${wrap[@]}"
            subject=$hap_pid
            profile haproxy --via direct --origin "127.0.0.1:$hap_tls_port" \
                --ca "$pki/proxy-ca.pem" --proxy-pid "$hap_pid"
            ;;
    esac
done
