#!/usr/bin/env python3
"""A host's asking loop (docs/control.md, "Asking the host"): reads the questions of a
running mediator from its admin API's event stream, asks on the terminal, answers.

    ask-host.py --admin 127.0.0.1:9901 --via agent-wide

For each question it prints one line and reads one:

    y            allow it via --via (judged again under that authority)
    NAME         allow it via the authority NAME
    n [WORDS]    deny it; WORDS (printable ASCII) are what the client is told
    (end of input: the loop stops; what is still pending times out)

With MEDIATOR_ADMIN_TOKEN set it sends it as the bearer token. Standard library only.
"""

import argparse
import http.client
import json
import os
import sys


def headers(extra=None):
    h = dict(extra or {})
    token = os.environ.get("MEDIATOR_ADMIN_TOKEN")
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def answer(admin, qid, body):
    conn = http.client.HTTPConnection(admin, timeout=10)
    payload = json.dumps(body)
    conn.request("POST", f"/v1/asks/{qid}", payload, headers({"Content-Type": "application/json"}))
    resp = conn.getresponse()
    text = resp.read().decode(errors="replace").strip()
    conn.close()
    return resp.status, text


def questions(admin):
    """Yields each question of the event stream (the pending ones first)."""
    conn = http.client.HTTPConnection(admin)
    conn.request("GET", "/v1/asks", headers=headers({"Accept": "text/event-stream"}))
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"GET /v1/asks: {resp.status} {resp.read().decode(errors='replace')}")
    for raw in resp:
        line = raw.decode(errors="replace").rstrip("\r\n")
        if line.startswith("data: "):
            yield json.loads(line[len("data: "):])


def describe(q):
    who = q["authority"]
    labels = []
    if q.get("invocation"):
        labels.append(f"invocation {q['invocation']}")
    labels += [f"{k}={v}" for k, v in sorted(q.get("tags", {}).items())]
    shown = f" [{', '.join(labels)}]" if labels else ""
    return (f"{who}{shown} asks for {q['host']}:{q['port']} ({q['protocol']}, "
            f"{q['reason']}: {q['message']}); answer within {q['timeout_s']} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--admin", required=True, help="the admin API's host:port")
    ap.add_argument("--via", help="the authority 'y' allows through")
    args = ap.parse_args()
    for q in questions(args.admin):
        print(describe(q), flush=True)
        print("allow? [y | authority name | n [words]] ", end="", flush=True)
        reply = sys.stdin.readline()
        if not reply:
            print("\n(no more input: stopping)")
            return
        reply = reply.strip()
        if reply == "y" and args.via:
            body = {"allow_via": args.via}
        elif reply == "n" or reply.startswith("n "):
            body = {"deny": reply[2:].strip()}
        elif reply and reply != "y":
            body = {"allow_via": reply}
        else:
            print("no --via given: name the authority, or n")
            continue
        status, text = answer(args.admin, q["id"], body)
        print(f"-> {status} {text}", flush=True)


if __name__ == "__main__":
    main()
