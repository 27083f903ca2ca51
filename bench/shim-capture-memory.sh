#!/usr/bin/env bash
# Memory per idle captured connection (design 15; goal: within 2x the mediator's 9.4 KiB
# per idle tunnel, docs/performance.md): a Python client inside `shim` opens N TCP
# connections to an allowed name WITHOUT the proxy variables (capture carries them), and
# the shim's RSS is read before and after. Socket mode against a real mediator, so the
# figure is the shim's own (its stack, flows and channel connections). Everything is on
# loopback or inside the sandbox's namespace. N=... to change the count (default 1000);
# SHIM=/path/to/shim and MEDIATOR=/path/to/mediator use those binaries instead of building
# target/release (both given: nothing is built).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${N:-1000}
if [ -n "${SHIM:-}" ] && [ -n "${MEDIATOR:-}" ]; then
    shim=$(realpath "$SHIM")
    mediator=$(realpath "$MEDIATOR")
else
    cargo build --release -p shim -p mediator >/dev/null
    shim=$(realpath "${SHIM:-$PWD/target/release/shim}")
    mediator=$(realpath "${MEDIATOR:-$PWD/target/release/mediator}")
fi

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
ulimit -n 20000

# An origin that accepts and holds every connection.
python3 - "$work/origin.port" <<'PY' &
import asyncio, sys
async def hold(r, w):
    await r.read()
async def main():
    s = await asyncio.start_server(hold, "127.0.0.1", 0, backlog=4096)
    open(sys.argv[1], "w").write(str(s.sockets[0].getsockname()[1]))
    await s.serve_forever()
asyncio.run(main())
PY
pids+=($!)
for _ in $(seq 100); do [ -s "$work/origin.port" ] && break; sleep 0.05; done
port=$(cat "$work/origin.port")

mkdir -p "$work/sockets"
cat > "$work/mediator.toml" <<TOML
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
pids+=($!)
for _ in $(seq 100); do [ -S "$work/sockets/bench.sock" ] && break; sleep 0.05; done

mkdir -p "$work/rw"
"$shim" --mediator-socket "$work/sockets/bench.sock" --allow-write "$work/rw" --quiet-denials \
    -- /usr/bin/python3 - "$work/rw" "$n" "$port" <<'PY' &
import os, socket, sys, time
rw, n, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
open(os.path.join(rw, "started"), "w").close()
time.sleep(1.0)                      # the baseline is read meanwhile
conns = [socket.create_connection(("origin.test", port), timeout=30) for _ in range(n)]
open(os.path.join(rw, "ready"), "w").close()
time.sleep(5.0)                      # the loaded figure is read meanwhile
PY
shim_pid=$!
pids+=($shim_pid)
rss() { awk '/^VmRSS/ {print $2}' "/proc/$shim_pid/status"; }
for _ in $(seq 200); do [ -e "$work/rw/started" ] && break; sleep 0.05; done
sleep 0.5
before=$(rss)
for _ in $(seq 1200); do [ -e "$work/rw/ready" ] && break; sleep 0.05; done
[ -e "$work/rw/ready" ] || { echo "the client did not open its connections" >&2; exit 1; }
sleep 0.5
after=$(rss)
wait "$shim_pid" || true
allowed=$(grep '"event":"decision"' "$work/decisions.json" | grep -c '"decision":"allow".*"capture":true' || true)
python3 - "$before" "$after" "$n" "$allowed" <<'PY'
import sys
before, after, n, allowed = (int(x) for x in sys.argv[1:])
print(f"shim RSS: {before} KiB idle, {after} KiB with {n} captured connections "
      f"({allowed} allowed with capture: true in the mediator's log)")
print(f"per captured connection: {(after - before) / n:.1f} KiB (goal: < 18.8 KiB, 2x the mediator's 9.4 KiB per tunnel)")
PY
