#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/ from the repository's test tables.

Host and pattern seeds are the first string of each row of the policy crate's tables
(policy/src/host_tests.rs, pattern_tests.rs), a sample of them; the others are the
shapes the unit and end-to-end tests use (request heads, SOCKS5 exchanges, ClientHellos
built like mediator/src/sni.rs's test builder, PAC answers, config files from examples/,
admin bodies). Seeds are named `seed-<what>`; files a fuzzing run adds are named by their
SHA-1 and ignored by git (fuzz/.gitignore). Run it from anywhere; it only (re)writes
`seed-*` files:

    python3 fuzz/seeds.py
"""

import base64
import hashlib
import json
import pathlib
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
# At most this many rows per table: the corpus stays small (tens of files per target).
PER_TABLE = 40

ESCAPE = re.compile(r"\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)")


def unescape(s):
    """A Rust string literal's body as text."""

    def one(m):
        e = m.group(1)
        if e.startswith("u{"):
            return chr(int(e[2:-1], 16))
        if e.startswith("x"):
            return chr(int(e[1:], 16))
        return {"n": "\n", "r": "\r", "t": "\t", "0": "\0"}.get(e, e)

    return ESCAPE.sub(one, s)


def table(path, const):
    """The first string of every row of `const NAME: &[...] = &[ ... ];` in `path`."""
    text = (ROOT / path).read_text()
    start = text.index(f"const {const}")
    end = text.index("\n];", start)
    rows = re.findall(r'\(\s*"((?:[^"\\]|\\.)*)"', text[start:end])
    return [unescape(r) for r in rows]


def sample(rows):
    """At most PER_TABLE rows, spread over the table."""
    if len(rows) <= PER_TABLE:
        return rows
    step = len(rows) / PER_TABLE
    return [rows[int(i * step)] for i in range(PER_TABLE)]


def write(target, seeds):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("seed-*"):
        old.unlink()
    for name, data in seeds:
        if isinstance(data, str):
            data = data.encode()
        (d / f"seed-{name}").write_bytes(data)


def numbered(prefix, items):
    return [(f"{prefix}-{i:02}", x) for i, x in enumerate(items)]


# ---- policy tables ---------------------------------------------------------------------

hosts = sample(table("policy/src/host_tests.rs", "HOSTS"))
write("host", numbered("hosts", hosts))

entries = sample(table("policy/src/pattern_tests.rs", "PARSE"))
probes = "\n".join(
    [
        "example.com:443",
        "a.example.com:443",
        "a.b.example.com:8443",
        "203.0.113.7:443",
        "[2001:db8::1]:443",
        "10.1.2.3:22",
        "xn--bcher-kva.example:443",
    ]
)
write("pattern", numbered("parse", [f"{e}\n{probes}" for e in entries]))

# ---- HTTP heads --------------------------------------------------------------------------

auth = "Proxy-Authorization: Basic " + base64.b64encode(b"agent-a:secret").decode()
heads = {
    "connect": "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    "connect-auth-early-bytes": f"CONNECT a.test:443 HTTP/1.1\r\n{auth}\r\n\r\n\x16\x03",
    "connect-ipv6": "CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n",
    "connect-url": "CONNECT http://a.test:443/ HTTP/1.1\r\n\r\n",
    "connect-no-port": "CONNECT a.test HTTP/1.1\r\n\r\n",
    "connect-userinfo": "CONNECT user:pw@a.test:443 HTTP/1.1\r\n\r\n",
    "connect-crlf-target": "CONNECT a b c\x01\r\nProxy-Authorization: Basic eA==\r\n\r\n",
    "absolute-form": "GET http://example.com/path?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n",
    "absolute-form-port": "GET http://Example.COM.:8080/ HTTP/1.1\r\n\r\n",
    "absolute-form-bad-port": "GET http://a.test:80a/ HTTP/1.1\r\n\r\n",
    "absolute-form-userinfo": "GET http://u:p@a.test/ HTTP/1.1\r\n\r\n",
    "absolute-form-ipv4-odd": "GET http://127.1/ HTTP/1.1\r\n\r\n",
    "origin-form": "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
    "incomplete": "GET http://a.test/ HTTP/1.1\r\nHost: a",
    "bad-uri": "GET http://a b/ HTTP/1.1\r\n\r\n",
    "nul": "GET http://a.test/\x00 HTTP/1.1\r\n\r\n",
    "many-headers": "GET http://a.test/ HTTP/1.1\r\n" + "X: y\r\n" * 101 + "\r\n",
}
write("http_head", list(heads.items()))

# ---- Basic credentials -------------------------------------------------------------------


def basic(pair):
    return b"Basic " + base64.b64encode(pair)


write(
    "basic",
    [
        ("ok", basic(b"agent-a:secret")),
        ("colon-in-token", basic(b"agent-a:tok:en")),
        ("empty-token", basic(b"agent-a:")),
        ("no-colon", basic(b"no-colon")),
        ("not-utf8-name", basic(b"\xff:x")),
        ("bearer", b"Bearer abc"),
        ("bad-base64", b"Basic !!!"),
        ("scheme-only", b"Basic"),
        ("scheme-case", b"bAsIc YTpi"),
        ("padding-spaces", b"Basic   YTpi  "),
    ],
)

# ---- SOCKS5 --------------------------------------------------------------------------------
# First byte: 0 = the shared TCP listener, 1 = the authority's Unix socket.


def userpass(user=b"agent-a", password=b"secret"):
    return bytes([1, len(user)]) + user + bytes([len(password)]) + password


def request(cmd=1, atyp=3, addr=b"example.com", port=443):
    if atyp == 3:
        a = bytes([len(addr)]) + addr
    else:
        a = addr
    return bytes([5, cmd, 0, atyp]) + a + struct.pack(">H", port)


tcp, unix = b"\x00", b"\x01"
greet_up, greet_none = b"\x05\x01\x02", b"\x05\x01\x00"
socks = {
    "tcp-domain": tcp + greet_up + userpass() + request(),
    "tcp-ipv4": tcp + greet_up + userpass() + request(atyp=1, addr=bytes([192, 0, 2, 1])),
    "tcp-ipv6": tcp + greet_up + userpass() + request(atyp=4, addr=bytes(15) + b"\x01"),
    "tcp-wrong-token": tcp + greet_up + userpass(password=b"wrong!") + request(),
    "tcp-unknown-user": tcp + greet_up + userpass(user=b"nobody") + request(),
    "tcp-no-userpass": tcp + greet_none + request(),
    "tcp-two-methods": tcp + b"\x05\x02\x00\x02" + userpass() + request(),
    "unix-none": unix + greet_none + request(),
    "unix-userpass-ignored": unix + greet_up + userpass(password=b"x") + request(),
    "unix-bind": unix + greet_none + request(cmd=2),
    "unix-udp": unix + greet_none + request(cmd=3),
    "unix-bad-atyp": unix + greet_none + bytes([5, 1, 0, 9]) + b"\x00" * 6,
    "unix-port-zero": unix + greet_none + request(port=0),
    "unix-odd-ipv4-name": unix + greet_none + request(addr=b"127.1"),
    "unix-not-utf8": unix + greet_none + request(addr=b"\xffa"),
    "unix-mapped-ipv6": unix + greet_none + request(atyp=4, addr=bytes(10) + b"\xff\xff\xc0\x00\x02\x01"),
    "unix-truncated": unix + greet_none + b"\x05\x01\x00\x03\x0bexam",
    "not-socks5": unix + b"\x04\x01\x00\x50",
    "bad-userpass-version": tcp + greet_up + b"\x02\x01a\x01b",
}
write("socks5", list(socks.items()))

# ---- ClientHello ---------------------------------------------------------------------------
# Built as mediator/src/sni.rs's test builder builds them.


def u16b(n):
    return struct.pack(">H", n)


def ext(t, data):
    return struct.pack(">H", t) + u16b(len(data)) + data


def sni(*names, name_type=0):
    lst = b"".join(bytes([name_type]) + u16b(len(n)) + n for n in names)
    return ext(0, u16b(len(lst)) + lst)


def common_exts():
    v = ext(0x002B, bytes([4, 3, 4, 3, 3]))
    v += ext(0x000A, bytes([0, 6, 0x11, 0xEC, 0x00, 0x1D, 0x00, 0x17]))
    v += ext(0x000D, bytes([0, 4, 4, 3, 8, 4]))
    shares = b"\x11\xec" + u16b(1200) + bytes((i * 7 % 251) for i in range(1200))
    shares += b"\x00\x1d" + u16b(32) + b"\x42" * 32
    return v + ext(0x0033, u16b(len(shares)) + shares)


def body(exts):
    b = b"\x03\x03" + b"\x5a" * 32 + bytes([32]) + b"\xa5" * 32
    b += bytes([0, 6, 0x13, 1, 0x13, 2, 0x13, 3]) + bytes([1, 0])
    return b + u16b(len(exts)) + exts


def handshake(msg_type, b):
    return bytes([msg_type]) + struct.pack(">I", len(b))[1:] + b


def records(msg, size=1 << 14, content_type=22):
    out = b""
    for i in range(0, len(msg), size):
        frag = msg[i : i + size]
        out += bytes([content_type, 3, 1]) + u16b(len(frag)) + frag
    return out


hello = handshake(1, body(sni(b"example.com") + common_exts()))
hellos = {
    "one-record": records(hello),
    "split-records": records(hello, size=200),
    "tiny-records": records(handshake(1, body(sni(b"a.test"))), size=7),
    "no-sni": records(handshake(1, body(common_exts()))),
    "ech": records(handshake(1, body(sni(b"public.example") + ext(0xFE0D, b"\x00" * 8)))),
    "two-names": records(handshake(1, body(sni(b"a.test", b"b.test")))),
    "name-type-1": records(handshake(1, body(sni(b"a.test", name_type=1)))),
    "empty-name": records(handshake(1, body(sni(b"")))),
    "duplicate-sni": records(handshake(1, body(sni(b"a.test") + sni(b"b.test")))),
    "server-hello": records(handshake(2, body(b""))),
    "trailing-early-data": records(handshake(1, body(sni(b"a.test")))) + b"\x17\x03\x03\x00\x02hi",
    "truncated": records(hello)[:300],
    "alert": b"\x15\x03\x03\x00\x02\x02\x28",
    "ssl2": b"\x80\x2e\x01\x00\x02",
    "not-tls": b"GET / HTTP/1.1\r\n\r\n",
    "bad-version": b"\x16\x02\x01\x00\x04\x01\x00\x00\x00",
}
write("client_hello", list(hellos.items()))

# ---- PAC answers ---------------------------------------------------------------------------

write(
    "pac_answer",
    numbered(
        "answer",
        [
            " PROXY Proxy.Corp:8080 ;socks 127.0.0.1:1080; DIRECT;; HTTPS s:443; SOCKS4 x:1; "
            "HTTP h:80; bogus; PROXY nope; PROXY a b",
            "DIRECT",
            "PROXY [2001:db8::1]:3128; DIRECT",
            "SOCKS5 parent.test:1080",
            "PROXY http://parent.test:3128/",
            "PROXY user:pw@parent.test:3128",
            "PROXY 127.1:3128",
            "DIRECT extra",
            "",
            ";;;",
        ],
    ),
)

# ---- config files --------------------------------------------------------------------------

# The example configurations (not `*.test.toml`, `mediator test`'s expectations).
configs = [
    (f"example-{p.stem}", p.read_text())
    for p in sorted((ROOT / "examples").glob("*.toml"))
    if not p.name.endswith(".test.toml")
]
tests = (ROOT / "policy/src/config/tests.rs").read_text()
full = re.search(r'const FULL: &str = r#"(.*?)"#;', tests, re.S)
if full:
    configs.append(("tests-full", full.group(1)))
configs += [
    ("empty", ""),
    ("syntax-error", "[listen\nsocket_dir = 1\n"),
    ("unknown-key", "[listen]\nsockets = \"/tmp\"\n"),
    ("authority-not-array", "[authority]\nname = \"a\"\n"),
    (
        "duplicate-names",
        "[[authority]]\nname = \"a\"\nallow = [\"x.test\"]\n[[authority]]\nname = \"a\"\n",
    ),
    # Everything `mediator diff` compares: wildcards, ports, ranges, deny reasons, [global],
    # termination, request rules, a credential, the channel, the limits.
    (
        "review",
        "[listen]\ntcp = \"127.0.0.1:3128\"\n[tls]\nca_dir = \"/ca\"\n"
        "[global]\ndeny = [\"*:25\", { host = \"*.pastebin.com\", reason = \"no paste sites\" }]\n"
        "[[authority]]\nname = \"a\"\n"
        "allow = [\"api.github.com\", \"*.githubusercontent.com:443\", \"192.0.2.0/24\", \"[2001:db8::1]:443\"]\n"
        "deny = [{ host = \"gist.githubusercontent.com\", reason = \"no gists\" }]\n"
        "default_deny_reason = \"ask the platform team\"\nallow_private = [\"10.1.0.0/16\", \"127.0.0.1\"]\n"
        "sni_check = false\ntls_terminate = [\"api.github.com\"]\nwatchdog = \"unix:/run/wd.sock\"\n"
        "token_sha256 = \"42e6b7873d248e37a115cb08d13a99147b10362deb90d006a03e5ce1ae11b824\"\n"
        "socket_mode = \"0660\"\nmax_connections = 10\nconnect_rate = 5\nconnect_burst = 7\n"
        "[[authority.request_rule]]\nhost = \"api.github.com\"\nmethods = [\"GET\"]\n"
        "path_prefixes = [\"/repos/\"]\nheaders = { accept = \"application/json*\" }\nquery = [\"page\"]\n"
        "[[authority.credential]]\nhost = \"api.github.com\"\nheader = \"Authorization\"\n"
        "secret_env = \"GITHUB_TOKEN\"\nformat = \"Bearer {secret}\"\n",
    ),
]
write("config", configs)

# ---- admin API bodies ----------------------------------------------------------------------

token = hashlib.sha256(b"t").hexdigest()
write(
    "admin_json",
    [
        ("minimal", '{"name": "b", "allow": ["example.com:443"]}'),
        ("generate-token", '{"name": "c", "allow": ["*.example.com"], "generate_token": true}'),
        ("token", f'{{"name": "d", "token_sha256": "{token}", "deny": ["*:25"]}}'),
        ("both-tokens", f'{{"name": "e", "token_sha256": "{token}", "generate_token": true}}'),
        ("duplicate", '{"name": "agent-a"}'),
        ("null", '{"name": "f", "allow": null}'),
        ("nested", '{"name": "g", "limits": {"max_connections": 1}}'),
        ("not-object", '["name", "h"]'),
        ("bad-entry", '{"name": "i", "allow": ["*.com"]}'),
        ("bad-name", '{"name": "no spaces"}'),
        ("unknown-key", '{"name": "j", "allowed": []}'),
        (
            "request-rule",
            '{"name": "k", "allow": ["api.example.com:443"], "tls_terminate": ["api.example.com"]}',
        ),
        ("generate-not-bool", '{"name": "l", "generate_token": "yes"}'),
        ("mixed-array", '{"name": "m", "allow": ["a.test", 1]}'),
    ],
)

# ---- request rules (the grant of mediator::fuzzing::request_rule_grant; the query table of
# policy/src/request.rs) ----------------------------------------------------------------------

request = (ROOT / "policy/src/request.rs").read_text()
odd_queries = re.search(r"for bad in \[(.*?)\]", request, re.S)
odd_queries = [unescape(q) for q in re.findall(r'"((?:[^"\\]|\\.)*)"', odd_queries.group(1))]
write(
    "request_rule",
    numbered(
        "request",
        [
            "GET /repos/x?page=2",
            "GET /repos/x?access_token=abc",
            "GET /repos/x?access%5Ftoken=abc",
            "GET /repos/x?access%255Ftoken=abc",
            "GET /repos/x?page=1&per_page=100",
            "POST /repos/x",
            "HEAD /repos/",
            "GET /repos/x?;page=2",
            "GET /repos/x?p%61ge=2",
            "GET /user",
            "GET /repos/../user",
            "GET /repos/x?page",
            "GET /repos/x?=1",
            "GET /repos/x?page=2&&per_page=3",
            "GET /repos/x?pa+ge=1",
        ],
    )
    + numbered("query", [f"GET /repos/x?{q}" for q in odd_queries])
    + numbered(
        "headers",
        [
            "POST /upload/x\ncontent-type: application/json",
            "POST /upload/x\nContent-Type: application/json; charset=utf-8",
            "POST /upload/x\ncontent-type: text/plain",
            "POST /upload/x\ncontent-type: application/json\ncontent-type: text/html",
            "POST /upload/x?a=1\ncontent-type: application/json",
            "POST /upl%6Fad/x\ncontent-type: application/json",
            "POST /upload/x",
            "GET /repos/x?page=2\naccept: application/json",
        ],
    ),
)

# ---- Upgrade headers (mediator/src/front/upgrade.rs's test table) ------------------------------
# First byte: 0 = HTTP/1.1, 1 = HTTP/2; then the Connection value, then one Upgrade value a line.

upgrade_tests = (ROOT / "mediator/src/front/upgrade.rs").read_text()
upgrade_seeds = []
for i, pairs in enumerate(re.findall(r"headers\(&\[(.*?)\]\)", upgrade_tests, re.S)):
    fields = re.findall(r'\(\s*"([^"]*)",\s*"([^"]*)"\s*\)', pairs)
    connection = [v for k, v in fields if k == "connection"]
    upgrades = [v for k, v in fields if k == "upgrade"]
    text = "\n".join([", ".join(connection)] + upgrades)
    for version in (b"\x00", b"\x01"):
        upgrade_seeds.append((f"table-{i:02}-{version[0]}", version + text.encode()))
upgrade_seeds += [
    ("two-fields", b"\x00upgrade\nwebsocket\nh2c"),
    ("list-with-empty", b"\x00Upgrade\n , websocket ,"),
    ("tab", b"\x00\tupgrade\t\n\twebsocket\t"),
    ("version", b"\x00upgrade\nwebsocket/13"),
    ("obs-text", b"\x00upgrade\nwebsocket\xff"),
]
write("upgrade", upgrade_seeds)

# ---- credential placeholders (mediator/src/credential.rs's tests) -----------------------------
# Lines: the placeholder, a prefix, a suffix, then how it is encoded (first byte % 3: how
# often; bit 7: uppercase hex; the following bytes: which bytes are encoded).

credential = (ROOT / "mediator/src/credential.rs").read_text()
placeholders = re.findall(r'placeholder = "([^"]*)"', credential)
placeholders += re.findall(r'placeholder = \\"([^"\\]*)\\"', (ROOT / "policy/src/config/tests.rs").read_text())
placeholders = sorted(set(placeholders))
misuse = re.search(r"fn a_placeholder_elsewhere_is_misuse.*?for \(host, uri, header\) in \[(.*?)\] \{", credential, re.S)
rows = re.findall(r'\(\s*"([^"]*)",\s*"([^"]*)",\s*"([^"]*)"\s*\)', misuse.group(1))
placeholder_seeds = []
for i, p in enumerate(placeholders):
    for level, how in [(0, b"\x00"), (1, b"\x81\xff"), (1, b"\x01\x55\xaa"), (2, b"\x82\x0f")]:
        placeholder_seeds.append(
            (f"placeholder-{i}-{level}-{how[-1]:02x}", p.encode() + b"\nBearer \n&x=1\n" + how)
        )
for i, (_, uri, header) in enumerate(rows):
    placeholder_seeds.append((f"misuse-{i:02}", f"{placeholders[0]}\n{uri}\n{header}\n\x00"))
placeholder_seeds += [
    ("decoder-only", b"%41%2541%%4\n%zz%2"),
    ("percent-in-placeholder", b"mediator%3Aapi%41x\n\n\n\x00"),
]
write("placeholder", placeholder_seeds)

# ---- mediator suggest (mediator/src/suggest.rs's tests) ---------------------------------------
# The authority, a newline, then the log.

suggest_tests = (ROOT / "mediator/src/suggest.rs").read_text()
log_rows = re.findall(
    r'line\(\s*"([^"]*)",\s*"([^"]*)",\s*"([^"]*)",\s*(\d+),\s*"([^"]*)",?\s*\)', suggest_tests
)

log_lines = [
    json.dumps(
        {"event": "decision", "ts": ts, "authority": a, "host": h, "port": int(p), "decision": "deny", "reason": r}
    )
    for ts, a, h, p, r in log_rows
]
report = json.dumps(
    {
        "report": "shim",
        "denials": [
            {"protocol": "connect", "status": 403, "reason": "not_in_allowlist", "host": "pypi.org", "port": 443},
            {"protocol": "connect", "status": 403, "reason": "special_address", "host": "192.0.2.1", "port": 443},
        ],
    }
)
write(
    "suggest",
    [("log", "agent-a\n" + "\n".join(log_lines))]
    + numbered("line", [f"agent-a\n{line}" for line in sample(log_lines)])
    + [
        ("shim-report", f"agent-a\n{report}"),
        ("shim-report-mixed", f"agent-a\nmediator: denied pypi.org:443 (not_in_allowlist): ...\n{report}\n"),
        ("not-json", "a\n{not json"),
        ("other-authority", "agent-b\n" + "\n".join(log_lines)),
        ("empty", "agent-a\n"),
    ],
)

# ---- Proxy-Authenticate offers (mediator/src/route/parent.rs's tests) ------------------------

parent_tests = (ROOT / "mediator/src/route/parent.rs").read_text()
offers = [unescape(v) for v in re.findall(r"(?i)proxy-authenticate: ((?:[^\"\\]|\\[^r])*)\\r\\n", parent_tests)]
write(
    "negotiate_offer",
    numbered("offer", offers)
    + [
        ("basic-then-negotiate", "Basic realm=\"x\"\nNEGOTIATE"),
        ("token", "Negotiate YWJj"),
        ("token-padding", "Negotiate YWI="),
        ("token-bad", "Negotiate YW!j"),
        ("list", "Basic realm=\"x\", Negotiate"),
        ("ows", " \tNegotiate  YWJj \t"),
    ],
)

# ---- kioslaverc (mediator/src/route/system/kde.rs's tests) -------------------------------------

kde_tests = (ROOT / "mediator/src/route/system/kde.rs").read_text()
kde_files = [unescape(t) for t in re.findall(r'std::fs::write\(\s*&\w+,\s*"((?:[^"\\]|\\.)*)"', kde_tests)]
kde_values = re.findall(r'show\("([^"]*)", "(\w+)"\)', kde_tests)
key_of = {"http": "httpProxy", "socks5": "socksProxy"}
write(
    "kioslaverc",
    numbered("file", kde_files)
    + numbered(
        "value",
        [f"[Proxy Settings]\nProxyType=1\n{key_of[s]}={v}\n" for v, s in kde_values],
    )
    + [
        ("pac", "[Proxy Settings]\nProxyType=2\nProxy Config Script=http://wpad.corp/p.pac\n"),
        ("pac-file", "[Proxy Settings]\nProxyType=2\nProxy Config Script=file:///etc/proxy.pac\n"),
        ("env", "[Proxy Settings]\nProxyType=4\n"),
        ("https-proxy", "[Proxy Settings]\nProxyType=1\nhttpsProxy=https://proxy.corp:8443\nNoProxyFor=localhost,.corp\n"),
    ],
)

# ---- HTTP/2 frames the terminating server writes (mediator/src/front/h2_resets.rs's test) -----


def h2_frame(kind, flags, stream, payload):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


h2_stream = (
    h2_frame(0x4, 0, 0, bytes([0, 3, 0, 0, 0, 100]))  # SETTINGS
    + h2_frame(0x4, 0x1, 0, b"")  # SETTINGS ack
    + h2_frame(0x1, 0x4, 1, b"\x88")  # HEADERS :status 200
    + h2_frame(0x0, 0x1, 1, b"\x03" * 300)  # DATA that looks like resets
    + h2_frame(0x3, 0, 3, (1).to_bytes(4, "big"))  # RST_STREAM PROTOCOL_ERROR
    + h2_frame(0x3, 0, 5, (8).to_bytes(4, "big"))  # RST_STREAM CANCEL
    + h2_frame(0x7, 0, 0, bytes([0, 0, 0, 7, 0, 0, 0, 1]))  # GOAWAY
)
write(
    "h2_resets",
    [(f"step-{step}", bytes([step]) + h2_stream) for step in (1, 3, 9, 13, 255)]
    + [
        ("truncated", bytes([4]) + h2_stream[:-3]),
        ("long-reset", bytes([7]) + h2_frame(0x3, 0, 9, (1).to_bytes(8, "big"))),
    ],
)
