#!/bin/sh
# Writes params.txt with N lines of parameters (default a million): what
# the seed workflow's params() function produced, one task per line.
set -eu
n=${1:-1000000}
awk -v n="$n" 'BEGIN { for (i = 1; i <= n; i++) printf "case-%d %.4f %d\n", i, i / n, i % 97 }' > params.txt
echo "params.txt: $n lines"
