#!/bin/sh
# Stands in for a real solver: takes a parameter and a seed, writes result.dat
# and a log. Uses only POSIX sh and coreutils.
set -eu
param=$1
seed=$2
mkdir -p logs
echo "task ${MESH_TASK_ID:-?} (attempt ${MESH_ATTEMPT:-?}): param=$param seed=$seed in $(pwd)" > logs/solve.log
# A deterministic stand-in for a result: a checksum of the inputs.
value=$(printf '%s %s' "$param" "$seed" | cksum | cut -d' ' -f1)
printf '%s %s %s\n' "$param" "$seed" "$((value % 1000))" > result.dat
