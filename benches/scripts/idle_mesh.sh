#!/usr/bin/env bash
# Idle cost of a mesh of N real nodes on this machine: CPU per node (ms of
# CPU per second), memory per node, TCP connections per node, and how long
# until every node sees every other. Usage: idle_mesh.sh N [BIN] [SECONDS]
set -euo pipefail
n=${1:?nodes}; bin=${2:-target/release/mesh}; secs=${3:-20}
bin=$(realpath "$bin")
dir=$(mktemp -d); pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
"$bin" --state-dir "$dir/n0" init >/dev/null
"$bin" --state-dir "$dir/n0" node --listen /ip4/127.0.0.1/tcp/0 --resources cpu=1 >"$dir/n0.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$dir/n0.log" && break; sleep 0.1; done
addr=$(grep -m1 -o "listening on .*" "$dir/n0.log" | cut -d' ' -f3)
for i in $(seq 1 $((n - 1))); do
  mkdir -p "$dir/n$i"; cp "$dir/n0/mesh.key" "$dir/n$i/"; chmod 600 "$dir/n$i/mesh.key"
  "$bin" --state-dir "$dir/n$i" join "$addr" --listen /ip4/127.0.0.1/tcp/0 --resources cpu=1 >"$dir/n$i.log" 2>&1 &
  pids+=($!)
done
start=$(date +%s.%N)
seen() { "$bin" --state-dir "$dir/n$1" status --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))' 2>/dev/null || echo 0; }
converged=""
for _ in $(seq 600); do
  ok=1
  for i in 0 $((n / 2)) $((n - 1)); do [ "$(seen $i)" = "$n" ] || { ok=0; break; }; done
  if [ $ok = 1 ]; then converged=$(python3 -c "print(round($(date +%s.%N) - $start, 1))"); break; fi
  sleep 0.5
done
sleep 5
ticks() { local t=0; for p in "${pids[@]}"; do read -r -a f < "/proc/$p/stat"; t=$((t + f[13] + f[14])); done; echo $t; }
hz=$(getconf CLK_TCK)
t0=$(ticks); sleep "$secs"; t1=$(ticks)
rss=0; for p in "${pids[@]}"; do rss=$((rss + $(awk '/VmRSS/ {print $2}' "/proc/$p/status"))); done
conns=$(ss -tnH state established 2>/dev/null | awk '$3 ~ /127.0.0.1/ && $4 ~ /127.0.0.1/' | wc -l)
gone=$(cat "$dir"/n*.log | grep -c "is gone" || true)
python3 - <<PY
n=$n; cpu=($t1-$t0)/$hz*1000/$secs/n
print(f"nodes {n}: converged in {'$converged' or 'NEVER'} s; idle CPU {cpu:.2f} ms/s per node; RSS {$rss/1024/n:.1f} MB per node; TCP connection ends {$conns/n:.2f} per node; 'is gone' lines {$gone}")
PY
