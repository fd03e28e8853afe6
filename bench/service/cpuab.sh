#!/usr/bin/env bash
# The CPU a request of two builds of `sluice gateway`, side by side: each
# forwards to the same nginx upstream under wrk -t2 -c64, in alternating
# rounds, and the process's user and system time (from /proc) is divided
# by the requests it served. Throughput on a shared 2-core machine moves
# by a tenth from run to run; the CPU a request moves much less, so a
# change of a few percent in what the gateway spends shows here first.
#
#   bench/service/cpuab.sh OLD_BINARY NEW_BINARY [rounds] [seconds] [path]
#
# (defaults: 5 rounds of 5 s on "/"; "/strict" measures refusals;
# PLANE=net/http measures that data plane instead of fasthttp). Each
# binary is a `sluice` built with `go build ./cmd/sluice`, for example from
# `git worktree add /tmp/old <commit>`. Needs wrk and nginx.
set -euo pipefail
OLD=$1
NEW=$2
ROUNDS=${3:-5}
SECS=${4:-5}
URLPATH=${5:-/}
PLANE=${PLANE:-fasthttp}
source "$(dirname "$0")/lib.sh"
needs wrk nginx python3

UP=$(port); OP=$(port); NP=$(port)
nginx_conf <<EOF
  server { listen 127.0.0.1:$UP; location / { return 200 "ok\n"; } }
EOF
nginx -p "$WORK" -c "$WORK/nginx.conf" -e "$WORK/error.log" & PIDS+=($!)
cat >"$WORK/gw.yaml" <<EOF
rules:
  - {id: loose, key: [ip], rate: 1000000000, per: 1s}
  - {id: strict, match: {path: /strict}, key: [ip], rate: 1, per: 1h}
EOF
"$OLD" gateway --config "$WORK/gw.yaml" --upstream "http://127.0.0.1:$UP" --listen "127.0.0.1:$OP" --admin-listen "" --watch 0 --data-plane "$PLANE" >/dev/null 2>&1 & PIDS+=($!); OPID=$!
"$NEW" gateway --config "$WORK/gw.yaml" --upstream "http://127.0.0.1:$UP" --listen "127.0.0.1:$NP" --admin-listen "" --watch 0 --data-plane "$PLANE" >/dev/null 2>&1 & PIDS+=($!); NPID=$!
for p in $UP $OP $NP; do wait_port "$p"; done

TCK=$(getconf CLK_TCK)
cputimes() { awk '{print $14, $15}' "/proc/$1/stat"; } # user and system, in ticks
echo "build  req/s   user us/req  system us/req"
for r in $(seq "$ROUNDS"); do
	for side in old new; do
		if [ $side = old ]; then p=$OP; pid=$OPID; else p=$NP; pid=$NPID; fi
		wrk -t2 -c64 -d1s "http://127.0.0.1:$p$URLPATH" >/dev/null # warm
		read -r u0 s0 < <(cputimes $pid)
		n=$(wrk -t2 -c64 -d"${SECS}s" "http://127.0.0.1:$p$URLPATH" | awk '/requests in/ {print $1}')
		read -r u1 s1 < <(cputimes $pid)
		awk -v side=$side -v n="$n" -v secs="$SECS" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v t="$TCK" \
			'BEGIN {printf "%-5s %7.0f %11.2f %14.2f\n", side, n / secs, u / t / n * 1e6, s / t / n * 1e6}'
	done
done
echo "machine: $(nproc) cores, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(date -u +%F)"
