#!/usr/bin/env python3
"""Checks the Kubernetes manifests beyond their schemas (which kubernetes-validate checks).

- The Prometheus Operator resources (ServiceMonitor, PrometheusRule), which the Kubernetes
  schemas do not cover, against the operator's API models (cloudcoil's pydantic models,
  generated from the operator's CRDs), strictly: a field the model does not know is an
  error, not dropped.
- That the resources fit together: every Service, PodDisruptionBudget and ServiceMonitor
  selects pods or Services that exist, and names ports they have; every ConfigMap and
  Secret a pod mounts exists.
- That a pod's terminationGracePeriodSeconds covers what SIGTERM starts: a container's
  preStop sleep (the time kube-proxy takes to stop routing to it) plus the [timeouts]
  shutdown_grace of the mediator.toml it mounts (default 10), with time to spare.
- It writes out what other tools check: each ConfigMap's mediator.toml (for `mediator
  check`) and each PrometheusRule's groups (for `promtool check rules` / `test rules`).

usage: check.py OUT_DIR MANIFEST...   (prints the files it wrote, one a line, on stdout)
"""

import pathlib
import sys
import tomllib

import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring

CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring.PrometheusRule,
}

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def unknown_keys(given, kept, path=""):
    """Keys present in `given` but missing from the model's round trip `kept`."""
    out = []
    if isinstance(given, dict) and isinstance(kept, dict):
        for k, v in given.items():
            if k not in kept:
                out.append(f"{path}.{k}".lstrip("."))
            else:
                out.extend(unknown_keys(v, kept[k], f"{path}.{k}"))
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (g, k) in enumerate(zip(given, kept)):
            out.extend(unknown_keys(g, k, f"{path}[{i}]"))
    return out


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    docs = []
    for name in sys.argv[2:]:
        for doc in yaml.safe_load_all(open(name)):
            if doc:
                docs.append((name, doc))

    pods = []  # (where, namespace, labels, pod spec)
    services = []
    configmaps = set()
    policies = {}  # (namespace, ConfigMap name) -> its parsed mediator.toml
    secrets = set()
    for where, d in docs:
        kind, meta = d["kind"], d.get("metadata", {})
        ns = meta.get("namespace", "default")
        where = f"{where} {kind}/{meta.get('name')}"
        model = CRDS.get((d["apiVersion"], kind))
        if model is not None:
            try:
                kept = model.model_validate(d).model_dump(by_alias=True, exclude_unset=True)
                for k in unknown_keys(d, kept):
                    err(where, f"unknown field {k}")
            except Exception as e:  # pydantic's ValidationError lists every problem
                err(where, str(e))
        if kind in ("Deployment", "DaemonSet", "StatefulSet"):
            t = d["spec"]["template"]
            if not matches(d["spec"]["selector"]["matchLabels"], t["metadata"]["labels"]):
                err(where, "spec.selector does not select its own pod template")
            pods.append((where, ns, t["metadata"]["labels"], t["spec"]))
        elif kind == "Pod":
            pods.append((where, ns, meta.get("labels", {}), d["spec"]))
        elif kind == "Service":
            services.append((where, ns, meta.get("labels", {}), d["spec"]))
        elif kind == "ConfigMap":
            configmaps.add((ns, meta["name"]))
            for key, text in d.get("data", {}).items():
                if key.endswith(".toml"):
                    f = out / f"{ns}-{meta['name']}-{key}"
                    f.write_text(text)
                    print(f)
                if key == "mediator.toml":
                    policies[(ns, meta["name"])] = tomllib.loads(text)
        elif kind == "Secret":
            secrets.add((ns, meta["name"]))
        elif kind == "PrometheusRule":
            f = out / f"{ns}-{meta['name']}.rules.yaml"
            f.write_text(yaml.safe_dump({"groups": d["spec"]["groups"]}, sort_keys=False))
            print(f)

    for where, ns, labels, spec in pods:
        for v in spec.get("volumes", []):
            if "configMap" in v and (ns, v["configMap"]["name"]) not in configmaps:
                err(where, f"volume {v['name']}: no ConfigMap {v['configMap']['name']} in {ns}")
            if "secret" in v and (ns, v["secret"]["secretName"]) not in secrets:
                err(where, f"volume {v['name']}: no Secret {v['secret']['secretName']} in {ns}")

    # SIGTERM comes after the preStop hook, and the grace period counts both.
    for where, ns, _labels, spec in pods:
        grace = spec.get("terminationGracePeriodSeconds", 30)
        mounted = {v["name"]: (ns, v["configMap"]["name"]) for v in spec.get("volumes", []) if "configMap" in v}
        for c in spec["containers"]:
            sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
            for m in c.get("volumeMounts", []):
                policy = policies.get(mounted.get(m["name"]))
                if policy is None:
                    continue
                drain = policy.get("timeouts", {}).get("shutdown_grace", 10)
                if sleep + drain + 5 > grace:
                    err(where, f"container {c['name']}: terminationGracePeriodSeconds {grace} < "
                        f"preStop sleep {sleep} + shutdown_grace {drain} + 5")

    def container_ports(spec):
        return {p["name"] for c in spec["containers"] for p in c.get("ports", []) if "name" in p}

    for where, ns, _labels, spec in services:
        chosen = [p for p in pods if p[1] == ns and matches(spec["selector"], p[2])]
        if not chosen:
            err(where, "selects no pod")
        for port in spec["ports"]:
            target = port.get("targetPort")
            if isinstance(target, str) and not any(target in container_ports(p[3]) for p in chosen):
                err(where, f"targetPort {target} is no named port of the pods it selects")
    for where, d in docs:
        kind, ns = d["kind"], d.get("metadata", {}).get("namespace", "default")
        if kind == "PodDisruptionBudget":
            if not any(p[1] == ns and matches(d["spec"]["selector"]["matchLabels"], p[2]) for p in pods):
                err(where, "PodDisruptionBudget selects no pod")
        if kind == "ServiceMonitor":
            names = d["spec"].get("namespaceSelector", {}).get("matchNames", [ns])
            chosen = [s for s in services if s[1] in names and matches(d["spec"]["selector"]["matchLabels"], s[2])]
            if not chosen:
                err(where, "ServiceMonitor selects no Service")
            for e in d["spec"]["endpoints"]:
                if not any(e["port"] in {p.get("name") for p in s[3]["ports"]} for s in chosen):
                    err(where, f"endpoint port {e['port']} is no port of the Services it selects")

    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print(f"check.py: {len(docs)} resources fit together", file=sys.stderr)


main()
