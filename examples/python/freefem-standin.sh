#!/bin/sh
# Stands in for FreeFem++-nw where FreeFem is not installed: reads the
# model and the mesh it is given, "solves" for the voltage $2, and writes
# the I-V point to iv.dat as the real script would.
set -e
model=$1
voltage=$2
test -s "$model" || { echo "cannot read the model $model" >&2; exit 1; }
test -s user_case/BF_RefMeshLIR_100x100x95x100.msh || { echo "the mesh is missing" >&2; exit 1; }
current=$(awk -v v="$voltage" 'BEGIN { printf "%.6f", 0.035 - 1e-12 * (exp(v / 0.0259) - 1) }')
echo "solved $model at V=$voltage: I=$current"
printf '%s %s\n' "$voltage" "$current" > iv.dat
