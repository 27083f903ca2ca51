#!/usr/bin/env python3
"""Turns the JSON lines of bench/run.sh into the Markdown report: one table per
mode and concurrency with ratios to direct and to the best peer of the same run, the
spread between repetitions, memory and CPU of each proxy, the idle-tunnel test, the
criterion medians, and each goal met or missed, with the ratio measured in the run and
its spread over the repetitions."""

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


CHANNELS = ("mediator-tcp", "mediator-unix")


def per_rep(by, mode, c, label, key):
    """Repetition -> value of `key` for one target, mode and concurrency."""
    runs = by.get((mode, c, label), [])
    return {r.get("rep", i + 1): r[key] for i, r in enumerate(runs) if r.get(key) is not None}


def ratio_row(w, name, mine, ref, op, limit, fmt, every_rep=False):
    """One goal comparing two series (each (label, {rep: value})): the ratio of their
    medians against `limit` (`op` ">=" or "<="), and the spread of the ratio of rep i to
    rep i. `every_rep`: met only if every per-rep ratio is (the lead must stand clear of
    the machine's noise), not just the ratio of medians."""
    (label, a), (ref_label, b) = mine, ref
    if not a or not b or not statistics.median(b.values()):
        w(f"| {name} | no data | – | – | n/a |")
        return
    ma, mb = statistics.median(a.values()), statistics.median(b.values())
    ratio = ma / mb
    reps = [ra / b[i] for i, ra in a.items() if b.get(i)]
    spread = "(1 rep)" if len(reps) <= 1 else f"{min(reps):.2f}x..{max(reps):.2f}x ({len(reps)} reps)"
    judged = [ratio] + (reps if every_rep else [])
    ok = all(r >= limit if op == ">=" else r <= limit for r in judged)
    w(f"| {name} | {label} {fmt(ma)} vs {ref_label} {fmt(mb)} | {ratio:.2f}x | {spread} | {'yes' if ok else '**no**'} |")


def rate(x):
    return f"{fmt_num(x)}/s"


def goals_tunnel_rates(w, by):
    """CONNECT and SOCKS5 tunnels/s at concurrency 1 against tinyproxy's CONNECT rate
    (tinyproxy has no SOCKS5)."""
    tp = ("tinyproxy", per_rep(by, "connect-rate", 1, "tinyproxy", "rate"))
    for mode, what in (("connect-rate", "CONNECT"), ("socks-rate", "SOCKS5")):
        for t in CHANNELS:
            mine = (t, per_rep(by, mode, 1, t, "rate"))
            ratio_row(w, f"{what} tunnels/s at c=1 ({t}) >= tinyproxy CONNECT at c=1", mine, tp, ">=", 1, rate)


def goals_tunnel_rates_c32(w, by):
    """CONNECT tunnels/s at concurrency 32: at least 1.25x tinyproxy in every repetition."""
    tp = ("tinyproxy", per_rep(by, "connect-rate", 32, "tinyproxy", "rate"))
    for t in CHANNELS:
        mine = (t, per_rep(by, "connect-rate", 32, t, "rate"))
        ratio_row(w, f"CONNECT tunnels/s at c=32 ({t}) >= 1.25x tinyproxy in every rep", mine, tp, ">=", 1.25, rate, every_rep=True)


def goals_cpu(w, by):
    """Proxy CPU seconds per 1,000 CONNECT tunnels against tinyproxy's."""
    for c in (1, 32):
        tp = ("tinyproxy", per_rep(by, "connect-rate", c, "tinyproxy", "proxy_cpu_per_1000"))
        for t in CHANNELS:
            mine = (t, per_rep(by, "connect-rate", c, t, "proxy_cpu_per_1000"))
            ratio_row(w, f"proxy CPU s per 1,000 tunnels at c={c} ({t}) <= 0.8x tinyproxy", mine, tp, "<=", 0.8, lambda x: f"{x:.3f} s")


def goals_throughput(w, by):
    """One tunnel's throughput against direct."""
    direct = ("direct", per_rep(by, "tunnel-throughput", 1, "direct", "mib_s"))
    for t, limit in (("mediator-tcp", 0.6), ("mediator-unix", 0.9)):
        mine = (t, per_rep(by, "tunnel-throughput", 1, t, "mib_s"))
        ratio_row(w, f"one-tunnel throughput ({t}) >= {limit}x direct", mine, direct, ">=", limit, lambda x: f"{x:.0f} MiB/s")


def goals_forward(w, by):
    """Forward requests/s at concurrency 32 against Squid."""
    squid = ("squid", per_rep(by, "forward-rate", 32, "squid", "rate"))
    for t in CHANNELS:
        mine = (t, per_rep(by, "forward-rate", 32, t, "rate"))
        ratio_row(w, f"forward req/s at c=32 ({t}) >= 3x Squid", mine, squid, ">=", 3, rate)


def shim_medians(path):
    """Command -> median ms from the output of bench/shim-startup.sh."""
    out = {}
    with open(path) as f:
        for line in f:
            name, sep, rest = line.partition(": median ")
            if sep:
                out[name.strip()] = float(rest.split()[0])
    return out


def goals_memory(w, rest, idle, shim_startup):
    """Absolute limits: RSS at rest, RSS per idle tunnel, shim start-up (no ratio, one
    measurement each)."""

    def row(name, measured, ok):
        w(f"| {name} | {measured} | – | – | {'yes' if ok else '**no**'} |")

    if "mediator" in rest:
        row("RSS at rest, 100 authorities <= 14 MiB", f"{rest['mediator'] / 1024:.2f} MiB", rest["mediator"] <= 14 * 1024)
    for r in idle:
        if r["label"] in CHANNELS:
            row(
                f"RSS per idle tunnel ({r['label']}) <= 9.4 KiB",
                f"{r['bytes_per_tunnel'] / 1024:.2f} KiB ({r['tunnels']} tunnels)",
                r["bytes_per_tunnel"] <= 9.4 * 1024 and r["tunnels"] > 0,
            )
    # With capture (the default), standalone-mediator and embedded mode.
    wanted = ("shim (socket)", "shim (embedded)")
    medians = shim_medians(shim_startup) if shim_startup else {}
    if not shim_startup:
        w("| shim start-up <= 8 ms | not measured here: bench/shim-startup.sh | – | – | n/a |")
    elif not all(k in medians for k in wanted):
        w(f"| shim start-up <= 8 ms | no shim medians in {shim_startup} | – | – | n/a |")
    else:
        row(
            "shim start-up (capture on) <= 8 ms",
            ", ".join(f"{k} median {medians[k]:.2f} ms" for k in wanted),
            all(medians[k] <= 8 for k in wanted),
        )


def goals(w, by, rest, idle, shim_startup):
    w("## Goals")
    w("")
    w("Ratios are of the medians over the repetitions; the spread is the lowest..highest ratio of")
    w("repetition i to repetition i of the reference. tinyproxy and Squid ran in the same run.")
    w("")
    w("| goal | measured (medians) | ratio of medians | spread of per-rep ratios | met |")
    w("|---|---|---:|---:|---|")
    goals_tunnel_rates(w, by)
    goals_tunnel_rates_c32(w, by)
    goals_cpu(w, by)
    goals_throughput(w, by)
    goals_forward(w, by)
    goals_memory(w, rest, idle, shim_startup)
    w("")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--idle", required=True)
    ap.add_argument("--rest", required=True)
    ap.add_argument("--peak", required=True)
    ap.add_argument("--criterion", required=True)
    ap.add_argument("--elapsed", default="?")
    ap.add_argument("--settings", default="")
    ap.add_argument("--shim-startup", help="saved output of bench/shim-startup.sh, for its goal row")
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

    goals(w, by, rest, idle, a.shim_startup)
    print("\n".join(out))


if __name__ == "__main__":
    main()
