#!/usr/bin/env python3
"""The structure gates of ARCHITECTURE.md that the compiler does not check.

    python3 .ci/structure.py            check both; exit 1 on a breach
    python3 .ci/structure.py --list     also print every long function and every upward import

1. Function budgets. Clippy's `too_many_lines` (clippy.toml: 100) makes a long function carry
   `#[expect(clippy::too_many_lines, reason = "...; ceiling N lines")]`. Here each such
   function is measured (lines from its `fn` to its closing brace, as
   ../shared/tools/fnlen.py counts them) and must be at most its ceiling; the ceiling at
   most 150; and a production function over 100 lines must carry one. A function that
   grows past its ceiling fails CI, and so does one that shrank under it (lower the
   ceiling to its length: a ceiling is the length it has, never room to grow).
   Test code (`#[cfg(test)]` items, `*tests*.rs`, test folders) is not measured; a crate
   in LISTED_ONLY would be listed, not gated (none is).

2. Imports that point up. The table "`mediator/src`, bottom to top" of ARCHITECTURE.md
   gives every file of mediator/src a floor. A file that names an item of a file on a
   higher floor (`crate::...`/`super::...` paths and `crate::name!` macros, outside
   comments and test code) is an upward import. Each must be listed under "Imports that
   point up" in ARCHITECTURE.md as `from.rs` -> `to.rs`, and there may be at most 2.
   Only `#[cfg(test)]` items are left out of a file, wherever they stand: production code
   after a test module is read too.

3. File sizes. No production file over 600 lines.

4. Where unit tests sit (ARCHITECTURE.md's rule): in the file, in one `#[cfg(test)] mod
   tests`, while under 150 lines and the file with them under 550; otherwise in a sibling
   `name_tests.rs` (`#[path]`), or the folder's `tests.rs` for a `mod.rs`.
"""
from __future__ import annotations

import os
import re
import sys

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# Production code; `tests/src` is the end-to-end suite's support crate (test code).
CRATES = ["policy/src", "certs/src", "gss/src", "mediator/src", "shim/src", "bench/src"]
# Crates whose functions are listed but do not fail the gate (while one is reworked).
LISTED_ONLY: tuple[str, ...] = ()
LIMIT, HARD = 100, 150
MAX_UP = 2

FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)')
CEILING = re.compile(r"ceiling (\d+) lines")


def strip(line: str, state: dict) -> str:
    """One line without string, char and comment content (block comments carry over)."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"] = False
            i = j + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] = True
            i += 2
            continue
        if c == '"':
            i += 1
            while i < n and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
            continue
        if c == "'" and i + 2 < n and (line[i + 2] == "'" or (line[i + 1] == "\\" and "'" in line[i + 2:i + 6])):
            k = line.find("'", i + 2 if line[i + 1] != "\\" else i + 3)
            i = k + 1 if k > 0 else i + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def item_end(clean: list[str], i: int) -> int | None:
    """The line where the item starting at line i closes its braces (None: a declaration)."""
    depth, started, j = 0, False, i
    while j < len(clean):
        depth += clean[j].count("{") - clean[j].count("}")
        if "{" in clean[j]:
            started = True
        if not started and clean[j].rstrip().endswith(";"):
            return None
        if started and depth <= 0:
            return j
        j += 1
    return None


def functions(path: str):
    """(name, first line, length, ceiling or None, has an allowance) of each production fn."""
    lines = open(path, encoding="utf-8").read().split("\n")
    state = {"block": False}
    clean = [strip(line, state) for line in lines]
    i = 0
    while i < len(lines):
        if "#[cfg(test)]" in lines[i]:
            end = item_end(clean, i + 1)
            i = (end if end is not None else i) + 1
            continue
        m = FN.match(lines[i])
        if m:
            end = item_end(clean, i)
            if end is not None:
                # The attributes above the fn: its allowance and ceiling, if any.
                k, attrs = i - 1, []
                while k >= 0 and (lines[k].strip().startswith(("#[", "///", ")]", "reason", "clippy::"))
                                  or lines[k].strip().startswith('"')):
                    attrs.append(lines[k])
                    k -= 1
                text = " ".join(attrs)
                allowed = "too_many_lines" in text
                c = CEILING.search(text)
                yield m.group(7), i + 1, end - i + 1, int(c.group(1)) if c else None, allowed
        i += 1


def production_files():
    for crate in CRATES:
        for root, dirs, files in os.walk(os.path.join(TOP, crate)):
            dirs[:] = [d for d in dirs if d != "tests"]
            for f in sorted(files):
                if f.endswith(".rs") and "tests" not in f and f != "testing.rs":
                    yield os.path.join(root, f)


def budgets(listing: bool) -> list[str]:
    errors = []
    for path in production_files():
        rel = os.path.relpath(path, TOP)
        sink = [] if rel.startswith(LISTED_ONLY) else errors
        for name, line, length, ceiling, allowed in functions(path):
            where = f"{rel}:{line} {name}"
            if listing and length > LIMIT:
                print(f"  {length:4d} lines (ceiling {ceiling}) {where}")
            if allowed and ceiling is None:
                sink.append(f"{where}: its too_many_lines allowance names no `ceiling N lines`")
            elif ceiling is not None and length > ceiling:
                sink.append(f"{where}: {length} lines, over its ceiling of {ceiling}: split it")
            elif ceiling is not None and length < ceiling:
                sink.append(f"{where}: {length} lines, under its ceiling of {ceiling}: lower it")
            elif ceiling is not None and ceiling > HARD:
                sink.append(f"{where}: a ceiling of {ceiling} is over {HARD}: split it")
            elif ceiling is None and length > LIMIT:
                sink.append(f"{where}: {length} lines and no ceiling: split it under {LIMIT}")
    return errors


# ---- imports that point up ----

def module_files(src: str) -> dict[tuple, str]:
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]):
                parts = []
            mods[tuple(parts)] = rel
    return mods


def expand_use(tree: str) -> list[str]:
    """'crate::{a::{b, c}, d}' -> ['crate::a::b', 'crate::a::c', 'crate::d']."""
    tree = re.sub(r"\s+", "", tree)
    out: list[str] = []

    def rec(prefix: str, s: str):
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for it in items:
            if not it:
                continue
            if "{" in it:
                head, rest = it.split("{", 1)
                rec(prefix + head, rest[:-1] if rest.endswith("}") else rest)
            else:
                out.append(prefix + it.split(" as ")[0])

    rec("", tree)
    return out


def code_of(text: str) -> str:
    """The production code of a file, comments removed: each `#[cfg(test)]` item (a test
    module, a test-only import or function) is left out wherever it stands, and only it."""
    lines = text.split("\n")
    state = {"block": False}
    clean = [strip(line, state) for line in lines]
    keep, i = [], 0
    while i < len(lines):
        here = clean[i].strip()
        if not here.startswith("#[cfg(test)]"):
            keep.append(lines[i])
            i += 1
            continue
        # The item starts on this line after the attribute, or after the attributes below.
        j = i if here[len("#[cfg(test)]"):].strip() else i + 1
        while j < len(lines) and j > i and clean[j].strip().startswith("#["):
            j += 1
        end = item_end(clean, j) if j < len(lines) else None
        i = (end if end is not None else j) + 1
    state = {"block": False}
    return "\n".join(strip_comments(line, state) for line in keep)


def strip_comments(line: str, state: dict) -> str:
    if state["block"]:
        j = line.find("*/")
        if j < 0:
            return ""
        state["block"] = False
        line = line[j + 2:]
    line = re.sub(r"/\*.*?\*/", "", line)
    if "/*" in line:
        state["block"] = True
        line = line[: line.index("/*")]
    i = line.find("//")
    # `//` inside a string (a URL) is not a comment; good enough: only when no quote follows
    if i >= 0 and line[:i].count('"') % 2 == 0:
        line = line[:i]
    return line


def resolve(path: str, here: tuple, mods: dict) -> tuple | None:
    segs = path.split("::")
    if segs[0] == "crate":
        base: list = []
        segs = segs[1:]
    else:
        base = list(here)
        while segs and segs[0] == "super":
            if not base:
                return None
            base.pop()
            segs = segs[1:]
    cand = tuple(base + segs)
    while cand and cand not in mods:
        cand = cand[:-1]
    return cand if cand in mods else None


def upward(listing: bool) -> list[str]:
    src = os.path.join(TOP, "mediator/src")
    arch = open(os.path.join(TOP, "ARCHITECTURE.md"), encoding="utf-8").read()
    section = arch.split("## `mediator/src`, bottom to top")[1].split("\n## ")[0]
    floors: dict[str, tuple[int, str]] = {}
    floor = 0
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| layer"):
            continue
        cells = line.split("|")
        for f in re.findall(r"`([a-z_0-9/]+\.rs)`", cells[2]):
            floors.setdefault(f, (floor, cells[1].strip()))
        floor += 1
    named = set(re.findall(r"`([a-z_0-9/]+\.rs)` -> `([a-z_0-9/]+\.rs)`",
                           section.split("Imports that point up")[-1] if "Imports that point up" in section else ""))
    mods = module_files(src)
    macros = {}
    for m, rel in mods.items():
        text = open(os.path.join(src, rel), encoding="utf-8").read()
        for name in re.findall(r"#\[macro_export\]\s*macro_rules!\s*(\w+)", text):
            macros[name] = m
    errors, found = [], []
    for m, rel in sorted(mods.items()):
        if not m or rel.endswith("tests.rs") or rel == "testing.rs":
            continue
        code = code_of(open(os.path.join(src, rel), encoding="utf-8").read())
        paths = []
        for u in re.finditer(r"\buse\s+((?:crate|super)(?:::)?[^;]*);", code):
            paths += expand_use(u.group(1))
        paths += re.findall(r"\b((?:crate|super)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))+)", code)
        targets: dict[tuple, set] = {}
        for p in paths:
            t = resolve(p, m, mods)
            if t is None or t == m or t[: len(m)] == m or m[: len(t)] == t or not t:
                continue
            targets.setdefault(t, set()).add(p.split("::")[-1])
        for name in re.findall(r"\$?crate::(\w+)!", code):
            if name in macros and macros[name] != m:
                targets.setdefault(macros[name], set()).add(name + "!")
        for t, why in targets.items():
            to = mods[t]
            if rel not in floors:
                errors.append(f"mediator/src/{rel} has no floor in ARCHITECTURE.md's layer table")
                break
            if to not in floors:
                continue
            if floors[rel][0] < floors[to][0]:
                found.append((rel, to, sorted(why)))
    for rel, to, why in sorted(found):
        if listing:
            print(f"  {rel} ({floors[rel][1]}) -> {to} ({floors[to][1]}): {', '.join(why)}")
        if (rel, to) not in named:
            errors.append(f"mediator/src/{rel} -> {to} points up ({', '.join(why)}) and is not named in ARCHITECTURE.md")
    print(f"upward imports in mediator/src: {len(found)}")
    if len(found) > MAX_UP:
        errors.append(f"{len(found)} upward imports in mediator/src; at most {MAX_UP}")
    return errors


# ---- file sizes and where unit tests sit ----

MAX_FILE, INLINE_TESTS, WITH_TESTS = 600, 150, 550
TEST_MOD = re.compile(r"^\s*mod\s+(\w+)\s*(\{|;)")


def lines_of(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def placement() -> list[str]:
    errors = []
    for crate in CRATES:
        for root, _, files in os.walk(os.path.join(TOP, crate)):
            for f in sorted(files):
                if not f.endswith(".rs"):
                    continue
                path = os.path.join(root, f)
                rel = os.path.relpath(path, TOP)
                text = lines_of(path)
                if f.endswith("_tests.rs") or f == "tests.rs":
                    host = os.path.join(root, "mod.rs" if f == "tests.rs" else f[: -len("_tests.rs")] + ".rs")
                    if not os.path.exists(host):
                        errors.append(f"{rel}: no {os.path.relpath(host, TOP)} beside it")
                    elif len(text) < INLINE_TESTS and len(text) + len(lines_of(host)) < WITH_TESTS:
                        errors.append(f"{rel}: {len(text)} lines; they fit in {os.path.basename(host)} (mod tests)")
                    continue
                if "tests" not in f and f != "testing.rs" and "/tests/" not in rel and len(text) > MAX_FILE:
                    errors.append(f"{rel}: {len(text)} lines, over {MAX_FILE}: split it")
                state = {"block": False}
                clean = [strip(line, state) for line in text]
                for i, line in enumerate(text):
                    m = TEST_MOD.match(line)
                    k = i - 1
                    while k >= 0 and text[k].strip().startswith("#["):
                        k -= 1
                    if not m or not any("cfg(test)" in text[j] for j in range(k + 1, i)):
                        continue
                    if m.group(2) == "{" and m.group(1) != "tests":
                        errors.append(f"{rel}:{i + 1}: a test module named {m.group(1)}: one `mod tests`")
                    if m.group(2) == "{":
                        end = item_end(clean, i)
                        n = (end - i + 1) if end is not None else 0
                        if n >= INLINE_TESTS or len(text) >= WITH_TESTS:
                            errors.append(f"{rel}:{i + 1}: {n} lines of tests in a {len(text)}-line file: a sibling file")
    return errors


def main() -> int:
    listing = "--list" in sys.argv[1:]
    errors = budgets(listing) + upward(listing) + placement()
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
