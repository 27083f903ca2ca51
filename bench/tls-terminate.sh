#!/usr/bin/env bash
# TLS termination against the tools users would otherwise pick for the same job, in one
# run (design 9; issue "capture at proxy speed, TLS termination well ahead of Squid"):
# the mediator (tls_terminate), Squid ssl-bump (Debian's squid-openssl), mitmproxy
# (mitmdump, from PyPI in a venv) and direct to the origin. Every proxy signs its leaves
# with one ECDSA P-256 CA made here; the origin is nginx over HTTPS (ECDSA P-256 leaf of
# another CA, which every proxy is told to trust). The load generator is
# target/release/tlsload (rustls, HTTP/1.1, no session resumption: a full handshake per new
# connection). Modes: `new` (one GET per new TLS connection) and `keepalive` (one TLS
# connection per worker), at concurrency 1 and 8. Prints a Markdown table (req/s, p50 and
# p99 latency, proxy CPU s per 1,000 requests, proxy RSS, the load generator's own CPU)
# and the goals with their ratios; writes bench/results/tls-terminate.{md,jsonl}.
#
# Knobs: REPS (3), DURATION (4 s), WARMUP (1 s), VENV (where mitmproxy is installed;
# default target/bench-venv), PEERS (1: Squid and mitmproxy too).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-3}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
PEERS=${PEERS:-1}
VENV=${VENV:-$ROOT/target/bench-venv}
started=$(date +%s)
log() { printf '[tls-bench %4ds] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }
ulimit -Sn "$(ulimit -Hn)"

# --- tools ------------------------------------------------------------------------------
need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v openssl >/dev/null || need+=(openssl)
if [ "$PEERS" = 1 ] && [ ! -x /usr/lib/squid/security_file_certgen ]; then need+=(squid-openssl); fi
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y "${need[@]}" >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null; }
fi
if [ "$PEERS" = 1 ] && [ ! -x "$VENV/bin/mitmdump" ]; then
    log "installing mitmproxy into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q 'mitmproxy>=11,<12' >&2
fi
log "building release binaries"
cargo build --release -p bench -p mediator >&2
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release

work=$(mktemp -d /tmp/tls-bench.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    [ "${KEEP:-0}" = 1 ] && log "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
port() { "$bin/loadgen" free-port; }
wait_port() {
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
    log "nothing listening on 127.0.0.1:$1"; return 1
}

# --- certificates: the origin's CA and leaf, and the one CA every proxy signs with ------
HOST=localhost
ec() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }
mkdir -p "$work/pki"
cd "$work/pki"
ec origin-ca.key
openssl req -x509 -new -key origin-ca.key -sha256 -days 2 -subj "/CN=bench origin CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -out origin-ca.pem 2>/dev/null
ec origin.key
openssl req -new -key origin.key -subj "/CN=$HOST" -out origin.csr 2>/dev/null
printf 'subjectAltName=DNS:%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$HOST" >origin.ext
openssl x509 -req -in origin.csr -CA origin-ca.pem -CAkey origin-ca.key -CAcreateserial \
    -days 2 -sha256 -extfile origin.ext -out origin.pem 2>/dev/null
ec proxy-ca.key
openssl req -x509 -new -key proxy-ca.key -sha256 -days 2 -subj "/CN=bench proxy CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -out proxy-ca.pem 2>/dev/null
openssl pkcs8 -topk8 -nocrypt -in proxy-ca.key -out proxy-ca.pk8 2>/dev/null
cd "$ROOT"
pki=$work/pki

# --- origin: nginx over HTTPS -----------------------------------------------------------
origin_port=$(port)
mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 2;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log crit;
daemon off;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 600s;
    ssl_session_cache shared:bench:10m;
    server {
        listen 127.0.0.1:$origin_port ssl;
        listen [::1]:$origin_port ssl;
        ssl_certificate $pki/origin.pem;
        ssl_certificate_key $pki/origin.key;
        location /small { return 200 "ok\n"; }
    }
}
EOF
nginx -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" &
pids+=($!)
wait_port "$origin_port"
log "nginx $(nginx -v 2>&1 | sed 's/.*\///') on $HOST:$origin_port"

# --- the mediator --------------------------------------------------------------------------
med_port=$(port)
mkdir -p "$work/mediator/sockets" "$work/mediator/ca"
cp "$pki/proxy-ca.pem" "$work/mediator/ca/ca.pem"
cp "$pki/proxy-ca.pk8" "$work/mediator/ca/ca-key.pem"
chmod 600 "$work/mediator/ca/ca-key.pem"
token_hash=$(printf %s bench-token | sha256sum | cut -d' ' -f1)
cat >"$work/mediator/mediator.toml" <<EOF
[listen]
socket_dir = "$work/mediator/sockets"
tcp = "127.0.0.1:$med_port"
[resolver]
nameservers = ["127.0.0.1:53"]
hosts = { "$HOST" = ["127.0.0.1"] }
[timeouts]
idle_tunnel = 600
shutdown_grace = 1
[log]
decisions = "$work/mediator/decisions.log"
[registry]
backend = "memory"
[tls]
ca_dir = "$work/mediator/ca"
extra_ca_files = ["$pki/origin-ca.pem"]
[[authority]]
name = "bench"
allow = ["$HOST"]
allow_private = ["127.0.0.0/8"]
tls_terminate = ["$HOST"]
token_sha256 = "$token_hash"
EOF
"$bin/mediator" --config "$work/mediator/mediator.toml" 2>"$work/mediator/stderr" &
med_pid=$!
pids+=($med_pid)
for _ in $(seq 100); do grep -q '^ready' "$work/mediator/stderr" && break; sleep 0.1; done
grep -q '^ready' "$work/mediator/stderr" || { cat "$work/mediator/stderr" >&2; exit 1; }
log "mediator on 127.0.0.1:$med_port (pid $med_pid)"

# --- Squid ssl-bump ------------------------------------------------------------------------
if [ "$PEERS" = 1 ]; then
    squid_port=$(port)
    mkdir -p "$work/squid"
    /usr/lib/squid/security_file_certgen -c -s "$work/squid/ssl_db" -M 64MB >/dev/null
    cat >"$work/squid/squid.conf" <<EOF
http_port 127.0.0.1:$squid_port ssl-bump tls-cert=$pki/proxy-ca.pem tls-key=$pki/proxy-ca.key generate-host-certificates=on dynamic_cert_mem_cache_size=64MB
sslcrtd_program /usr/lib/squid/security_file_certgen -s $work/squid/ssl_db -M 64MB
sslcrtd_children 8 startup=2 idle=1
acl step1 at_step SslBump1
ssl_bump peek step1
ssl_bump bump all
tls_outgoing_options cafile=$pki/origin-ca.pem
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
max_filedescriptors 16384
shutdown_lifetime 1 seconds
acl bench_clients src 127.0.0.0/8
http_access allow bench_clients
http_access deny all
EOF
    chown -R proxy: "$work/squid" 2>/dev/null || true
    chmod 644 "$pki"/*
    squid -N -f "$work/squid/squid.conf" >"$work/squid/stdout" 2>&1 &
    squid_pid=$!
    pids+=($squid_pid)
    wait_port "$squid_port" || { cat "$work/squid/stdout" "$work/squid/cache.log" >&2; exit 1; }
    log "squid $(squid -v | head -1 | awk '{print $4}') ssl-bump on 127.0.0.1:$squid_port (pid $squid_pid)"

    mitm_port=$(port)
    mkdir -p "$work/mitm"
    cat "$pki/proxy-ca.pk8" "$pki/proxy-ca.pem" >"$work/mitm/mitmproxy-ca.pem"
    "$VENV/bin/mitmdump" -q --listen-host 127.0.0.1 --listen-port "$mitm_port" \
        --set confdir="$work/mitm" --set ssl_verify_upstream_trusted_ca="$pki/origin-ca.pem" \
        >"$work/mitm/stdout" 2>&1 &
    mitm_pid=$!
    pids+=($mitm_pid)
    wait_port "$mitm_port" || { cat "$work/mitm/stdout" >&2; exit 1; }
    log "mitmproxy $("$VENV/bin/mitmdump" --version 2>/dev/null | awk '/Mitmproxy/ {print $2}') on 127.0.0.1:$mitm_port (pid $mitm_pid)"
fi

# --- runs ----------------------------------------------------------------------------------
targets=(direct mediator)
[ "$PEERS" = 1 ] && targets+=(squid mitmproxy)
results=$work/results.jsonl
for rep in $(seq "$REPS"); do
    for mode in new keepalive; do
        for c in 1 8; do
            for t in "${targets[@]}"; do
                args=(--origin "127.0.0.1:$origin_port" --host "$HOST" --mode "$mode" --concurrency "$c"
                      --duration "$DURATION" --warmup "$WARMUP" --label "$t")
                case $t in
                    direct) args+=(--via direct --ca "$pki/origin-ca.pem") ;;
                    mediator) args+=(--via "tcp:127.0.0.1:$med_port" --user bench --password bench-token --ca "$pki/proxy-ca.pem" --proxy-pid "$med_pid") ;;
                    squid) args+=(--via "tcp:127.0.0.1:$squid_port" --ca "$pki/proxy-ca.pem" --proxy-pid "$squid_pid") ;;
                    mitmproxy) args+=(--via "tcp:127.0.0.1:$mitm_port" --ca "$pki/proxy-ca.pem" --proxy-pid "$mitm_pid") ;;
                esac
                "$bin/tlsload" "${args[@]}" | sed "s/^{/{\"rep\":$rep,/" >>"$results"
                : >"$work/mediator/decisions.log"
                sleep 0.3
            done
        done
    done
done

mkdir -p "$ROOT/bench/results"
cp "$results" "$ROOT/bench/results/tls-terminate.jsonl"
python3 - "$results" "$REPS" "$DURATION" <<'PY' | tee "$ROOT/bench/results/tls-terminate.md"
import json, sys, statistics, subprocess, datetime
rows = [json.loads(l) for l in open(sys.argv[1])]
def mean(xs): return statistics.mean(xs) if xs else float("nan")
cells = {}
for r in rows:
    cells.setdefault((r["mode"], r["concurrency"], r["label"]), []).append(r)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print("# TLS termination (bench/tls-terminate.sh)\n")
print(f"- {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, commit {commit}; REPS={sys.argv[2]}, {sys.argv[3]} s measured per run")
print("- origin nginx (HTTPS, ECDSA P-256), load generator rustls HTTP/1.1 without session resumption; one ECDSA P-256 CA signs every proxy's leaves")
print("- each cell: mean of the runs (the runs in brackets); CPU: the proxy's process tree over the measured window\n")
summary = {}
for mode in ["new", "keepalive"]:
    for c in [1, 8]:
        print(f"## {mode}, concurrency {c}\n")
        print("| path | req/s | p50 ms | p99 ms | proxy CPU s / 1000 | proxy RSS MiB | loadgen CPU s | errors |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for label in ["direct", "mediator", "squid", "mitmproxy"]:
            rs = cells.get((mode, c, label))
            if not rs: continue
            rate = mean([r["rate"] for r in rs])
            summary[(mode, c, label)] = (rate, mean([r["proxy_cpu_s_per_1000"] for r in rs if r["proxy_cpu_s_per_1000"] is not None]))
            runs = " / ".join(f"{r['rate']:.0f}" for r in rs)
            cpu = [r["proxy_cpu_s_per_1000"] for r in rs if r["proxy_cpu_s_per_1000"] is not None]
            rss = [r["proxy_rss_kib"] / 1024 for r in rs if r["proxy_rss_kib"]]
            print(f"| {label} | {rate:,.0f} ({runs}) | {mean([r['p50_ms'] for r in rs]):.3f} | {mean([r['p99_ms'] for r in rs]):.3f} | "
                  f"{mean(cpu):.3f} | {mean(rss):.1f} | {mean([r['loadgen_cpu_s'] for r in rs]):.2f} | {sum(r['errors'] for r in rs)} |"
                  .replace("nan", "–"))
        print()
print("## Goals (concurrency 8)\n")
def ratio(a, b):
    return a / b if a == a and b == b and b else float("nan")
g = summary.get
med_new, med_new_cpu = g(("new", 8, "mediator"), (float("nan"),) * 2)
sq_new, sq_new_cpu = g(("new", 8, "squid"), (float("nan"),) * 2)
mi_new, _ = g(("new", 8, "mitmproxy"), (float("nan"),) * 2)
med_ka, _ = g(("keepalive", 8, "mediator"), (float("nan"),) * 2)
sq_ka, _ = g(("keepalive", 8, "squid"), (float("nan"),) * 2)
for name, r, goal, ok in [
    ("new connections/s vs Squid ssl-bump", ratio(med_new, sq_new), ">= 1.5x", lambda x: x >= 1.5),
    ("new connections/s vs mitmproxy", ratio(med_new, mi_new), ">= 10x", lambda x: x >= 10),
    ("proxy CPU per 1,000 new vs Squid ssl-bump", ratio(med_new_cpu, sq_new_cpu), "<= 0.5x", lambda x: x <= 0.5),
    ("keep-alive requests/s vs Squid ssl-bump", ratio(med_ka, sq_ka), ">= 3x", lambda x: x >= 3),
]:
    state = "met" if r == r and ok(r) else ("no data" if r != r else "missed")
    print(f"- {name}: {r:.2f}x (goal {goal}): {state}")
PY
log "wrote bench/results/tls-terminate.md"
