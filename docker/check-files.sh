#!/usr/bin/env bash
# Checks everything in docker/ that is not the image itself (docker/smoke-test.sh tests
# that): the Kubernetes manifests against the Kubernetes schemas (kubernetes-validate) and
# the Prometheus Operator's API (docker/k8s/check.py), the alert rules and their unit
# tests (promtool), the DaemonSet's node tmpfiles rule (systemd-tmpfiles --create under an
# alternative root: the hostPath directory the pod needs, with its owner and mode), the
# systemd unit (systemd-analyze verify, which must print nothing),
# the compose file (the Compose specification's schema, and podman-compose config), the
# Prometheus config of the compose file, and every mediator config shipped (mediator
# check, including the ConfigMaps').
#
#   docker/check-files.sh VENV MEDIATOR_BINARY
#
# VENV is a Python virtualenv with kubernetes-validate, check-jsonschema,
# cloudcoil-models-prometheus-operator and podman-compose (.ci/run makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1
mediator=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
checks=0
ok() {
  checks=$((checks + 1))
  echo "ok: $*"
}

manifests=(docker/k8s/deployment/*.yaml docker/k8s/daemonset/*.yaml)

# Kubernetes schemas, strictly (an unknown field is an error). The two Prometheus
# Operator kinds have no Kubernetes schema; check.py validates them.
out=$("$venv/bin/kubernetes-validate" --strict "${manifests[@]}" 2>&1) || { echo "$out"; exit 1; }
if echo "$out" | grep -v "Couldn't find schema for kind \(ServiceMonitor\|PrometheusRule\) with api version monitoring.coreos.com/v1" | grep -qv '^INFO .* passed'; then
  echo "$out"
  echo "kubernetes-validate: unexpected output" >&2
  exit 1
fi
ok "kubernetes-validate --strict: $(echo "$out" | grep -c 'passed') resources against the Kubernetes $("$venv/bin/kubernetes-validate" --help | sed -n 's/.*Defaults to \([0-9.]*\).*/\1/p') schemas"

# The operator's resources, and whether the resources fit together; writes the configs
# and rule files it finds into $work.
"$venv/bin/python" docker/k8s/check.py "$work" "${manifests[@]}" > "$work/extracted"
ok "ServiceMonitor and PrometheusRule against the Prometheus Operator API; selectors, ports, volumes and grace periods fit"

# The DaemonSet's node prerequisite: its tmpfiles rule makes the hostPath socket directory
# (type Directory: the kubelet does not make it) owned by the pod's uid and gid, 0711.
tmpfiles=docker/k8s/daemonset/tmpfiles-egress-mediator.conf
mkdir -p "$work/node/run"
systemd-tmpfiles --root="$work/node" --create "$PWD/$tmpfiles"   # a relative path would be read under --root
want=$("$venv/bin/python" - docker/k8s/daemonset/daemonset.yaml <<'PY'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]
[v] = [v for v in spec["volumes"] if v["name"] == "sockets"]
assert v["hostPath"]["type"] == "Directory", v
ctx = spec["securityContext"]
print(v["hostPath"]["path"], f"{ctx['runAsUser']}:{ctx['runAsGroup']}")
PY
)
dir=${want%% *}
got=$(stat -c '%u:%g %a' "$work/node$dir")
[ "$got" = "${want#* } 711" ] || { echo "$tmpfiles makes $dir $got, the DaemonSet wants ${want#* } 711" >&2; exit 1; }
ok "systemd-tmpfiles --create $tmpfiles: $dir $got, the DaemonSet's hostPath (type Directory) and user"

for rules in $(grep '\.rules\.yaml$' "$work/extracted"); do
  promtool check rules "$rules"
done
cp docker/k8s/prometheusrule-tests.yaml "$work/"
(cd "$work" && promtool test rules prometheusrule-tests.yaml)
ok "promtool check rules, promtool test rules"

# Every mediator config shipped.
for config in examples/mediator.toml docker/compose/mediator.toml $(grep '\.toml$' "$work/extracted"); do
  "$mediator" check --config "$config" >/dev/null || { echo "mediator check failed: $config" >&2; exit 1; }
  echo "  mediator check: $config"
done
ok "mediator check on every shipped config"

# The systemd unit: systemd-analyze verify with the binaries at the unit's paths (in a
# mount namespace of its own: nothing is installed on this machine) and the man page its
# Documentation= names. Any output (an unknown key is only a warning) fails.
mkdir -p "$work/man/man1"
"$mediator" man --out-dir "$work/man/man1"
verify=$(unshare --mount sh -c '
  mount -t tmpfs tmpfs /usr/local/bin &&
  cp "$1" /usr/local/bin/mediator &&
  MANPATH="$2" systemd-analyze verify "$3" 2>&1' sh "$mediator" "$work/man" docker/systemd/mediator.service) \
  || { echo "$verify"; exit 1; }
if [ -n "$verify" ]; then
  echo "$verify"
  echo "systemd-analyze verify printed warnings" >&2
  exit 1
fi
ok "systemd-analyze verify docker/systemd/mediator.service"

# Compose: the specification's schema, podman-compose's own parser, and the Prometheus
# config it mounts.
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker/compose.yaml
"$venv/bin/podman-compose" -f docker/compose.yaml config >/dev/null
promtool check config docker/compose/prometheus.yml >/dev/null
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' docker/grafana-dashboard.json
ok "compose.yaml (compose-spec schema, podman-compose config), its prometheus.yml (promtool), the dashboard JSON"

echo "service files: $checks checks passed"
