#!/usr/bin/env python3
"""Turns what bench/anchors.sh measured into one Markdown table, the mediator beside the
limit anchors (HAProxy, microsocks, Dante, tinyproxy, `unshare`, a bare tar) with the
ratios, then the goals of the issue "Performance against the limit anchors", each met or
missed. Each figure is the median over the repetitions (every repetition's value in
brackets when there are several); a ratio is the ratio of the medians."""

import argparse
import json
import os
import statistics
import subprocess
import time


def load_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def fx(r):
    return "–" if r is None else f"{r:.2f}x"


def num(x, digits=0):
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


class Cells:
    """The load runs by (part, label, mode, concurrency)."""

    def __init__(self, rows):
        self.rows = rows

    def runs(self, part, label, mode=None, c=None):
        return [
            r
            for r in self.rows
            if r.get("part") == part
            and r.get("label") == label
            and (mode is None or r.get("mode") == mode)
            and (c is None or r.get("concurrency") == c)
        ]

    def med(self, key, *sel):
        return median([r.get(key) for r in self.runs(*sel)])

    def reps(self, key, *sel, digits=0):
        vals = [r.get(key) for r in self.runs(*sel) if r.get(key) is not None]
        if len(vals) < 2:
            return ""
        return " (" + " / ".join(num(v, digits) for v in vals) + ")"

    def errors(self, *sel):
        return sum(r.get("errors", 0) for r in self.runs(*sel))


class Report:
    def __init__(self):
        self.table = []
        self.goals = []
        self.notes = []

    def row(self, work, anchor, mediator, ratios):
        self.table.append((work, anchor, mediator, ratios))

    def goal(self, name, measured, r, target, ok):
        if r is None:
            state = "no data"
        else:
            state = "met" if ok(r) else "**missed**"
        self.goals.append((name, measured, fx(r), target, state))


def throughput(cells, rep):
    part = "throughput"
    h = (cells.med("mib_s", part, "haproxy"), cells.med("proxy_cpu_per_gib", part, "haproxy"))
    if h[0] is None:
        return
    m = {
        ch: (cells.med("mib_s", part, f"mediator-{ch}"), cells.med("proxy_cpu_per_gib", part, f"mediator-{ch}"))
        for ch in ("tcp", "unix")
    }
    rep.row(
        "one-tunnel throughput (HAProxy: TCP mode, splice-auto, the same origin)",
        f"{num(h[0])} MiB/s{cells.reps('mib_s', part, 'haproxy')}, CPU {num(h[1], 3)} s/GiB",
        "; ".join(
            f"{ch.upper() if ch == 'tcp' else 'Unix'} {num(v[0])} MiB/s{cells.reps('mib_s', part, f'mediator-{ch}')}, {num(v[1], 3)} s/GiB"
            for ch, v in m.items()
        ),
        "; ".join(
            f"{'TCP' if ch == 'tcp' else 'Unix'} {fx(ratio(v[0], h[0]))}, CPU {fx(ratio(v[1], h[1]))}"
            for ch, v in m.items()
        ),
    )
    for ch, v in m.items():
        name = "TCP" if ch == "tcp" else "Unix socket"
        rep.goal(
            f"one-tunnel throughput, {name}, >= 0.9x HAProxy",
            f"{num(v[0])} vs {num(h[0])} MiB/s",
            ratio(v[0], h[0]),
            ">= 0.9x",
            lambda r: r >= 0.9,
        )


def socks(cells, rep):
    """SOCKS5 tunnels/s: the Unix socket (no authentication) against the best of
    microsocks and Dante without it; TCP with RFC 1929 username/password against
    microsocks doing the same sub-negotiation (like for like: one round trip more)."""
    part, mode = "socks", "socks-rate"
    for c, goal in ((1, 1.0), (32, 1.2)):
        anchors = {a: cells.med("rate", part, a, mode, c) for a in ("microsocks", "dante", "microsocks-auth")}
        plain = {a: v for a, v in anchors.items() if a != "microsocks-auth" and v is not None}
        if not plain:
            continue
        best_name, best = max(plain.items(), key=lambda x: x[1])
        auth = anchors["microsocks-auth"]
        med = {
            ch: (cells.med("rate", part, f"mediator-{ch}", mode, c), cells.med("proxy_cpu_per_1000", part, f"mediator-{ch}", mode, c))
            for ch in ("unix", "tcp")
        }
        cpu = {a: cells.med("proxy_cpu_per_1000", part, a, mode, c) for a in anchors}
        tcp_ratio = f"TCP+auth {fx(ratio(med['tcp'][0], auth))} microsocks+auth" if auth is not None else "TCP+auth –"
        rep.row(
            f"SOCKS5 tunnels/s, c={c} (greeting, request, GET, close)",
            ", ".join(
                f"{a.replace('-auth', '+auth')} {num(v)}/s{cells.reps('rate', part, a, mode, c)} (CPU {num(cpu[a], 3)} s/1k)"
                for a, v in anchors.items()
                if v is not None
            ),
            f"Unix {num(med['unix'][0])}/s{cells.reps('rate', part, 'mediator-unix', mode, c)} (CPU {num(med['unix'][1], 3)}), "
            f"TCP+auth {num(med['tcp'][0])}/s{cells.reps('rate', part, 'mediator-tcp', mode, c)} (CPU {num(med['tcp'][1], 3)})",
            f"Unix {fx(ratio(med['unix'][0], best))} the best ({best_name}); {tcp_ratio}",
        )
        judged = [("unix", "Unix socket", "the best of microsocks and Dante", f"{best_name} {num(best)}", best)]
        if auth is not None:
            judged.append(("tcp", "TCP with username/password", "microsocks with the same", num(auth), auth))
        for ch, name, against, shown, anchor in judged:
            rep.goal(
                f"SOCKS5 c={c}, {name}, >= {goal:.1f}x {against}",
                f"{num(med[ch][0])} vs {shown}/s",
                ratio(med[ch][0], anchor),
                f">= {goal:.1f}x",
                lambda r, g=goal: r >= g,
            )


def tls(cells, rep):
    part = "tls"
    per_1k = {}
    for mode, name, goal_rate, goal_cpu in (
        ("keepalive", "keep-alive requests/s", 1.0, 1.0),
        ("new", "new connections/s (full handshakes)", 1.2, 0.8),
    ):
        h = (cells.med("rate", part, "haproxy", mode), cells.med("proxy_cpu_s_per_1000", part, "haproxy", mode))
        m = (cells.med("rate", part, "mediator", mode), cells.med("proxy_cpu_s_per_1000", part, "mediator", mode))
        if h[0] is None and m[0] is None:
            continue
        rep.row(
            f"TLS termination, {name}, c=8 (HAProxy: HTTP mode, verified TLS to the same nginx origin, http-reuse always)",
            f"{num(h[0])}/s{cells.reps('rate', part, 'haproxy', mode)}, CPU {num(h[1], 3)} s/1k",
            f"{num(m[0])}/s{cells.reps('rate', part, 'mediator', mode)}, CPU {num(m[1], 3)} s/1k",
            f"{fx(ratio(m[0], h[0]))}, CPU {fx(ratio(m[1], h[1]))}",
        )
        short = "keep-alive" if mode == "keepalive" else "new connections"
        rep.goal(
            f"TLS termination {short} >= {goal_rate:.1f}x HAProxy",
            f"{num(m[0])} vs {num(h[0])}/s",
            ratio(m[0], h[0]),
            f">= {goal_rate:.1f}x",
            lambda r, g=goal_rate: r >= g,
        )
        rep.goal(
            f"TLS termination {short}, CPU per 1k <= {goal_cpu:.1f}x HAProxy",
            f"{num(m[1], 3)} vs {num(h[1], 3)} s",
            ratio(m[1], h[1]),
            f"<= {goal_cpu:.1f}x",
            lambda r, g=goal_cpu: r <= g,
        )
        for label in ("haproxy", "mediator"):
            runs = cells.runs(part, label, mode)
            acc = sum(r.get("origin_accepts", 0) for r in runs)
            req = sum(r.get("origin_requests", 0) for r in runs)
            per_1k[(label, mode)] = acc * 1000 / req if req > 0 else None
    if per_1k:
        g = per_1k.get
        rep.row(
            "upstream TLS connections nginx accepted per 1,000 requests (keep-alive; new)",
            f"HAProxy {num(g(('haproxy', 'keepalive')), 1)}; {num(g(('haproxy', 'new')), 1)}",
            f"{num(g(('mediator', 'keepalive')), 1)}; {num(g(('mediator', 'new')), 1)}",
            "–",
        )


def connect(cells, rep):
    part, mode, c = "connect", "connect-rate", 32
    t = (cells.med("rate", part, "tinyproxy", mode, c), cells.med("proxy_cpu_per_1000", part, "tinyproxy", mode, c))
    if t[0] is None:
        return
    m = {
        ch: (cells.med("rate", part, f"mediator-{ch}", mode, c), cells.med("proxy_cpu_per_1000", part, f"mediator-{ch}", mode, c))
        for ch in ("tcp", "unix")
    }
    rep.row(
        "CONNECT tunnels/s, c=32",
        f"tinyproxy {num(t[0])}/s{cells.reps('rate', part, 'tinyproxy', mode, c)}, CPU {num(t[1], 3)} s/1k",
        "; ".join(
            f"{'TCP+auth' if ch == 'tcp' else 'Unix'} {num(v[0])}/s{cells.reps('rate', part, f'mediator-{ch}', mode, c)}, {num(v[1], 3)} s/1k"
            for ch, v in m.items()
        ),
        "; ".join(
            f"{'TCP' if ch == 'tcp' else 'Unix'} {fx(ratio(v[0], t[0]))}, CPU {fx(ratio(v[1], t[1]))}"
            for ch, v in m.items()
        ),
    )
    for ch, goal in (("tcp", 1.1), ("unix", 1.25)):
        rep.goal(
            f"CONNECT c=32 over {'TCP' if ch == 'tcp' else 'the Unix socket'} >= {goal}x tinyproxy",
            f"{num(m[ch][0])} vs {num(t[0])}/s",
            ratio(m[ch][0], t[0]),
            f">= {goal}x",
            lambda r, g=goal: r >= g,
        )


def hyperfine(path):
    """{command name: (median ms, runs)} of a hyperfine JSON export."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["command"]: (r["median"] * 1000, len(r.get("times", []))) for r in json.load(f)["results"]}


def start(work, rep):
    s = hyperfine(os.path.join(work, "start.json"))
    if not s:
        return
    base = s.get("unshare", (None, 0))[0]
    cap = s.get("shim", (None, 0))[0]
    nocap = s.get("shim --no-capture", (None, 0))[0]
    runs = s.get("shim", (None, 0))[1]
    rep.row(
        f"shim start, `-- true` (hyperfine, {runs} runs, medians)",
        f"`unshare -Urnmpf true` {num(base, 2)} ms",
        f"{num(cap, 2)} ms with capture (the default); {num(nocap, 2)} ms without",
        f"{fx(ratio(cap, base))}; {fx(ratio(nocap, base))}",
    )
    rep.goal(
        "shim start with capture <= 3x unshare",
        f"{num(cap, 2)} vs {num(base, 2)} ms",
        ratio(cap, base),
        "<= 3x",
        lambda r: r <= 3,
    )
    rep.goal(
        "shim start without capture <= 3x unshare",
        f"{num(nocap, 2)} vs {num(base, 2)} ms",
        ratio(nocap, base),
        "<= 3x",
        lambda r: r <= 3,
    )


def unpack(work, rep, files):
    for fs in ("disk", "tmpfs"):
        for cache in ("warm", "cold"):
            u = hyperfine(os.path.join(work, f"unpack-{fs}-{cache}.json"))
            if not u:
                continue
            tar = u.get("tar", (None, 0))[0]
            shim = u.get("shim tar", (None, 0))[0]
            viol = u.get("shim tar --violations", (None, 0))[0]
            runs = u.get("tar", (None, 0))[1]
            rep.row(
                f"unpacking {files:,} files in a write root, {fs}, {cache} ({runs} runs, medians)",
                f"bare tar {num(tar, 1)} ms",
                f"shim {num(shim, 1)} ms; with `--violations` {num(viol, 1)} ms",
                f"{fx(ratio(shim, tar))}; {fx(ratio(viol, shim))} over the shim alone",
            )
            rep.goal(
                f"`--violations` <= 1.2x the shim alone, {fs}, {cache}",
                f"{num(viol, 1)} vs {num(shim, 1)} ms",
                ratio(viol, shim),
                "<= 1.2x",
                lambda r: r <= 1.2,
            )


def load_line(path, rows):
    """The machine's load in words: the load averages (1, 5, 15 min) at the start and the
    end, and the 1-minute one as the load runs started (median, range). The machine may be
    shared: a figure taken under load is low for every program alike, so the ratios of one
    run hold better than its absolute rates."""
    ends = {}
    if path and os.path.exists(path):
        with open(path) as f:
            ends = dict(line.strip().split(" ", 1) for line in f if " " in line)
    runs = [r["load1"] for r in rows if isinstance(r.get("load1"), (int, float))]
    words = [f"load average (1, 5, 15 min) {ends[k]} at the {k}" for k in ("start", "end") if k in ends]
    if runs:
        words.append(f"1-minute load as the load runs started: median {statistics.median(runs):.2f} ({min(runs):.2f}..{max(runs):.2f})")
    return "; ".join(words) if words else "load average not recorded"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--versions")
    ap.add_argument("--loads")
    ap.add_argument("--settings", default="")
    ap.add_argument("--files", type=int, default=0)
    args = ap.parse_args()
    cells = Cells(load_lines(args.results))
    rep = Report()
    throughput(cells, rep)
    socks(cells, rep)
    tls(cells, rep)
    connect(cells, rep)
    start(args.work, rep)
    unpack(args.work, rep, args.files)

    versions = {}
    if args.versions and os.path.exists(args.versions):
        with open(args.versions) as f:
            versions = dict(line.strip().split("=", 1) for line in f if "=" in line)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print("# The limit anchors (bench/anchors.sh)\n")
    print(f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {rev}; {os.cpu_count()} cores")
    print("- " + load_line(args.loads, cells.rows))
    if "mediator" in versions and not versions["mediator"].startswith(rev):
        print(f"- the mediator measured: {versions['mediator']}")
    print("- " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "mediator"))
    print(f"- {args.settings}")
    print("- loopback only; the load generator, the proxy and the origin share the cores\n")
    print("| work | anchor | mediator | ratio |")
    print("|---|---|---|---|")
    for r in rep.table:
        print("| " + " | ".join(r) + " |")
    errors = {
        (r["part"], r["label"], r.get("mode"), r.get("concurrency")): r.get("first_error")
        for r in cells.rows
        if r.get("errors")
    }
    if errors:
        print("\nRuns with errors (the first error of each):\n")
        for (p, label, mode, c), e in sorted(errors.items(), key=str):
            print(f"- {p} {label} {mode} c={c}: {e}")
    print("\n## Goals\n")
    print("| goal | measured | ratio | target | state |")
    print("|---|---|---:|---|---|")
    for g in rep.goals:
        print("| " + " | ".join(g) + " |")
    met = sum(1 for g in rep.goals if g[4] == "met")
    print(f"\n{met} of {len(rep.goals)} goals met.")


if __name__ == "__main__":
    main()
