#!/usr/bin/env bash
# The registry benchmark (design 17): creates per second through the admin API with the
# local registry (each answered once its record is fsynced) and with etcd, and the time
# from a create's 201 on one replica to the authority being live on another (p50, p99),
# with a three-member etcd cluster and two mediators, all on loopback. Needs etcd-server
# and protoc (protobuf-compiler): the mediator is built with the cargo feature etcd.
# Writes bench/results/registry.jsonl and prints it.
#
# Knobs (environment): CREATES (500), CONCURRENCY (8).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p mediator --features etcd
cargo build --release -q -p bench --bin registry
target=${CARGO_TARGET_DIR:-target}
"$target/release/registry" --mediator "$target/release/mediator" \
  --creates "${CREATES:-500}" --concurrency "${CONCURRENCY:-8}" \
  | tee bench/results/registry.jsonl
