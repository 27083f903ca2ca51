#!/usr/bin/env bash
# Container smoke test of the mediator image (CI runs it on the image docker/build-image.sh
# just built): only the mediator's two directories belong to its user in the image; the
# container runs with a read-only root filesystem as a non-root user,
# with a config mounted read-only; /healthz answers, the image's HEALTHCHECK passes, an
# allowed and a denied request go through it with curl, the decision log on its stdout
# shows both decisions, and SIGTERM stops it cleanly. Everything is on loopback: the
# container shares the host's network namespace, the origin is a loopback listener.
#
#   docker/smoke-test.sh IMAGE
#
# Needs podman (Debian: apt-get install -y podman runc), curl and python3.
set -euo pipefail
image=${1:?usage: docker/smoke-test.sh IMAGE}

# This machine's podman: runc (crun fails on cgroup v1 and on raising RLIMIT_NPROC), the
# cgroupfs manager, and no default ulimits (a container may not raise them here).
if [ -z "${CONTAINERS_CONF:-}" ]; then
  conf=$(mktemp)
  printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n' > "$conf"
  export CONTAINERS_CONF=$conf
fi
podman=(podman --runtime runc --cgroup-manager=cgroupfs)

work=$(mktemp -d)
name=mediator-smoke-$$
origin_pid=
passed=0
cleanup() {
  "${podman[@]}" rm -f -v -t 0 "$name" >/dev/null 2>&1 || true
  if [ -n "$origin_pid" ]; then kill "$origin_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "container smoke test FAILED: $*" >&2
  echo "--- container output ---" >&2
  "${podman[@]}" logs "$name" >&2 2>&1 || true
  exit 1
}
ok() {
  passed=$((passed + 1))
  echo "ok: $*"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
tcp_port=$(free_port)
admin_port=$(free_port)
origin_port=$(free_port)

# The origin: a loopback HTTP server with one known page.
mkdir -p "$work/www"
echo "smoke-origin-ok" > "$work/www/index.html"
python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$origin_port" >"$work/origin.log" 2>&1 &
origin_pid=$!

token=smoke-token-$$
token_sha256=$(printf %s "$token" | sha256sum | cut -d' ' -f1)
cat > "$work/mediator.toml" <<TOML
[listen]
socket_dir = "/run/egress-mediator"
tcp = "127.0.0.1:$tcp_port"
admin = "127.0.0.1:$admin_port"
admin_token_sha256 = "$token_sha256"

[resolver]
hosts = { "origin.test" = ["127.0.0.1"] }

[log]
decisions = "stdout"

[[authority]]
name = "agent-a"
allow = ["origin.test"]
allow_private = ["127.0.0.1/32"]
token_sha256 = "$token_sha256"
TOML
chmod 0644 "$work/mediator.toml"

# The image itself: non-root user, the mediator as entry point, no shell.
user=$("${podman[@]}" image inspect --format '{{.Config.User}}' "$image")
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || fail "image USER is '$user'"
ok "image USER is $user"
entry=$("${podman[@]}" image inspect --format '{{json .Config.Entrypoint}}' "$image")
[ "$entry" = '["/usr/local/bin/mediator"]' ] || fail "image ENTRYPOINT is $entry"
ok "image ENTRYPOINT is $entry"
# The labels name what the binary inside says it is.
inside=$("${podman[@]}" run --rm --network none --read-only "$image" --version 2>/dev/null) || fail "--version in the image"
label_rev=$("${podman[@]}" image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$image")
label_ver=$("${podman[@]}" image inspect --format '{{index .Labels "org.opencontainers.image.version"}}' "$image")
echo "$inside" | grep -qx "revision $label_rev" || fail "label revision $label_rev, binary says: $inside"
echo "$inside" | awk 'NR == 1' | grep -q "^mediator $label_ver " || fail "label version $label_ver, binary says: $inside"
ok "labels version $label_ver, revision $label_rev match the binary's --version"
# Negotiate parents: the GSSAPI library is opened at run time (ldd of the binary does not
# list it), so the image must carry it and its closure; `mediator check` loads it.
cat > "$work/negotiate.toml" <<'TOML'
# --network none: no resolv.conf to read; check never sends a query.
[resolver]
nameservers = ["127.0.0.1:53"]

[upstream]
mode = "parent"
parents = ["http://proxy.corp.test:3128"]
parent_auth = { "proxy.corp.test:3128" = "negotiate" }

[[authority]]
name = "agent-a"
allow = ["origin.test"]
TOML
chmod 0644 "$work/negotiate.toml"
gss=$("${podman[@]}" run --rm --network none --read-only \
  -v "$work/negotiate.toml:/etc/egress-mediator/negotiate.toml:ro" \
  "$image" check --config /etc/egress-mediator/negotiate.toml 2>&1) || fail "check of a Negotiate config in the image: $gss"
echo "$gss" | grep -q "GSSAPI: loaded /.*libgssapi_krb5.so.2 (credential store: yes)" \
  || fail "check of a Negotiate config did not load the GSSAPI library: $gss"
ok "mediator check of a Negotiate config loads $(echo "$gss" | sed -n 's/.*GSSAPI: loaded \([^ ]*\).*/\1/p') in the image"
if "${podman[@]}" run --rm --network none --entrypoint /bin/sh "$image" -c true >/dev/null 2>&1; then
  fail "the image has a shell"
fi
ok "the image has no /bin/sh"

# Ownership in the image: root owns everything but the two directories the mediator
# writes (its sockets and its CA), which are 65532's and mode 0750.
root=$("${podman[@]}" image mount "$image") || fail "podman image mount"
owned=$(cd "$root" && find . -user 65532 -o -group 65532 | sort | tr '\n' ' ')
perms=$(cd "$root" && stat -c '%n %u:%g %a' run var var/lib run/egress-mediator var/lib/egress-mediator | tr '\n' ',')
"${podman[@]}" image unmount "$image" >/dev/null 2>&1 || true
[ "$owned" = "./run/egress-mediator ./var/lib/egress-mediator " ] || fail "owned by 65532 in the image: $owned"
[ "$perms" = "run 0:0 755,var 0:0 755,var/lib 0:0 755,run/egress-mediator 65532:65532 750,var/lib/egress-mediator 65532:65532 750," ] \
  || fail "image directories: $perms"
ok "only /run/egress-mediator and /var/lib/egress-mediator (0750) belong to 65532 in the image"

# Read-only root, a non-root uid, every capability dropped, the config mounted read-only;
# the socket dir and the CA dir are the image's VOLUMEs (owned by the mediator's user).
# No periodic health checks (podman schedules them with systemd timers, and no systemd
# runs here); `podman healthcheck run` below runs the image's check once.
"${podman[@]}" run -d --name "$name" --network host --read-only \
  --user 65532:65532 --cap-drop all --security-opt no-new-privileges \
  --health-interval disable \
  -v "$work/mediator.toml:/etc/egress-mediator/mediator.toml:ro" \
  "$image" --config /etc/egress-mediator/mediator.toml >/dev/null 2>"$work/podman-run.err" \
  || fail "podman run failed: $(cat "$work/podman-run.err")"

healthy=
for _ in $(seq 1 100); do
  if curl -fsS --max-time 2 "http://127.0.0.1:$admin_port/healthz" >/dev/null 2>&1; then
    healthy=1
    break
  fi
  [ "$("${podman[@]}" inspect --format '{{.State.Running}}' "$name")" = true ] || fail "the container exited"
  sleep 0.2
done
[ -n "$healthy" ] || fail "no /healthz within 20 s"
ok "/healthz answers 200"
hc=$("${podman[@]}" healthcheck run "$name" 2>&1) || fail "the image's HEALTHCHECK (mediator health) failed: $hc"
ok "the image's HEALTHCHECK (mediator health --config ...) passes"

pid=$("${podman[@]}" inspect --format '{{.State.Pid}}' "$name")
uid=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
[ "$uid" = 65532 ] || fail "the mediator runs as uid $uid"
[ "$("${podman[@]}" inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$name")" = true ] || fail "root filesystem is writable"
ok "the mediator runs as uid $uid on a read-only root filesystem"

body=$(curl -sS --max-time 10 --proxy "http://127.0.0.1:$tcp_port" --proxy-user "agent-a:$token" \
  "http://origin.test:$origin_port/") || fail "the allowed request failed"
[ "$body" = smoke-origin-ok ] || fail "the allowed request got: $body"
ok "allowed request reached the origin through the container"

code=$(curl -sS --max-time 10 -o "$work/denied.json" -w '%{http_code}' \
  --proxy "http://127.0.0.1:$tcp_port" --proxy-user "agent-a:$token" http://blocked.test/) || true
[ "$code" = 403 ] || fail "the denied request got HTTP $code"
grep -q '"reason":"not_in_allowlist"' "$work/denied.json" || fail "denial body: $(cat "$work/denied.json")"
ok "denied request got 403 not_in_allowlist"

# The decision log is the container's stdout (events go to stderr).
found=
for _ in $(seq 1 50); do
  "${podman[@]}" logs "$name" 2>/dev/null > "$work/decisions.jsonl" || true
  if python3 - "$work/decisions.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
d = [l for l in lines if l.get("event") == "decision" and l.get("authority") == "agent-a"]
allow = any(l["decision"] == "allow" and l["host"] == "origin.test" and l["pin"] == "127.0.0.1" for l in d)
deny = any(l["decision"] == "deny" and l["host"] == "blocked.test" and l["reason"] == "not_in_allowlist" for l in d)
sys.exit(0 if allow and deny else 1)
PY
  then
    found=1
    break
  fi
  sleep 0.2
done
[ -n "$found" ] || fail "the decision log lacks the allow and deny lines: $(cat "$work/decisions.jsonl")"
ok "decision log (stdout) has the allow and the deny line, every line JSON"

# An authority created through the admin API is kept in the state directory (the image's
# VOLUME): after SIGKILL and a start of the same container it is back, token and all.
created=$(curl -sS --max-time 10 -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d '{"name":"agent-api","allow":["origin.test"],"allow_private":["127.0.0.1/32"],"generate_token":true}' \
  "http://127.0.0.1:$admin_port/v1/authorities") || fail "POST /v1/authorities failed"
api_token=$(printf %s "$created" | python3 -c 'import json,sys; v=json.load(sys.stdin); assert v["persisted"] is True and v["backend"] == "local", v; print(v["token"])') \
  || fail "the create did not say persisted (local): $created"
"${podman[@]}" kill -s KILL "$name" >/dev/null 2>&1 || fail "podman kill failed"
"${podman[@]}" wait "$name" >/dev/null 2>&1 || true
"${podman[@]}" start "$name" >/dev/null 2>"$work/podman-start.err" || fail "podman start failed: $(cat "$work/podman-start.err")"
healthy=
for _ in $(seq 1 100); do
  if curl -fsS --max-time 2 "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1; then
    healthy=1
    break
  fi
  sleep 0.2
done
[ -n "$healthy" ] || fail "no /readyz within 20 s after the restart"
body=$(curl -sS --max-time 10 --proxy "http://127.0.0.1:$tcp_port" --proxy-user "agent-api:$api_token" \
  "http://origin.test:$origin_port/") || fail "the API authority's request failed after kill -9"
[ "$body" = smoke-origin-ok ] || fail "the API authority's request after kill -9 got: $body"
ok "an authority created through the admin API survives kill -9 (state in the VOLUME)"

"${podman[@]}" stop -t 20 "$name" >/dev/null 2>"$work/podman-stop.err" \
  || fail "podman stop failed: $(cat "$work/podman-stop.err")"
code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || fail "exit code $code after SIGTERM"
"${podman[@]}" logs "$name" 2>&1 >/dev/null | grep -q "mediator: shutting down" || fail "no shutdown line on stderr"
ok "SIGTERM: clean shutdown, exit code 0"

size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
echo "container smoke test: $passed checks passed (image $image, $((size / 1024 / 1024)) MiB)"
