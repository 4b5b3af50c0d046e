#!/bin/bash
# The randomized oracle at scale: 1,000 one-node histories and 100 on three
# nodes that share no file system (those need root and `unshare -m`), in a
# release build. Prints, per test, the histories run, the run steps, the
# tasks checked (ran and reused), the failures by kind, and the report of
# the first few failures (seed, history, farm files, how to replay).
#
#   benches/scripts/oracle.sh [ONE_NODE] [MESH] [BASE_SEED]
#
# Replay one history: MESH_ORACLE_SEED=<n> cargo test -p mesh-cli --test e2e oracle -- --nocapture
# (MESH_ORACLE_VERBOSE=1 prints every step). A history with a kill depends
# on when the kill lands, so it replays the same operations, not always
# the same interleaving.
set -u
cd "$(dirname "$0")/../.."
export MESH_ORACLE_HISTORIES=${1:-1000}
export MESH_ORACLE_MESH_HISTORIES=${2:-100}
export MESH_ORACLE_BASE=${3:-1}
exec cargo test --release -p mesh-cli --test e2e oracle_ -- --nocapture --test-threads 1
