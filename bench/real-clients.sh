#!/usr/bin/env bash
# Everyday clients against the real public registries, under the shim, as a new user would
# run them: nothing set in the environment for them, only the registry's hosts granted.
# Not CI (it reaches the internet); run it by hand where the machine reaches the package
# registries. A few small downloads per run, never a load.
#
#   bench/real-clients.sh            build target/release, run the matrix, print it
#   SHIM=... MEDIATOR=... bench/real-clients.sh   use those binaries instead
#   CLIENTS="pip apt" COLUMNS="terminated denied-socket" bench/real-clients.sh   a part
#
# The matrix: pip (download; an install that pulls dependencies), npm (view; install),
# cargo (fetch), apt-get (update of one list; download), and a captured curl
# (`--noproxy '*'`), each
#   embedded    shim --allow <its hosts> [--allow-private <address>]
#   socket      a standalone mediator whose authority allows the same, shim --config/--authority
#   terminated  the same mediator terminating TLS for those hosts (the shim makes the
#               client trust its CA)
#   denied      embedded and socket with one needed host left out: the run fails, and the
#               shim's "mediator: denied <host>" line must be on stderr ("said first":
#               before the client's own first error line, "said after": after it)
# and each run's --report must show no filesystem refusal (fs_denied). A registry name that
# resolves to a non-public address here (a documentation range, behind an egress gateway)
# is granted with --allow-private for that address, as the shim requires. A client whose
# program the command cannot reach (run as root, the command is an unprivileged uid, and
# rustup's cargo is beneath /root) gets the --allow-read flags the shim's hint names, as a
# user following it would.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${SHIM:-}" ] && [ -n "${MEDIATOR:-}" ]; then
    shim=$(realpath "$SHIM")
    mediator=$(realpath "$MEDIATOR")
else
    cargo build --release -p shim -p mediator >/dev/null
    shim="$PWD/target/release/shim"
    mediator="$PWD/target/release/mediator"
fi

work=$(mktemp -d)
med=
cleanup() { [ -n "$med" ] && kill "$med" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# The non-public addresses the registries' names resolve to here, as /32 and /128 grants.
private_of() {
    for h in "$@"; do getent ahosts "$h" | awk '{print $1}'; done | sort -u | python3 -c '
import ipaddress, sys
for a in sys.stdin.read().split():
    ip = ipaddress.ip_address(a)
    if not ip.is_global:
        print(f"{a}/{ip.max_prefixlen}")'
}

# Each client: its hosts (the last is the one a denied run leaves out) and its script,
# run inside the sandbox (cwd /tmp, the private temporary directory).
declare -A hosts script check
hosts[pip]="pypi.org files.pythonhosted.org"
# pip as it comes (`pip download`), and an install with its dependencies in a virtual
# environment, as pip itself advises: pyenv's `pip` wrapper runs `pyenv rehash` after an
# install outside one, which fails in the read-only $PYENV_ROOT (docs/shim.md).
script[pip]='cd /tmp && pip download -q --no-deps -d /tmp/dl six && ls /tmp/dl && python3 -m venv /tmp/v && /tmp/v/bin/pip install -q requests && /tmp/v/bin/python -c "import requests, urllib3, idna, certifi, charset_normalizer; print(\"imported\")"'
check[pip]='^imported$'
hosts[npm]="registry.npmjs.org"
script[npm]='mkdir /tmp/p && cd /tmp/p && npm view left-pad version && npm install --no-audit --no-fund is-odd >/dev/null && ls node_modules | tr "\n" " "'
check[npm]='is-number is-odd'
# The index last: where crates.io's config.json sends downloads to another host (an
# Artifactory mirror serves both from one), leaving the index out is what fails.
hosts[cargo]="static.crates.io index.crates.io"
script[cargo]='cd /tmp && cargo new -q --vcs none c && cd c && echo "itoa = \"1\"" >> Cargo.toml && cargo fetch -q && ls "$CARGO_HOME"/registry/cache/*/'
check[cargo]='^itoa-1\.'
hosts[apt]="deb.debian.org"
# http:// as Debian ships it; TLS termination needs https:// (set below).
script[apt]='cd /tmp && mkdir -p lists/partial && echo "deb SCHEME://deb.debian.org/debian bookworm-updates main" > one.list && O="-o Dir::Etc::SourceList=/tmp/one.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=/tmp/lists -o Dir::State::status=/dev/null" && apt-get update -q $O >/dev/null && pkg=$(apt-cache $O pkgnames | sort | head -n 1) && apt-get download -q $O "$pkg" >/dev/null && ls *.deb'
check[apt]='\.deb$'
hosts[curl]="pypi.org"
script[curl]='curl -sS --noproxy "*" -o /dev/null -w "%{http_code}\n" https://pypi.org/simple/six/'
check[curl]='^200$'
# How each client's own error lines start (is the shim's denial line said before them?).
declare -A error=([pip]='^(ERROR|WARNING: Retrying)' [npm]='^npm (error|ERR)' [cargo]='^(error|warning: spurious)' [apt]='^(E:|Err:|W:)' [curl]='^curl:')
clients=(pip npm cargo apt curl)
declare -A program=([pip]=pip [npm]=npm [cargo]=cargo [apt]=apt-get [curl]=curl)

# The flags the shim's hint names when the command cannot reach PROGRAM ("shim: hint: ...
# add --allow-read DIR ..."), found with a run of the no-network mode.
hinted_reads() {
    { "$shim" --deny '*' -- "$1" --version 2>&1 >/dev/null || true; } | sed -n 's/^shim: hint: .* add //p'
}

# A standalone mediator for socket mode: authority "real" allows HOSTS; TERMINATE says
# whether it terminates their TLS.
start_mediator() { # DIR TERMINATE HOSTS...
    local dir=$1 terminate=$2; shift 2
    mkdir -p "$dir/sockets"
    local allow="" term="" priv=""
    for h in "$@"; do allow+="\"$h\", "; term+="\"$h\", "; done
    for p in $(private_of "$@"); do priv+="\"$p\", "; done
    {
        printf '[listen]\nsocket_dir = "%s/sockets"\n\n[upstream]\nmode = "direct"\n\n' "$dir"
        printf '[log]\ndecisions = "%s/decisions.jsonl"\n\n[registry]\nstate_dir = "%s/state"\n' "$dir" "$dir"
        [ "$terminate" = yes ] && printf '\n[tls]\nca_dir = "%s/ca"\n' "$dir"
        printf '\n[[authority]]\nname = "real"\nallow = [%s]\nallow_private = [%s]\n' "$allow" "$priv"
        [ "$terminate" = yes ] && printf 'tls_terminate = [%s]\n' "$term"
    } > "$dir/mediator.toml"
    "$mediator" --config "$dir/mediator.toml" 2>"$dir/mediator.stderr" &
    med=$!
    for _ in $(seq 100); do [ -S "$dir/sockets/real.sock" ] && return 0; sleep 0.1; done
    echo "the mediator did not start: $(cat "$dir/mediator.stderr")" >&2
    return 1
}
stop_mediator() { kill "$med" 2>/dev/null; wait "$med" 2>/dev/null || true; med=; }

# One run: CLIENT MODE [LEAVE_OUT]; prints ok/FAIL with what was wrong.
run() {
    local client=$1 mode=$2 leave=${3:-} dir="$work/$1-$2${3:+-denied}"
    mkdir -p "$dir"
    local -a granted=(${hosts[$client]}) flags=(--report-file "$dir/report.json" ${reads[$client]})
    [ -n "$leave" ] && unset 'granted[-1]'
    local s=${script[$client]} scheme=http
    [ "$mode" = terminated ] && scheme=https
    s=${s//SCHEME/$scheme}
    case $mode in
        embedded)
            for h in "${granted[@]}"; do flags+=(--allow "$h"); done
            for p in $(private_of ${hosts[$client]}); do flags+=(--allow-private "$p"); done ;;
        socket|terminated)
            start_mediator "$dir/mediator" "$([ "$mode" = terminated ] && echo yes || echo no)" "${granted[@]}"
            flags+=(--config "$dir/mediator/mediator.toml" --authority real) ;;
    esac
    local start=$SECONDS rc=0
    # From /: root's command (an unprivileged uid) may not enter mktemp's 0700 directory.
    (cd / && "$shim" "${flags[@]}" -- sh -c "$s") >"$dir/out" 2>"$dir/err" || rc=$?
    [ -n "$med" ] && stop_mediator
    local took=$((SECONDS - start)) fs
    fs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["filesystem"]["denied"])' "$dir/report.json" 2>/dev/null || echo "?")
    if [ -n "$leave" ]; then
        local said first
        said=$(grep -n -m 1 "^mediator: denied ${hosts[$client]##* }" "$dir/err" | cut -d: -f1)
        first=$(grep -n -m 1 -E "${error[$client]}" "$dir/err" | cut -d: -f1)
        if [ "$rc" != 0 ] && [ -n "$said" ]; then
            if [ -z "$first" ] || [ "$said" -lt "$first" ]; then
                echo "said first (${took}s)"
            else
                echo "said after (${took}s)"
            fi
        else
            echo "FAIL (rc=$rc, no denial line: $(head -c 300 "$dir/err" | tr '\n' ' '))"
        fi
    elif [ "$mode" = terminated ] && ! grep -q '"protocol":"tls"' "$dir/mediator/decisions.jsonl"; then
        echo "FAIL (rc=$rc: no request was terminated)"
    elif [ "$rc" = 0 ] && tail -n 1 "$dir/out" | grep -qE "${check[$client]}" && [ "$fs" = 0 ]; then
        if [ "$mode" = terminated ]; then
            echo "ok, $(grep -c '"protocol":"tls"' "$dir/mediator/decisions.jsonl") req (${took}s)"
        else
            echo "ok (${took}s)"
        fi
    else
        echo "FAIL (rc=$rc, fs_denied=$fs: $(tail -n 3 "$dir/err" | tr '\n' ' ' | head -c 300))"
    fi
}

# CLIENTS="pip npm" and COLUMNS="embedded denied-socket" run part of the matrix.
read -r -a clients <<< "${CLIENTS:-${clients[*]}}"
declare -A reads
for c in "${clients[@]}"; do reads[$c]=$(hinted_reads "${program[$c]}"); done
read -r -a columns <<< "${COLUMNS:-embedded socket terminated denied-embedded denied-socket}"
printf '%-6s' client
for col in "${columns[@]}"; do printf ' | %-20s' "$col"; done
echo
for c in "${clients[@]}"; do
    printf '%-6s' "$c"
    for col in "${columns[@]}"; do
        case $col in
            denied-*) printf ' | %-20s' "$(run "$c" "${col#denied-}" leave)" ;;
            *) printf ' | %-20s' "$(run "$c" "$col")" ;;
        esac
    done
    echo
done
