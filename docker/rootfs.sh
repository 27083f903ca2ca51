#!/usr/bin/env bash
# Assembles the runtime image's root filesystem from built binaries: the binaries (debug
# sections stripped), the shared libraries they load (and the dynamic loader), a
# passwd/group naming the non-root user, the CA bundle for upstream TLS, and the
# directories that volumes mount over.
# Nothing else: no shell, no package manager, no coreutils.
#
# Used by both ways of building the image, so they cannot differ:
#   docker/Dockerfile (build stage, after `cargo build --release`)
#   docker/build-image.sh (on the host, from target/release)
#
# usage: docker/rootfs.sh OUT_DIR MEDIATOR_BINARY SHIM_BINARY
#
# OUT_DIR/rootfs is the tree owned by root, /run, /var and /var/lib included;
# OUT_DIR/state/run and OUT_DIR/state/var-lib each hold one directory the mediator writes
# (egress-mediator, mode 0750). The runtime stage copies each with --chown into the
# existing /run and /var/lib (COPY does not keep ownership), so that those two
# directories, and nothing else, belong to the mediator's user.
set -euo pipefail

out=$1
mediator=$2
shim=$3
uid=65532   # the conventional "nonroot" uid of distroless images
gid=65532

rm -rf "$out"
state=$out/state
out=$out/rootfs
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/tmp" "$out/run" "$out/var/lib" \
  "$state"
# The release profile keeps line tables (92 MB for the mediator); the image keeps the
# symbols (function names in a panic's backtrace) and drops the debug sections.
strip --strip-debug -o "$out/usr/local/bin/mediator" "$mediator"
strip --strip-debug -o "$out/usr/local/bin/shim" "$shim"
chmod 0755 "$out/usr/local/bin/mediator" "$out/usr/local/bin/shim"

# Every shared object the binaries load, at the path the loader looks for it (ldd prints
# "name => /path (addr)" for libraries and "/path (addr)" for the loader itself).
for bin in "$mediator" "$shim"; do
  if ! ldd "$bin" >/dev/null 2>&1; then
    echo "rootfs.sh: $bin is static: no libraries to copy" >&2
    continue
  fi
  ldd "$bin" | awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }'
done | sort -u | while read -r lib; do
  mkdir -p "$out$(dirname "$lib")"
  # Follow symlinks: the image holds the real file under the name the loader asks for.
  cp -L "$lib" "$out$lib"
done

# MIT Kerberos' GSSAPI library: the mediator opens it at run time (dlopen) for Negotiate
# parents, so ldd of the binary does not list it. Copy it and its own closure, at the
# paths the loader searches.
gssapi=$(ldconfig -p 2>/dev/null | awk '$1 == "libgssapi_krb5.so.2" && $NF ~ /^\// { print $NF; exit }')
[ -n "$gssapi" ] || gssapi=$(ls /usr/lib/*/libgssapi_krb5.so.2 /lib/*/libgssapi_krb5.so.2 2>/dev/null | awk 'NR == 1')
if [ -z "$gssapi" ]; then
  echo "rootfs.sh: libgssapi_krb5.so.2 is missing (apt-get install -y libgssapi-krb5-2)" >&2
  exit 1
fi
{
  echo "$gssapi"
  ldd "$gssapi" | awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }'
} | sort -u | while read -r lib; do
  mkdir -p "$out$(dirname "$lib")"
  cp -L "$lib" "$out$lib"
done

# The loader's canonical path must exist for the binaries' PT_INTERP.
interp=$(readelf -l "$mediator" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [ -n "$interp" ] && [ ! -e "$out$interp" ]; then
  mkdir -p "$out$(dirname "$interp")"
  cp -L "$interp" "$out$interp"
fi

cat > "$out/etc/passwd" <<PASSWD
root:x:0:0:root:/root:/sbin/nologin
mediator:x:$uid:$gid:egress mediator:/nonexistent:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
PASSWD
cat > "$out/etc/group" <<GROUP
root:x:0:
mediator:x:$gid:
nogroup:x:65534:
GROUP

# Upstream TLS is verified against the system trust store (rustls-native-certs reads this
# bundle); without it every verified upstream handshake fails closed.
bundle=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$bundle" ]; then
  echo "rootfs.sh: $bundle is missing (apt-get install -y ca-certificates)" >&2
  exit 1
fi
cp -L "$bundle" "$out/etc/ssl/certs/ca-certificates.crt"

# Mount points: sockets (a tmpfs or a hostPath), the CA (persistent), the config (read-only).
install -d -m 0755 "$out/etc/egress-mediator"
install -d -m 0750 "$state/run/egress-mediator" "$state/var-lib/egress-mediator"
chmod 0755 "$out/run" "$out/var" "$out/var/lib"
chmod 1777 "$out/tmp"
echo "rootfs.sh: $(find "$out" -type f | wc -l) files ($(find "$out" -name "*.so*" -type f | wc -l) shared objects: libraries and the loader), $(du -sh "$out" | cut -f1) in $out" >&2
