#!/usr/bin/env bash
# Cost of the decision record's format and export (design 19): the same mediator with
# [log] format "native", "ocsf", and native plus [telemetry] otlp_endpoint (a Python
# receiver on loopback answering 200), decision log to a file, side by side in one run, on the CONNECT and
# forward benchmarks at concurrency 8 over the authority's Unix socket. Prints requests/s,
# the mediator's CPU seconds per 1,000 requests and the OCSF/native ratio per mode.
# RUNS=N alternations (default 3), DURATION seconds per run (default 4).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
DURATION=${DURATION:-4}
cargo build --release -q -p mediator -p bench
bin=$PWD/target/release
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

"$bin/origin" --listen 127.0.0.1:0 >"$work/origin.out" 2>"$work/origin.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$work/origin.out" && break; sleep 0.1; done
origin=$(awk '/^listening/ {print $2}' "$work/origin.out")
# An OTLP/HTTP sink: reads each POST and answers 200.
otlp_port=$("$bin/loadgen" free-port)
python3 - "$otlp_port" <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
pids+=($!)

for format in native ocsf otlp; do
    mkdir -p "$work/$format/sockets"
    case $format in
        otlp) fmt=native; telemetry="[telemetry]
otlp_endpoint = \"http://127.0.0.1:$otlp_port\"" ;;
        *) fmt=$format; telemetry= ;;
    esac
    cat >"$work/$format/mediator.toml" <<TOML
[listen]
socket_dir = "$work/$format/sockets"
[log]
decisions = "$work/$format/decisions.log"
format = "$fmt"
$telemetry
[registry]
backend = "memory"
[[authority]]
name = "agent-0"
allow = ["127.0.0.1"]
allow_private = ["127.0.0.1"]
TOML
    "$bin/mediator" --config "$work/$format/mediator.toml" 2>"$work/$format/err" &
    pids+=($!)
    echo $! >"$work/$format/pid"
    for _ in $(seq 100); do [ -S "$work/$format/sockets/agent-0.sock" ] && break; sleep 0.1; done
done

for _ in $(seq "$RUNS"); do
    for mode in connect-rate forward-rate; do
        for format in native ocsf otlp; do
            "$bin/loadgen" run --origin "$origin" --mode "$mode" --concurrency 8 \
                --duration "$DURATION" --warmup 1 --label "$format" \
                --via "unix:$work/$format/sockets/agent-0.sock" \
                --proxy-pid "$(cat "$work/$format/pid")" >>"$work/results.jsonl"
            : >"$work/$format/decisions.log"
        done
    done
done
python3 - "$work/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for mode in ("connect-rate", "forward-rate"):
    pick = lambda f, k: statistics.median(r[k] or 0.0 for r in rows if r["mode"] == mode and r["label"] == f)
    n, cn = pick("native", "rate"), pick("native", "proxy_cpu_per_1000")
    line = f"{mode:>13}: native {n:8.0f} req/s ({cn:.3f} CPU s/1k)"
    for f in ("ocsf", "otlp"):
        r, c = pick(f, "rate"), pick(f, "proxy_cpu_per_1000")
        line += f", {f} {r:8.0f} req/s ({c:.3f} CPU s/1k, ratio {r / n:.3f})"
    print(line)
PY
