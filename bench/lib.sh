# Shared parts of bench/anchors.sh and bench/tls-profile.sh (sourced, not run): the
# certificates, nginx as the HTTPS origin with its connection counters, the mediator's
# configuration and start, and HAProxy's. Everything listens on loopback. The caller sets
# `bin` (the release binaries), `work` (its temp dir), `HOST` (the origin's name) and an
# array `pids` (what its cleanup stops), and defines `log`.

port() { "$bin/loadgen" free-port; }

wait_port() { # wait until 127.0.0.1:$1 accepts, up to 10 s
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    log "nothing listening on 127.0.0.1:$1"
    return 1
}

# bench_pki DIR: the origin's CA and its leaf for $HOST, the proxy CA (its key also as
# PKCS#8, for the mediator) and a leaf for $HOST from it (with its key in one file, for
# HAProxy). Every key is ECDSA P-256.
bench_pki() {
    local dir=$1
    mkdir -p "$dir"
    (
        cd "$dir"
        ec() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }
        ca() {
            ec "$1.key"
            openssl req -x509 -new -key "$1.key" -sha256 -days 2 -subj "/CN=$2" \
                -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
                -out "$1.pem" 2>/dev/null
        }
        leaf() {
            ec "$1.key"
            openssl req -new -key "$1.key" -subj "/CN=$HOST" -out "$1.csr" 2>/dev/null
            printf 'subjectAltName=DNS:%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$HOST" >"$1.ext"
            openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
                -days 2 -sha256 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
        }
        ca origin-ca "bench origin CA"
        leaf origin origin-ca
        ca proxy-ca "bench proxy CA"
        leaf haproxy proxy-ca
        cat haproxy.pem haproxy.key >haproxy-combined.pem
        openssl pkcs8 -topk8 -nocrypt -in proxy-ca.key -out proxy-ca.pk8 2>/dev/null
    )
    chmod 644 "$dir"/*
}

# bench_nginx DIR PKI: nginx over HTTPS on 127.0.0.1:$nginx_port (`GET /small`: "ok"),
# its stub_status on 127.0.0.1:$status_port; sets both.
bench_nginx() {
    local dir=$1 pki=$2
    nginx_port=$(port)
    status_port=$(port)
    mkdir -p "$dir"
    cat >"$dir/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/error.log crit;
daemon off;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 600s;
    ssl_session_cache shared:bench:10m;
    server {
        listen 127.0.0.1:$nginx_port ssl;
        ssl_certificate $pki/origin.pem;
        ssl_certificate_key $pki/origin.key;
        location /small { return 200 "ok\n"; }
    }
    # How many connections the origin accepted and requests it served (each status
    # request itself counts one of each).
    server {
        listen 127.0.0.1:$status_port;
        location /status { stub_status; }
    }
}
EOF
    nginx -c "$dir/nginx.conf" -e "$dir/error.log" &
    pids+=($!)
    wait_port "$nginx_port" && wait_port "$status_port"
}

# origin_counts: "ACCEPTS REQUESTS" so far, from nginx's stub_status.
origin_counts() {
    local out
    exec 4<>"/dev/tcp/127.0.0.1/$status_port"
    printf 'GET /status HTTP/1.0\r\nHost: localhost\r\n\r\n' >&4
    out=$(awk 'f && NF == 3 {print $1, $3; exit} /accepts handled requests/ {f = 1}' <&4)
    exec 4<&-
    echo "$out"
}

# mediator_config DIR PKI AGENTS: a configuration in DIR/mediator.toml with a TCP listener
# on 127.0.0.1:$med_port (set here), the socket dir DIR/sockets, the decision log
# DIR/decisions.log, the proxy CA as its own, and the authorities `tls-bench` (token
# tls-token; its tunnels to $HOST, which the hosts map points at 127.0.0.1, terminated)
# and agent-0..agent-(AGENTS-1) (token bench-token-I; allowed to reach 127.0.0.1), as in
# bench/tls-terminate.sh and bench/run.sh.
mediator_config() {
    local dir=$1 pki=$2 agents=$3 i
    med_port=$(port)
    mkdir -p "$dir/sockets" "$dir/ca"
    cp "$pki/proxy-ca.pem" "$dir/ca/ca.pem"
    cp "$pki/proxy-ca.pk8" "$dir/ca/ca-key.pem"
    chmod 600 "$dir/ca/ca-key.pem"
    {
        cat <<EOF
[listen]
socket_dir = "$dir/sockets"
tcp = "127.0.0.1:$med_port"

[resolver]
# Only the hosts map is consulted (every other target is an IP literal).
nameservers = ["127.0.0.1:53"]
hosts = { "$HOST" = ["127.0.0.1"] }

[upstream]
mode = "direct"

[timeouts]
idle_tunnel = 600
shutdown_grace = 1

[log]
decisions = "$dir/decisions.log"

[registry]
backend = "memory"

[tls]
ca_dir = "$dir/ca"
extra_ca_files = ["$pki/origin-ca.pem"]

[[authority]]
name = "tls-bench"
allow = ["$HOST"]
allow_private = ["127.0.0.0/8"]
tls_terminate = ["$HOST"]
token_sha256 = "$(printf %s tls-token | sha256sum | cut -d' ' -f1)"
EOF
        for i in $(seq 0 $(( agents - 1 ))); do
            printf '\n[[authority]]\nname = "agent-%d"\nallow = ["127.0.0.1"]\nallow_private = ["127.0.0.0/8"]\ntoken_sha256 = "%s"\n' \
                "$i" "$(printf %s "bench-token-$i" | sha256sum | cut -d' ' -f1)"
        done
    } >"$dir/mediator.toml"
}

# start_mediator DIR [WRAPPER...]: runs the mediator of DIR/mediator.toml (under WRAPPER,
# e.g. valgrind, when given) and waits for its `ready` line (up to 60 s); sets med_pid.
# The binary is $MEDIATOR when set (another build, to compare), else $bin/mediator.
start_mediator() {
    local dir=$1
    shift
    "$@" "${MEDIATOR:-$bin/mediator}" --config "$dir/mediator.toml" 2>"$dir/stderr" &
    med_pid=$!
    pids+=($med_pid)
    for _ in $(seq 600); do grep -q '^ready' "$dir/stderr" && break; sleep 0.1; done
    grep -q '^ready' "$dir/stderr" || { log "mediator did not start"; cat "$dir/stderr" >&2; return 1; }
}

# haproxy_config FILE PKI RELAY_TARGET: HAProxy terminating TLS in HTTP mode on
# 127.0.0.1:$hap_tls_port (the proxy CA's leaf for $HOST) with verified TLS to nginx
# (SNI and name $HOST, the origin CA) and http-reuse always; when RELAY_TARGET is given,
# also a TCP relay with splice-auto on 127.0.0.1:$relay_port to it. Sets the ports.
haproxy_config() {
    local file=$1 pki=$2 target=${3:-}
    hap_tls_port=$(port)
    relay_port=$(port)
    {
        cat <<EOF
global
    # Far above any concurrency measured; HAProxy sizes its descriptors from this, and
    # must stay inside the open-files limit (it refuses to start otherwise).
    maxconn 4096
    ssl-server-verify required

defaults
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 600s

frontend terminate
    mode http
    bind 127.0.0.1:$hap_tls_port ssl crt $pki/haproxy-combined.pem alpn http/1.1
    default_backend nginx

backend nginx
    mode http
    http-reuse always
    server nginx 127.0.0.1:$nginx_port ssl verify required ca-file $pki/origin-ca.pem sni str($HOST) verifyhost $HOST
EOF
        if [ -n "$target" ]; then cat <<EOF

frontend relay
    mode tcp
    bind 127.0.0.1:$relay_port
    option splice-auto
    default_backend bench_origin

backend bench_origin
    mode tcp
    option splice-auto
    server origin $target
EOF
        fi
    } >"$file"
    haproxy -c -q -f "$file"
}

# start_haproxy FILE [WRAPPER...]: runs HAProxy in the foreground; sets hap_pid.
start_haproxy() {
    local file=$1
    shift
    "$@" haproxy -db -f "$file" >"$file.out" 2>&1 &
    hap_pid=$!
    pids+=($hap_pid)
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$hap_tls_port") 2>/dev/null && return 0
        sleep 0.1
    done
    log "haproxy did not start"
    cat "$file.out" >&2
    return 1
}
