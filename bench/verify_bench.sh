#!/bin/sh
# verify benchmark on the 52k poster tree: gridfsctl verify vs raw pymongo scans
# and a per-file pymongo loop, each run alone under the shared bench lock.
#
#   bench/verify_bench.sh PORT DATADIR     (backend started and loaded by this script if empty)
set -eu
# The whole series runs under the shared bench lock, taken once.
if [ -z "${VERIFY_BENCH_LOCKED:-}" ]; then
	VERIFY_BENCH_LOCKED=1 exec flock /tmp/gridfsctl-bench.lock "$0" "$@"
fi
top=$(cd "$(dirname "$0")/.." && pwd)
port=${1:-27251} dir=${2:-/tmp/h-verify/b52k}
uri="mongodb://127.0.0.1:$port/"
[ -f "$dir/ferretdb.pid" ] || "$top/scripts/backend" start "$dir" "$port" sqlite >/dev/null
n=$(python3 -c 'import sys,pymongo; print(pymongo.MongoClient(sys.argv[1]).bench["fs.files"].estimated_document_count())' "$uri")
if [ "$n" -eq 0 ]; then
	[ -d /tmp/posters-52k ] || flock /tmp/gridfsctl-gen.lock sh -c '[ -d /tmp/posters-52k ] || python3 "$0"/bench/gen_posters.py /tmp/posters-52k 52000' "$top"
	python3 "$top/bench/verify_load.py" "$uri" bench /tmp/posters-52k --prefix posters
fi
pid=$(cat "$dir/ferretdb.pid")
b="python3 $top/bench/verify_bench.py $uri bench"
run() { echo "+ $*" | sed "s|$top/||g"; "$@" || echo "(failed: $?)"; }
run $b verify --pid "$pid" --bin "${GRIDFSCTL:-$top/gridfsctl}"
run $b verify --pid "$pid" --bin "${GRIDFSCTL:-$top/gridfsctl}" -- --threads 2
run $b raw --pid "$pid"
run $b raw-sorted --pid "$pid"
run $b pyloop --limit 3 --pid "$pid"
run $b verify --bin "${GRIDFSCTL:-$top/gridfsctl}" -- --prefix posters/00/ --read batched
run $b verify --bin "${GRIDFSCTL:-$top/gridfsctl}" -- --prefix posters/00/ --read scan
run $b verify --bin "${GRIDFSCTL:-$top/gridfsctl}" -- --prefix posters --against /tmp/posters-52k
