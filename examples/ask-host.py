#!/usr/bin/env python3
"""A host's asking loop (docs/control.md "Asking the host", docs/shim.md "Asking the host
from the shim"): reads the questions, asks on the terminal, answers.

    ask-host.py --admin 127.0.0.1:9901 --via agent-wide     a mediator's admin API
    ask-host.py --control /run/user/1000/task.ctl            a shim's --control socket

For each question it prints one line and reads one:

    y            allow it: via --via; with --control and no --via, through a new grant
                 of exactly the host:port asked (plus any --allow-private)
    NAME         allow it via the authority NAME
    n [WORDS]    deny it; WORDS (printable ASCII) are what the client is told
    (end of input: the loop stops; what is still pending times out)

With MEDIATOR_ADMIN_TOKEN set, --admin sends it as the bearer token. Standard library
only.
"""

import argparse
import http.client
import itertools
import json
import os
import socket
import sys


def headers(extra=None):
    h = dict(extra or {})
    token = os.environ.get("MEDIATOR_ADMIN_TOKEN")
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def describe(q):
    labels = []
    if q.get("invocation"):
        labels.append(f"invocation {q['invocation']}")
    labels += [f"{k}={v}" for k, v in sorted((q.get("tags") or {}).items())]
    shown = f" [{', '.join(labels)}]" if labels else ""
    return (f"{q['authority']}{shown} asks for {q['host']}:{q['port']} ({q['protocol']}, "
            f"{q['reason']}: {q['message']}); answer within {q['timeout_s']} s")


def decide(q, args):
    """The answer to `q` from one line of the terminal, or None to leave it."""
    print(describe(q), flush=True)
    print("allow? [y | authority name | n [words]] ", end="", flush=True)
    reply = sys.stdin.readline()
    if not reply:
        print("\n(no more input: stopping)")
        sys.exit(0)
    reply = reply.strip()
    if reply == "n" or reply.startswith("n "):
        return {"deny": reply[2:].strip()}
    if reply == "y" and args.via:
        return {"allow_via": args.via}
    if reply == "y" and args.control:
        grant = {"allow": [f"{q['host']}:{q['port']}"]}
        if args.allow_private:
            grant["allow_private"] = args.allow_private
        return {"allow_via": grant}
    if reply and reply != "y":
        return {"allow_via": reply}
    print("no --via given: name the authority, or n")
    return None


def admin_loop(args):
    conn = http.client.HTTPConnection(args.admin)
    conn.request("GET", "/v1/asks", headers=headers({"Accept": "text/event-stream"}))
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"GET /v1/asks: {resp.status} {resp.read().decode(errors='replace')}")
    for raw in resp:
        line = raw.decode(errors="replace").rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        q = json.loads(line[len("data: "):])
        body = decide(q, args)
        if body is None:
            continue
        post = http.client.HTTPConnection(args.admin, timeout=10)
        post.request("POST", f"/v1/asks/{q['id']}", json.dumps(body),
                      headers({"Content-Type": "application/json"}))
        answer = post.getresponse()
        print(f"-> {answer.status} {answer.read().decode(errors='replace').strip()}", flush=True)
        post.close()


def control_loop(args):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(args.control)
    lines = s.makefile("r", encoding="utf-8", errors="replace")
    # An empty command is refused: its answer says the shim serves this connection, which
    # gets every question from then on (the pending ones first).
    s.sendall(b"{}\n")
    early = []
    for line in lines:
        msg = json.loads(line)
        if "ask" not in msg:
            break
        early.append(msg)
    print(f"waiting for questions on {args.control}", flush=True)
    for msg in itertools.chain(early, (json.loads(line) for line in lines)):
        if "ask" not in msg:
            print(f"-> {json.dumps(msg)}", flush=True)
            continue
        body = decide(msg["ask"], args)
        if body is not None:
            body["answer"] = msg["ask"]["id"]
            s.sendall((json.dumps(body) + "\n").encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--admin", help="a mediator's admin API, host:port")
    where.add_argument("--control", help="a shim's --control socket")
    ap.add_argument("--via", help="the authority 'y' allows through")
    ap.add_argument("--allow-private", action="append", default=[],
                    help="with --control: CIDRs the grant 'y' makes may reach (repeatable)")
    args = ap.parse_args()
    if args.control:
        control_loop(args)
    else:
        admin_loop(args)


if __name__ == "__main__":
    main()
