#!/usr/bin/env python3
"""Turns the JSON lines of bench/run.sh into the Markdown report (issue 7): one table per
mode and concurrency with ratios to direct and to the best peer of the same run, the
spread between repetitions, memory and CPU of each proxy, the idle-tunnel test, the
criterion medians, and each goal of the issue met or missed."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

PEERS = ("squid", "tinyproxy")
TARGETS = ("direct", "squid", "tinyproxy", "mediator-tcp", "mediator-unix")
MODES = ("connect-rate", "socks-rate", "forward-rate", "tunnel-throughput")


def load_lines(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def cmd(*a):
        try:
            return subprocess.run(a, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "?"

    rev = cmd("git", "rev-parse", "--short", "HEAD") or "?"
    # bench/results is rewritten by this very run: changes there do not count.
    if cmd("git", "status", "--porcelain", "--", ".", ":(exclude)bench/results"):
        rev += " (with uncommitted changes)"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": os.cpu_count(),
        "model": model,
        "kernel": platform.release(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "squid": cmd("sh", "-c", "squid -v | head -1").replace("Squid Cache: Version ", ""),
        "tinyproxy": cmd("tinyproxy", "-v").replace("tinyproxy ", ""),
        "rev": rev,
    }


class Stat:
    """Mean and spread of one metric over the repetitions of one configuration."""

    def __init__(self, values):
        self.values = values
        self.mean = statistics.mean(values) if values else None
        if values and self.mean:
            self.spread = (max(values) - min(values)) / self.mean * 100
        else:
            self.spread = None


def fmt_num(x, digits=0):
    if x is None:
        return "–"
    if digits == 0 and abs(x) >= 1000:
        return f"{x / 1000:.1f}k"
    return f"{x:.{digits}f}"


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}x"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--idle", required=True)
    ap.add_argument("--rest", required=True)
    ap.add_argument("--peak", required=True)
    ap.add_argument("--criterion", required=True)
    ap.add_argument("--elapsed", default="?")
    ap.add_argument("--settings", default="")
    a = ap.parse_args()

    rows = load_lines(a.results)
    idle = load_lines(a.idle) if os.path.exists(a.idle) else []
    rest = json.load(open(a.rest))
    peak = json.load(open(a.peak))
    m = machine()

    # (mode, concurrency, target) -> list of runs
    by = {}
    for r in rows:
        by.setdefault((r["mode"], r["concurrency"], r["label"]), []).append(r)

    def metric(mode):
        return "mib_s" if mode == "tunnel-throughput" else "rate"

    def stat(mode, c, t, key=None):
        runs = by.get((mode, c, t), [])
        key = key or metric(mode)
        return Stat([r[key] for r in runs if r.get(key) is not None])

    def best_peer(mode, c):
        best = None
        for p in PEERS:
            s = stat(mode, c, p)
            if s.mean is not None and (best is None or s.mean > best[1]):
                best = (p, s.mean)
        return best

    out = []
    w = out.append
    w("# Benchmark results (bench/run.sh)")
    w("")
    w(f"- date: {m['date']}; commit {m['rev']}")
    w(f"- machine: {m['nproc']} cores, {m['model']}, kernel {m['kernel']}; load average at the end: {m['load']}")
    w(f"- peers: Squid {m['squid']}, tinyproxy {m['tinyproxy']} (Debian), minimal configs, no caching, no access log")
    w(f"- settings: {a.settings}; whole run {a.elapsed} s")
    w("- everything on loopback: origin (hyper), load generator (tokio + hyper client), proxy, all sharing the cores")
    w("- each cell: mean of the repetitions; *spread* = (max - min) / mean; ratios are of means from this run;")
    w("  rate = completed requests/s in the measured window (tunnel-throughput: MiB/s of response body);")
    w("  the mediator is reached over TCP with a credential (`mediator-tcp`) or its per-authority Unix socket (`mediator-unix`);")
    w("  Squid and tinyproxy have no SOCKS5 server, so `socks-rate` compares with direct only")
    w("")

    for mode in MODES:
        for c in (1, 32):
            if not any((mode, c, t) in by for t in TARGETS):
                continue
            unit = "MiB/s" if mode == "tunnel-throughput" else "req/s"
            direct = stat(mode, c, "direct").mean
            bp = best_peer(mode, c)
            w(f"## {mode}, concurrency {c}")
            w("")
            per = "GiB" if mode == "tunnel-throughput" else "1000 req"
            lat = " per transfer" if mode == "tunnel-throughput" else ""
            w(f"| path | {unit} | spread | p50 ms{lat} | p99 ms{lat} | x direct | x best peer{f' ({bp[0]})' if bp else ''} | proxy CPU s / {per} | errors |")
            w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for t in TARGETS:
                if (mode, c, t) not in by:
                    continue
                s = stat(mode, c, t)
                # No transfer completes inside the window: no latency to show.
                done = all(r["requests"] > 0 for r in by[(mode, c, t)])
                p50 = stat(mode, c, t, "p50_ms").mean if done else None
                p99 = stat(mode, c, t, "p99_ms").mean if done else None
                cpu_key = "proxy_cpu_per_gib" if mode == "tunnel-throughput" else "proxy_cpu_per_1000"
                cpu = stat(mode, c, t, cpu_key).mean
                errors = sum(r["errors"] for r in by[(mode, c, t)])
                vs_direct = s.mean / direct if direct and t != "direct" else None
                vs_peer = s.mean / bp[1] if bp and t not in PEERS and t != "direct" else None
                vals = " / ".join(fmt_num(v, 0 if unit == "req/s" else 0) for v in s.values)
                w(
                    f"| {t} | {fmt_num(s.mean)} ({vals}) | {fmt_num(s.spread)}% | {fmt_num(p50, 3)} | {fmt_num(p99, 3)} "
                    f"| {fmt_ratio(vs_direct)} | {fmt_ratio(vs_peer)} | {fmt_num(cpu, 3)} | {errors} |"
                )
            w("")

    # Memory
    w("## Memory (KiB)")
    w("")
    w("| proxy | RSS at rest | peak RSS (VmHWM) over the load runs |")
    w("|---|---:|---:|")
    for p in ("mediator", "squid", "tinyproxy"):
        label = "mediator (100 authorities)" if p == "mediator" else p
        w(f"| {label} | {rest.get(p, '–')} | {peak.get(p, '–')} |")
    w("")
    if idle:
        w("## Idle tunnels")
        w("")
        w("| path | tunnels held | errors | RSS before KiB | RSS with tunnels KiB | RSS after close KiB | per tunnel | open time s |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in idle:
            w(
                f"| {r['label']} | {r['tunnels']} | {r['errors']} | {r['rss_before_kib']} | {r['rss_open_kib']} "
                f"| {r['rss_after_close_kib']} | {r['bytes_per_tunnel'] / 1024:.1f} KiB | {r['open_s']:.2f} |"
            )
        w("")

    # Criterion
    crit = {}
    if os.path.isdir(a.criterion):
        for dirpath, _, files in os.walk(a.criterion):
            if os.path.basename(dirpath) == "new" and "estimates.json" in files and "benchmark.json" in files:
                bid = json.load(open(os.path.join(dirpath, "benchmark.json")))["full_id"]
                est = json.load(open(os.path.join(dirpath, "estimates.json")))
                crit[bid] = est["median"]["point_estimate"]
    wanted = {k: v for k, v in crit.items() if k.split("/")[0] in ("canonicalize_host", "grant_decide", "classify")}
    if wanted:
        w("## Micro-benchmarks (criterion, median)")
        w("")
        w("| benchmark | median |")
        w("|---|---:|")
        for k in sorted(wanted, key=lambda k: [int(x) if x.isdigit() else x for x in k.split("/")]):
            v = wanted[k]
            w(f"| `{k}` | {v:.1f} ns |" if v < 10_000 else f"| `{k}` | {v / 1000:.2f} µs |")
        w("")

    # Goals
    w("## Goals of issue 7")
    w("")
    w("| goal | measured | met |")
    w("|---|---|---|")

    def goal(name, measured, ok):
        w(f"| {name} | {measured} | {'yes' if ok else ('**no**' if ok is not None else 'n/a')} |")

    for t in ("mediator-tcp", "mediator-unix"):
        d = stat("connect-rate", 32, "direct").mean
        s = stat("connect-rate", 32, t).mean
        bp = best_peer("connect-rate", 32)
        if d and s and bp:
            goal(
                f"connect-rate at 32 ({t}): >= 0.6x direct and >= 2x best peer",
                f"{s / d:.2f}x direct, {s / bp[1]:.2f}x {bp[0]} ({fmt_num(s)}/s)",
                s / d >= 0.6 and s / bp[1] >= 2,
            )
    for t in ("mediator-tcp", "mediator-unix"):
        d = stat("forward-rate", 32, "direct").mean
        s = stat("forward-rate", 32, t).mean
        sq = stat("forward-rate", 32, "squid").mean
        if d and s and sq:
            goal(
                f"forward-rate at 32 ({t}): >= 0.4x direct and >= 3x Squid",
                f"{s / d:.2f}x direct, {s / sq:.2f}x squid ({fmt_num(s)}/s)",
                s / d >= 0.4 and s / sq >= 3,
            )
    for t in ("mediator-tcp", "mediator-unix"):
        d = stat("tunnel-throughput", 1, "direct").mean
        s = stat("tunnel-throughput", 1, t).mean
        if d and s:
            goal(f"tunnel-throughput, one tunnel ({t}): >= 0.8x direct", f"{s / d:.2f}x direct ({s:.0f} MiB/s)", s / d >= 0.8)
    peers_cpu = [(p, stat("connect-rate", 32, p, "proxy_cpu_per_1000").mean) for p in PEERS]
    peers_cpu = [x for x in peers_cpu if x[1]]
    for t in ("mediator-tcp", "mediator-unix"):
        s = stat("connect-rate", 32, t, "proxy_cpu_per_1000").mean
        if s and peers_cpu:
            bp = min(peers_cpu, key=lambda x: x[1])
            goal(
                f"proxy CPU per 1,000 tunnels ({t}, connect-rate at 32): <= 0.5x best peer",
                f"{s:.3f} s vs {bp[0]} {bp[1]:.3f} s ({s / bp[1]:.2f}x)",
                s <= 0.5 * bp[1],
            )
    for mode in ("connect-rate", "forward-rate", "socks-rate"):
        d = stat(mode, 1, "direct", "p99_ms").mean
        for t in ("mediator-tcp", "mediator-unix"):
            s = stat(mode, 1, t, "p99_ms").mean
            if d is not None and s is not None:
                goal(f"p99 added latency at 1, {mode} ({t}): < 0.2 ms", f"{s - d:+.3f} ms ({s:.3f} vs {d:.3f})", s - d < 0.2)
    if "mediator" in rest:
        goal("RSS at rest with 100 authorities: < 16 MiB", f"{rest['mediator'] / 1024:.1f} MiB", rest["mediator"] < 16 * 1024)
    for r in idle:
        if r["label"].startswith("mediator"):
            goal(
                f"RSS per idle tunnel ({r['label']}): < 20 KiB",
                f"{r['bytes_per_tunnel'] / 1024:.1f} KiB ({r['tunnels']} tunnels)",
                r["bytes_per_tunnel"] < 20 * 1024 and r["tunnels"] > 0,
            )
    dec = {k: v for k, v in crit.items() if k.startswith("grant_decide/") and k.endswith("/10000")}
    if dec:
        worst = max(dec, key=dec.get)
        goal("Grant::decide with 10,000 rules: median < 1 µs", f"worst case `{worst}` {dec[worst]:.0f} ns", dec[worst] < 1000)
    for mode, c in [(m_, c_) for m_ in MODES for c_ in (1, 32)]:
        u = stat(mode, c, "mediator-unix").mean
        t = stat(mode, c, "mediator-tcp").mean
        if u and t:
            s_u, s_t = stat(mode, c, "mediator-unix").spread, stat(mode, c, "mediator-tcp").spread
            goal(
                f"Unix socket >= TCP channel, {mode} at {c}",
                f"{u / t:.2f}x (spreads {fmt_num(s_u)}% / {fmt_num(s_t)}%)",
                u >= t,
            )
    w("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
