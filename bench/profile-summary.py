#!/usr/bin/env python3
"""Summarises a callgrind profile of bench/tls-profile.sh as Markdown: the instructions
per request by component (a Rust crate, the standard library, a shared library, the
program itself) and the functions with the most instructions of their own, and, with
--ours PREFIX, the functions whose name starts with PREFIX by their inclusive count.

    profile-summary.py --file mediator.callgrind --requests 38120 [--top 25] [--ours mediator::]

Counts come from `callgrind_annotate --threshold=100`. A profile whose counters were zeroed
while threads ran (`callgrind_control -z`) charges the frames that were on the stack then
with their callees' cost as if it were their own (`clone`, `start_thread`, a runtime's
`block_on`): no function does half of a program's work by itself, so those are left out.
"""

import argparse
import re
import subprocess

LINE = re.compile(r"^\s*([0-9,]+)\s+\(\s*[0-9.]+%\)\s+(.*)$")
CRATE = re.compile(r"/index\.crates\.io-[^/]+/([A-Za-z0-9_-]+?)-\d[^/]*/")
STD = re.compile(r"/rustc/[0-9a-f]+/library/")


def rows(path, inclusive):
    out = subprocess.run(
        ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}", "--threshold=100", "--auto=no", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total, found = None, []
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        cost, what = int(m.group(1).replace(",", "")), m.group(2)
        if what.strip() == "PROGRAM TOTALS":
            total = cost
            continue
        found.append((cost, what))
    return total, found


def split(what):
    """(file, function, object) of `file:function [object]`."""
    obj = ""
    m = re.search(r" \[([^\]]+)\]$", what)
    if m:
        obj, what = m.group(1), what[: m.start()]
    file, _, function = what.partition(":")
    return file, function or what, obj


OURS = re.compile(r"(?:^|/)(mediator|policy|certs|gss|bench)/src/")


def component(file, obj):
    """Where an instruction's code comes from: a crate of crates.io, the Rust standard
    library (inlined code counts where it was written), one of ours, else the object."""
    m = CRATE.search(file)
    if m:
        return m.group(1)
    if STD.search(file):
        return "Rust standard library"
    m = OURS.search(file)
    if m:
        return f"{m.group(1)} (ours)"
    if not obj and file.startswith("./"):
        return "libc"  # glibc's sources, as its debug information names them
    base = (obj or file).rsplit("/", 1)[-1]
    return re.sub(r"\.so(\.[0-9.]+)?$", "", base) or "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--ours", default="")
    args = ap.parse_args()
    n = max(args.requests, 1)
    total, own = rows(args.file, inclusive=False)
    own = [(c, w) for c, w in own if c <= total / 2]
    print(f"{total // n:,} instructions per request in all ({args.requests:,} requests).\n")
    by = {}
    for cost, what in own:
        file, _, obj = split(what)
        key = component(file, obj)
        by[key] = by.get(key, 0) + cost
    print("| component | instructions per request | share |\n|---|---:|---:|")
    for key, cost in sorted(by.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {key} | {cost // n:,} | {100 * cost / total:.1f}% |")
    print("\n| function (its own instructions) | component | per request | share |\n|---|---|---:|---:|")
    for cost, what in own[: args.top]:
        file, function, obj = split(what)
        name = function.replace("|", "\\|")
        print(f"| `{name}` | {component(file, obj)} | {cost // n:,} | {100 * cost / total:.1f}% |")
    if args.ours:
        _, incl = rows(args.file, inclusive=True)
        seen, listed = set(), 0
        print(f"\n| `{args.ours}` function (with what it calls) | per request | share |\n|---|---:|---:|")
        for cost, what in incl:
            _, function, _ = split(what)
            if not function.startswith(args.ours) or cost > total or function in seen:
                continue
            seen.add(function)
            print(f"| `{function.replace('|', chr(92) + '|')}` | {cost // n:,} | {100 * cost / total:.1f}% |")
            listed += 1
            if listed >= args.top:
                break


if __name__ == "__main__":
    main()
