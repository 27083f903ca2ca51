#!/usr/bin/env bash
# The fleet benchmark (design 17, placement by node): a three-member etcd cluster and
# mediator replicas on loopback, each with its own node name, state and socket directory.
# Fills the registry with AUTHORITIES authorities over NODES nodes through one replica's
# admin API (its create throughput), starts one node's replica with the whole registry
# present (start to ready, RSS, the registry keys and bytes it read) against the same
# node's replica alone in a registry of its own share, measures the memory per
# materialised authority (MATERIALISE on one replica), then churn (RATE creates/s plus
# RATE deletes/s for CHURN_SECS, each timed to its node's replica) and ROUNDS chaos rounds
# (a replica and an etcd member killed with SIGKILL at random moments; afterwards every
# acknowledged create must be served by its node, every acknowledged delete by none, and
# no replica may serve another node's authority). Needs etcd-server and protoc
# (protobuf-compiler): the mediator is built with the cargo feature etcd.
# Writes bench/results/fleet.jsonl and bench/results/fleet.md and prints the table;
# exits non-zero when a goal is missed.
#
# Knobs (environment): AUTHORITIES (100000), NODES (100), FLEET (10 fleet-wide ones),
# MATERIALISE (10000), CONCURRENCY (64), RATE (200), CHURN_SECS (20), ROUNDS (20),
# DIR (keep the cluster's and replicas' files there).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p mediator --features etcd
cargo build --release -q -p bench --bin fleet
target=${CARGO_TARGET_DIR:-target}
mkdir -p bench/results
status=0
"$target/release/fleet" --mediator "$target/release/mediator" \
  --authorities "${AUTHORITIES:-100000}" --nodes "${NODES:-100}" --fleet "${FLEET:-10}" \
  --materialise "${MATERIALISE:-10000}" --concurrency "${CONCURRENCY:-64}" \
  --rate "${RATE:-200}" --churn-secs "${CHURN_SECS:-20}" --rounds "${ROUNDS:-20}" \
  ${DIR:+--dir "$DIR"} > bench/results/fleet.out || status=$?
grep '^{' bench/results/fleet.out > bench/results/fleet.jsonl || true
sed -n '/^| measure/,$p' bench/results/fleet.out > bench/results/fleet.md
rm -f bench/results/fleet.out
cat bench/results/fleet.md
exit "$status"
