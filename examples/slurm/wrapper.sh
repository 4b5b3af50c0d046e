#!/bin/sh
# The steps common to every task (the seed workflow's wrapper.sh): set up
# the environment, run the application on this task's parameters, keep its
# log next to the result. Replace the marked line with your application.
set -eu
# module load myapp          # on the cluster: the application's environment
line=$1
echo "task ${MESH_TASK_ID:-?} attempt ${MESH_ATTEMPT:-?} on $(hostname): $line" > task.log
# --- the application (a stand-in: a checksum of the parameters) ---
value=$(printf '%s' "$line" | cksum | cut -d' ' -f1)
printf '%s %s\n' "$line" "$value" > result.dat
cat task.log >> result.dat
