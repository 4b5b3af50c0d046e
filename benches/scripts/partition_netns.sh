#!/bin/bash
# Duplicates per second of a partition, on real nodes in network namespaces.
#
#   sudo benches/scripts/partition_netns.sh MESH_BIN DIR [TASKS] [SECS] [CUT_AT] [CUT_FOR]
#
# Four nodes of cpu=2 on one bridge, in three namespaces: nodes 1 and 2 in
# the first (node 1 coordinates), node 3 in the second, node 4 (the
# submitter, the farm's home) in the third. TASKS tasks of SECS seconds
# (default 3,000 x 0.1 s) are submitted on node 4; CUT_AT s later (5) the
# link of the namespaces in CUT_LINKS (default "vpb vpc": three sides,
# {1,2} {3} {4}; "vpa": two sides, {1,2} {3,4}) goes down for CUT_FOR s
# (20), then comes back. Every run appends a line to DIR/runs.log; at the
# end it prints the runs, the distinct tasks, the extra runs (duplicates)
# and those per second of partition, with `mesh wait`'s own count and the
# outputs home. REPLICAS (default 2) is every node's --replicas: 4 has
# every node keep a copy, so each side takes the farm over from its own.
# Needs root and `ip`; cleans up its namespaces and nodes.
set -u
BIN=$1; DIR=$2; N=${3:-3000}; SECS=${4:-0.1}; CUT_AT=${5:-5}; CUT_FOR=${6:-20}
cleanup() {
  for f in $DIR/n*.pid; do kill -9 $(cat $f) 2>/dev/null; done
  for ns in pa pb pc; do ip netns del $ns 2>/dev/null; done
  # A deleted namespace may outlive its name for a while with its veth's
  # far end in it, and the next run's veth of that name would not be made.
  for ns in pa pb pc; do ip link del v$ns 2>/dev/null; done
  ip link del pbr 2>/dev/null
}
cleanup
rm -rf $DIR; mkdir -p $DIR
ip link add pbr type bridge; ip link set pbr up
i=1
for ns in pa pb pc; do
  ip netns add $ns
  ip link add v$ns type veth peer name e$ns
  ip link set e$ns netns $ns
  ip link set v$ns master pbr; ip link set v$ns up
  ip -n $ns addr add 10.232.0.$i/24 dev e$ns
  ip -n $ns link set e$ns up; ip -n $ns link set lo up
  i=$((i+1))
done
start() { # idx ns ip join
  local k=$1 ns=$2 ipa=$3 join=${4:-}
  mkdir -p $DIR/n$k
  [ $k -gt 1 ] && cp $DIR/n1/mesh.key $DIR/n$k/
  if [ -z "$join" ]; then
    MESH_STATE_DIR=$DIR/n$k ip netns exec $ns setsid $BIN node --listen /ip4/$ipa/tcp/7${k}00 --resources cpu=2 --dead-after-ms 1500 --replicas ${REPLICAS:-2} > $DIR/n$k.log 2>&1 &
  else
    MESH_STATE_DIR=$DIR/n$k ip netns exec $ns setsid $BIN join $join --listen /ip4/$ipa/tcp/7${k}00 --resources cpu=2 --dead-after-ms 1500 --replicas ${REPLICAS:-2} > $DIR/n$k.log 2>&1 &
  fi
  echo $! > $DIR/n$k.pid
}
$BIN --state-dir $DIR/n1 init > /dev/null
start 1 pa 10.232.0.1 ""
sleep 1
A=$(grep -o 'listening on .*' $DIR/n1.log | head -1 | cut -d' ' -f3)
start 2 pa 10.232.0.1 $A
start 3 pb 10.232.0.2 $A
start 4 pc 10.232.0.3 $A
for t in $(seq 1 60); do
  c=$(MESH_STATE_DIR=$DIR/n4 ip netns exec pc $BIN status --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))' 2>/dev/null)
  [ "$c" = "4" ] && break; sleep 0.5
done
cat > $DIR/farm.toml <<EOF
[farm]
name = "part"
[[stage]]
name = "s"
sweep.i = { range = "0..$((N-1))" }
workdir = "w/{i}"
shell = 'sleep $SECS; echo {i} > r.txt; echo {i} \$MESH_NODE \$(date +%s.%N) >> $DIR/runs.log'
outputs = ["r.txt"]
EOF
cd $DIR
T0=$(date +%s.%N); echo $T0 > $DIR/t0
ID=$(MESH_STATE_DIR=$DIR/n4 ip netns exec pc $BIN submit farm.toml --out $DIR/out)
sleep $CUT_AT
for l in ${CUT_LINKS:-vpb vpc}; do ip link set $l down; done
echo "cut at $(python3 -c "print(round($(date +%s.%N)-$T0,1))") s; runs so far $(wc -l < $DIR/runs.log)"
sleep $CUT_FOR
for l in ${CUT_LINKS:-vpb vpc}; do ip link set $l up; done
echo "healed at $(python3 -c "print(round($(date +%s.%N)-$T0,1))") s; runs so far $(wc -l < $DIR/runs.log)"
MESH_STATE_DIR=$DIR/n4 ip netns exec pc timeout 300 $BIN wait $ID --json > $DIR/wait.json 2>$DIR/wait.err
echo "wait rc=$? after $(python3 -c "print(round($(date +%s.%N)-$T0,1))") s"
RUNS=$(wc -l < $DIR/runs.log); DISTINCT=$(cut -d' ' -f1 $DIR/runs.log | sort -u | wc -l)
python3 - $DIR $RUNS $DISTINCT $CUT_AT $CUT_FOR <<'PY'
import collections, json, sys
d, runs, distinct, at, cut = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
v = json.load(open(d + "/wait.json"))
print(f"done {v['counts']['done']}/{v['counts']['total']} runs {runs} distinct {distinct} "
      f"extra {runs - distinct} reported duplicates {v['duplicates']} "
      f"extra per s of partition {(runs - distinct) / cut:.1f}")
t0 = float(open(d + "/t0").read())
per = collections.defaultdict(collections.Counter)
for line in open(d + "/runs.log"):
    _, node, t = line.split()
    t = float(t) - t0
    per[node[-6:]]["before" if t < at else "during" if t < at + cut else "after"] += 1
for node, c in sorted(per.items()):
    print(f"  node ..{node}: runs before {c['before']}, during {c['during']}, after {c['after']}")
PY
echo "outputs home: $(ls $DIR/out/s | wc -l)"
cleanup
