#!/usr/bin/env bash
# The mediator against the limit anchors, the best C programs at the same work, each
# beside the mediator in the same run, all on loopback (issue "Performance against the
# limit anchors"):
#   throughput  one tunnel, GET /bytes/N repeated: HAProxy as a TCP relay (mode tcp,
#               option splice-auto) to the bench origin, against the mediator's CONNECT
#               tunnel over TCP (with a credential) and over its Unix socket. MiB/s, CPU
#               s/GiB.
#   tls         TLS termination at c=8, keep-alive requests/s and new connections/s (a
#               full handshake each): HAProxy in HTTP mode (TLS on its bind, verified TLS
#               to the origin, http-reuse always) against the mediator's tls_terminate
#               (CONNECT, then TLS inside), both to the same nginx HTTPS origin. CPU per
#               1,000 requests, and the TCP connections nginx accepted per 1,000 requests
#               (stub_status), that is how often the proxy opened an upstream connection.
#   socks       SOCKS5 tunnels/s (greeting, request, GET /small, close) at c=1 and c=32:
#               microsocks and Dante against the mediator over its Unix socket, and
#               microsocks with RFC 1929 username/password against the mediator over TCP
#               with the same.
#   connect     CONNECT tunnels/s at c=32 against tinyproxy (a goal kept from before).
#   start       the shim's start, `shim --allow-write EMPTY -- true` (embedded mode) with
#               capture (the default) and with --no-capture, against
#               `unshare -Urnmpf true` (hyperfine).
#   unpack      5,000 files (50 directories of 100 files of 1 KiB) unpacked by tar into a
#               write root: bare, inside the shim, inside the shim with --violations; on
#               disk and on a tmpfs; warm (the disk settled with `sync` before each run)
#               and cold (the page cache dropped before each run as well).
# Prints one Markdown table with the anchors' and the mediator's figures and their ratios,
# then the goals, each met or missed; writes bench/results/anchors.{md,jsonl}.
#
# Knobs (environment): REPS (2: load runs interleaved per repetition; figures are the
# medians), DURATION (4 s measured per load run), WARMUP (1 s), THROUGHPUT_BYTES
# (268435456 per request), START_RUNS (40 hyperfine runs per start command), UNPACK_RUNS
# (10 per unpacking command), UNPACK_DIRS (50) and UNPACK_FILES (100 per directory),
# PARTS ("throughput tls socks connect start unpack": which to run), TMPFS (a tmpfs
# directory for the unpacking; by default one is mounted in the temp dir), COLD (1:
# also the cold-cache unpacking, which drops the page cache of the whole machine), KEEP
# (1: keep the temp dir), BUILD (1: build the release binaries first; 0: take
# target/release as it is), MEDIATOR (a mediator binary to measure instead of
# target/release/mediator: another commit's build, for a before and after). On a shared
# machine run it under `nice`: every program measured yields alike, and the report
# records the load average. Installs haproxy, nginx, microsocks, dante-server, tinyproxy,
# hyperfine and openssl from Debian when missing. Stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-2}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
THROUGHPUT_BYTES=${THROUGHPUT_BYTES:-268435456}
START_RUNS=${START_RUNS:-40}
UNPACK_RUNS=${UNPACK_RUNS:-10}
UNPACK_DIRS=${UNPACK_DIRS:-50}
UNPACK_FILES=${UNPACK_FILES:-100}
PARTS=${PARTS:-throughput tls socks connect start unpack}
COLD=${COLD:-1}
started=$(date +%s)
log() { printf '[anchors %4ds] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }
part() { [[ " $PARTS " == *" $1 "* ]]; }
ulimit -Sn "$(ulimit -Hn)"

# --- tools from Debian ----------------------------------------------------------------
need=()
command -v haproxy >/dev/null || need+=(haproxy)
command -v nginx >/dev/null || need+=(nginx)
command -v microsocks >/dev/null || need+=(microsocks)
command -v danted >/dev/null || need+=(dante-server)
command -v tinyproxy >/dev/null || need+=(tinyproxy)
command -v hyperfine >/dev/null || need+=(hyperfine)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y "${need[@]}" >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null; }
fi
# The packages' own services (where an init system started them) are not ours to use:
# every anchor below runs from a config of its own in the temp dir, on loopback.

if [ "${BUILD:-1}" = 1 ]; then
    log "building release binaries"
    cargo build --release -p bench -p mediator -p shim >&2
fi
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release

# --- temp dir and cleanup ---------------------------------------------------------------
work=$(mktemp -d /tmp/mediator-anchors.XXXXXX)
chmod 755 "$work"
pids=()
tmpfs_mounted=
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    [ -n "$tmpfs_mounted" ] && umount "$tmpfs_mounted" 2>/dev/null
    if [ "${KEEP:-0}" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

HOST=localhost
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
results=$work/results.jsonl
: >"$results"
versions=$work/versions.txt
: >"$versions"
# The load averages (1, 5, 15 min) at the start and the end, for the report's header.
loads=$work/loads.txt
printf 'start %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >"$loads"
version() { printf '%s=%s\n' "$1" "$2" >>"$versions"; }

pki=$work/pki
bench_pki "$pki"

# --- origins: the bench origin (plain HTTP) and nginx over HTTPS ----------------------------
"$bin/origin" --listen 127.0.0.1:0 >"$work/origin.out" 2>"$work/origin.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$work/origin.out" && break; sleep 0.1; done
origin=$(awk '/^listening/ {print $2}' "$work/origin.out")
[ -n "$origin" ] || { log "origin did not start"; cat "$work/origin.err" >&2; exit 1; }
log "bench origin on $origin"
bench_nginx "$work/nginx" "$pki"
version nginx "$(nginx -v 2>&1 | sed 's/.*\///')"
log "nginx on $HOST:$nginx_port (status on $status_port)"

# --- the mediator ---------------------------------------------------------------------------
# One mediator for every part, with 100 plain authorities (bench/run.sh's) and one whose
# tunnels to $HOST are terminated (bench/tls-terminate.sh's).
mdir=$work/mediator
mediator_config "$mdir" "$pki" 100
start_mediator "$mdir"
log "mediator (pid $med_pid): $(grep '^ready' "$mdir/stderr")"
version mediator "${MEDIATOR:-$(git -C "$ROOT" rev-parse --short HEAD)}"

# --- HAProxy: a TCP relay with splice, and TLS termination in HTTP mode --------------------
haproxy_config "$work/haproxy.cfg" "$pki" "$origin"
start_haproxy "$work/haproxy.cfg"
wait_port "$relay_port"
version haproxy "$(haproxy -v | awk 'NR == 1 {print $3}')"
log "haproxy (pid $hap_pid): relay on $relay_port, TLS on $hap_tls_port"

# --- SOCKS5: microsocks and Dante ----------------------------------------------------------
if part socks; then
    ms_port=$(port)
    # No `-b`: a bound outgoing socket needs a port no socket holds, TIME_WAIT ones
    # included, and the loopback's run out at these rates (Dante's `external` binds too:
    # its errors at c=32, when there are any, are that).
    microsocks -i 127.0.0.1 -p "$ms_port" >"$work/microsocks.out" 2>&1 &
    ms_pid=$!
    pids+=($ms_pid)
    wait_port "$ms_port" || { cat "$work/microsocks.out" >&2; exit 1; }
    version microsocks "$(dpkg-query -W -f '${Version}' microsocks 2>/dev/null | sed 's/-.*//')"
    log "microsocks on 127.0.0.1:$ms_port (pid $ms_pid)"
    # The same with RFC 1929 username/password, the anchor for the mediator's TCP
    # listener, which authenticates every tunnel the same way.
    msa_port=$(port)
    microsocks -i 127.0.0.1 -p "$msa_port" -u agent-0 -P bench-token-0 >"$work/microsocks-auth.out" 2>&1 &
    msa_pid=$!
    pids+=($msa_pid)
    wait_port "$msa_port" || { cat "$work/microsocks-auth.out" >&2; exit 1; }
    log "microsocks with username/password on 127.0.0.1:$msa_port (pid $msa_pid)"

    dante_port=$(port)
    mkdir -p "$work/dante"
    cat >"$work/dante/danted.conf" <<EOF
logoutput: $work/dante/danted.log
internal: 127.0.0.1 port = $dante_port
external: 127.0.0.1
clientmethod: none
socksmethod: none
user.privileged: root
user.unprivileged: nobody
timeout.negotiate: 30
timeout.io: 600
client pass {
    from: 127.0.0.0/8 to: 0.0.0.0/0
    log: error
}
socks pass {
    from: 127.0.0.0/8 to: 127.0.0.0/8
    command: connect
    log: error
}
socks block {
    from: 0.0.0.0/0 to: 0.0.0.0/0
    log: error
}
EOF
    danted -f "$work/dante/danted.conf" -p "$work/dante/danted.pid" >"$work/dante/stdout" 2>&1 &
    dante_pid=$!
    pids+=($dante_pid)
    wait_port "$dante_port" || { cat "$work/dante/stdout" "$work/dante/danted.log" >&2; exit 1; }
    version dante "$(danted -v 2>&1 | awk 'NR == 1 {sub(/^v/, "", $2); sub(/\.$/, "", $2); print $2}')"
    log "dante on 127.0.0.1:$dante_port (pid $dante_pid)"
fi

# --- tinyproxy -------------------------------------------------------------------------------
if part connect; then
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
MaxClients 1000
Allow 127.0.0.1
DisableViaHeader Yes
EOF
    chmod 777 "$work/tinyproxy"
    tinyproxy -d -c "$work/tinyproxy/tinyproxy.conf" >"$work/tinyproxy/stdout" 2>&1 &
    tp_pid=$!
    pids+=($tp_pid)
    wait_port "$tp_port" || { cat "$work/tinyproxy/stdout" >&2; exit 1; }
    version tinyproxy "$(tinyproxy -v | awk '{print $2}')"
    log "tinyproxy on 127.0.0.1:$tp_port (pid $tp_pid)"
fi

# --- load runs -----------------------------------------------------------------------------
# Each line of results.jsonl: the load generator's JSON with the part and the repetition
# (and, for TLS, what nginx counted over the whole run, warm-up included).
# Each run also carries the 1-minute load average as it starts: the machine is shared.
tag() { sed "s/^{/{\"part\":\"$1\",\"rep\":$2,\"load1\":$(cut -d' ' -f1 /proc/loadavg),/"; }
clear_log() { : >"$mdir/decisions.log"; sleep 0.3; }
loadrun() { # loadrun PART REP LABEL loadgen-args... (the bench origin unless they name one)
    local p=$1 r=$2 l=$3 to=(--origin "$origin")
    shift 3
    [[ " $* " == *" --origin "* ]] && to=()
    "$bin/loadgen" run "${to[@]}" --duration "$DURATION" --warmup "$WARMUP" \
        --label "$l" "$@" | tag "$p" "$r" >>"$results" \
        || log "$p $l failed"
    clear_log
}
tlsrun() { # tlsrun REP LABEL MODE tlsload-args...
    local r=$1 l=$2 m=$3 a b
    shift 3
    a=$(origin_counts)
    "$bin/tlsload" --host "$HOST" --mode "$m" --concurrency 8 --duration "$DURATION" \
        --warmup "$WARMUP" --label "$l" "$@" >"$work/tls.json" || log "tls $l $m failed"
    b=$(origin_counts)
    # Each stub_status read is itself one accepted connection and one request.
    read -r a_acc a_req <<<"$a"
    read -r b_acc b_req <<<"$b"
    tag tls "$r" <"$work/tls.json" \
        | sed "s/^{/{\"origin_accepts\":$(( b_acc - a_acc - 1 )),\"origin_requests\":$(( b_req - a_req - 1 )),/" >>"$results"
    clear_log
}
med_tcp=(--via "tcp:127.0.0.1:$med_port" --user agent-0 --password bench-token-0 --proxy-pid "$med_pid")
med_unix=(--via "unix:$mdir/sockets/agent-0.sock" --proxy-pid "$med_pid")
for rep in $(seq "$REPS"); do
    log "repetition $rep of $REPS"
    # SOCKS5 first: Dante binds its outgoing sockets (see above), before the other parts
    # leave the loopback's ports in TIME_WAIT.
    if part socks; then
        for c in 1 32; do
            s=(--mode socks-rate --concurrency "$c")
            loadrun socks "$rep" microsocks "${s[@]}" --via "tcp:127.0.0.1:$ms_port" --proxy-pid "$ms_pid"
            loadrun socks "$rep" microsocks-auth "${s[@]}" --via "tcp:127.0.0.1:$msa_port" \
                --user agent-0 --password bench-token-0 --proxy-pid "$msa_pid"
            loadrun socks "$rep" dante "${s[@]}" --via "tcp:127.0.0.1:$dante_port" --proxy-pid "$dante_pid"
            loadrun socks "$rep" mediator-unix "${s[@]}" "${med_unix[@]}"
            loadrun socks "$rep" mediator-tcp "${s[@]}" "${med_tcp[@]}"
        done
    fi
    if part throughput; then
        tp=(--mode tunnel-throughput --concurrency 1 --bytes "$THROUGHPUT_BYTES")
        loadrun throughput "$rep" haproxy "${tp[@]}" --via direct --origin "127.0.0.1:$relay_port" --proxy-pid "$hap_pid"
        loadrun throughput "$rep" mediator-tcp "${tp[@]}" "${med_tcp[@]}"
        loadrun throughput "$rep" mediator-unix "${tp[@]}" "${med_unix[@]}"
    fi
    if part tls; then
        for m in keepalive new; do
            tlsrun "$rep" haproxy "$m" --via direct --origin "127.0.0.1:$hap_tls_port" \
                --ca "$pki/proxy-ca.pem" --proxy-pid "$hap_pid"
            tlsrun "$rep" mediator "$m" --via "tcp:127.0.0.1:$med_port" --origin "127.0.0.1:$nginx_port" \
                --user tls-bench --password tls-token --ca "$pki/proxy-ca.pem" --proxy-pid "$med_pid"
        done
    fi
    if part connect; then
        cr=(--mode connect-rate --concurrency 32)
        loadrun connect "$rep" tinyproxy "${cr[@]}" --via "tcp:127.0.0.1:$tp_port" --proxy-pid "$tp_pid"
        loadrun connect "$rep" mediator-tcp "${cr[@]}" "${med_tcp[@]}"
        loadrun connect "$rep" mediator-unix "${cr[@]}" "${med_unix[@]}"
    fi
done

# The proxies are done: stop them before the shim's runs.
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done

# --- the shim's start ------------------------------------------------------------------------
shim=$bin/shim
if part start; then
    log "shim start: hyperfine, $START_RUNS runs each"
    mkdir -p "$work/start/empty"
    sync
    embedded="--allow example.com --allow-write $work/start/empty"
    hyperfine -N --warmup 5 --runs "$START_RUNS" --export-json "$work/start.json" \
        -n "unshare" "unshare -Urnmpf true" \
        -n "shim" "$shim $embedded -- true" \
        -n "shim --no-capture" "$shim --no-capture $embedded -- true" >&2
fi

# --- the unpacking ---------------------------------------------------------------------------
# unpack FS DIR: the three commands, warm and (COLD=1) cold, with DIR on the file system FS.
unpack() {
    local fs=$1 dir=$2 cache prep flags
    mkdir -p "$dir/src" "$dir/out"
    # Readable by all: root's command runs under an unprivileged uid (docs/shim.md).
    chmod 755 "$dir"
    for d in $(seq "$UNPACK_DIRS"); do
        mkdir -p "$dir/src/d$d"
        for f in $(seq "$UNPACK_FILES"); do head -c 1024 /dev/zero >"$dir/src/d$d/f$f"; done
    done
    tar -C "$dir/src" -cf "$dir/files.tar" .
    rm -rf "$dir/src"
    # The archive is named: the shim gives the command a private /tmp, where $dir may be.
    flags="--no-capture --allow example.com --allow-write $dir/out --allow-read $dir/files.tar"
    for cache in warm cold; do
        prep="rm -rf $dir/out && mkdir $dir/out && sync"
        if [ "$cache" = cold ]; then
            [ "$COLD" = 1 ] || continue
            prep="$prep && echo 3 >/proc/sys/vm/drop_caches"
        fi
        log "unpacking on $fs, $cache: $UNPACK_RUNS runs each"
        hyperfine -N --warmup 2 --runs "$UNPACK_RUNS" --prepare "sh -c '$prep'" \
            --export-json "$work/unpack-$fs-$cache.json" \
            -n "tar" "tar -xf $dir/files.tar -C $dir/out" \
            -n "shim tar" "$shim $flags -- tar -xf $dir/files.tar -C $dir/out" \
            -n "shim tar --violations" "$shim $flags --violations $dir/v.jsonl -- tar -xf $dir/files.tar -C $dir/out" >&2 \
            || log "unpacking on $fs, $cache failed"
    done
    rm -rf "$dir"
}
if part unpack; then
    if [ "$COLD" = 1 ] && ! [ -w /proc/sys/vm/drop_caches ]; then
        log "cannot drop the page cache (not root?): no cold runs"
        COLD=0
    fi
    unpack disk "$work/disk"
    tmp=${TMPFS:-}
    if [ -z "$tmp" ]; then
        tmp=$work/tmpfs
        mkdir -p "$tmp"
        if mount -t tmpfs -o size=512m,mode=755 anchors-tmpfs "$tmp"; then
            tmpfs_mounted=$tmp
        else
            log "cannot mount a tmpfs: no tmpfs rows (set TMPFS to one)"
            tmp=
        fi
    fi
    [ -n "$tmp" ] && unpack tmpfs "$(mktemp -d "$tmp/unpack.XXXXXX")"
fi

# --- report ----------------------------------------------------------------------------------
printf 'end %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$loads"
mkdir -p "$ROOT/bench/results"
cp "$results" "$ROOT/bench/results/anchors.jsonl"
python3 "$ROOT/bench/anchors-report.py" --results "$results" --work "$work" --versions "$versions" --loads "$loads" --files $(( UNPACK_DIRS * UNPACK_FILES )) \
    --settings "REPS=$REPS DURATION=${DURATION}s WARMUP=${WARMUP}s THROUGHPUT_BYTES=$THROUGHPUT_BYTES START_RUNS=$START_RUNS UNPACK_RUNS=$UNPACK_RUNS files=$(( UNPACK_DIRS * UNPACK_FILES )) COLD=$COLD; $(( $(date +%s) - started )) s" \
    | tee "$ROOT/bench/results/anchors.md"
log "wrote bench/results/anchors.md"
