#!/bin/sh
# Stands in for a licensed solver: holds its token for a moment, then writes
# solved.txt. MESH_RESOURCE_TOKEN says how many tokens the task was granted.
set -eu
input=$1
sleep 0.2
lines=$(wc -l < "$input")
echo "task ${MESH_TASK_ID:-?}: $lines lines, tokens ${MESH_RESOURCE_TOKEN:-none}" > solved.txt
