#!/usr/bin/env bash
# Side by side, in one run, on loopback: sluice's gateway against nginx's
# limit_req, HAProxy with a stick-table limit and a bare nginx proxy (same
# upstream, same load), and sluice's Envoy rate limit service against
# envoyproxy/ratelimit (same redis-server, same load; driven by sluice's own
# HTTP/2 load generator and by nghttp2's h2load), and their JSON APIs
# (sluice's /v1/check, the reference's /json), in rotating order for several
# rounds. Prints each contender's median, min and max, and the ratios the
# targets are stated in.
#
#   bench/service/run.sh [rounds] [seconds]        (defaults: 3 rounds of 5 s)
#
# PARTS="grpc" (or "http", or "json", or two of them) runs only those parts. The gRPC load generator
# speaks HTTP/2 itself over one connection, as Envoy's C++ client does, and
# checks every answer; GRPC_CLIENT=grpc-go uses grpc-go's client instead,
# which spends about as much CPU per call as the services it measures.
#
# Needs wrk, nginx, haproxy, redis-server and h2load (Debian packages wrk,
# nginx, haproxy, redis-server, nghttp2-client). For
# envoyproxy/ratelimit set RATELIMIT_BIN to a binary of it, for example built
# from a checkout of github.com/envoyproxy/ratelimit with
#   go build -o /tmp/ratelimit ./src/service_cmd
# Not part of `go test ./...`: it takes minutes and wants a quiet machine.
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-5}
PARTS=${PARTS:-http grpc json}
GRPC_CLIENT=${GRPC_CLIENT:-h2}
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
needs wrk nginx haproxy h2load redis-server python3

echo "building sluice and the gRPC load generator"
go build -o "$WORK/sluice" ./cmd/sluice
(cd bench && go build -o "$WORK/grpcload" ./service/grpcload && go build -o "$WORK/bareproxy" ./service/bareproxy && go build -o "$WORK/loopceiling" ./service/loopceiling)

UP=$(port); NGL=$(port); NGB=$(port); SLF=$(port); SLN=$(port); HAP=$(port); FHB=$(port); LCP=$(port); LCG=$(port); LCD=$(port)
# nginx's limits, in a file of their own: nginx includes it, and the
# gateway runs the rules `sluice import nginx` writes from it, so the two
# apply the same limits (on /strict, strict's alone: nginx's location
# /strict does not apply loose).
cat >"$WORK/limit.conf" <<EOF
limit_req_zone \$binary_remote_addr zone=loose:10m rate=100000000r/s;
limit_req_zone \$binary_remote_addr zone=strict:10m rate=1r/m;
limit_req_status 429;
server { listen 127.0.0.1:$NGL;
  location / { limit_req zone=loose burst=100000 nodelay; proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  location /strict { limit_req zone=strict; proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; } }
EOF
nginx_conf <<EOF
  upstream app { server 127.0.0.1:$UP; keepalive 256; }
  server { listen 127.0.0.1:$UP; location / { return 200 "ok\n"; } }
  include $WORK/limit.conf;
  server { listen 127.0.0.1:$NGB; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; } }
EOF
nginx -p "$WORK" -c "$WORK/nginx.conf" -e "$WORK/error.log" & PIDS+=($!)
# HAProxy: the usual stick-table limit per source address (track-sc0 src,
# deny deny_status 429), a loose one off /strict and one of 1 an hour on
# it (one table a request, as nginx's locations), two threads as nginx has
# two workers.
cat >"$WORK/haproxy.cfg" <<EOF
global
  maxconn 8000
  nbthread 2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:$HAP
  http-request track-sc0 src table loose if !{ path_beg /strict }
  http-request deny deny_status 429 if !{ path_beg /strict } { sc_http_req_rate(0,loose) gt 1000000000 }
  http-request track-sc1 src table strict if { path_beg /strict }
  http-request deny deny_status 429 if { path_beg /strict } { sc_http_req_rate(1,strict) gt 1 }
  default_backend app
backend loose
  stick-table type ip size 100k expire 10s store http_req_rate(1s)
backend strict
  stick-table type ip size 100k expire 1h store http_req_rate(1h)
backend app
  http-reuse always
  server up 127.0.0.1:$UP maxconn 1000
EOF
haproxy -db -f "$WORK/haproxy.cfg" >/dev/null 2>&1 & PIDS+=($!)
# The gateway's HTTP stack with no limiter: what the stack costs, apart from sluice.
"$WORK/bareproxy" -listen "127.0.0.1:$FHB" -upstream "127.0.0.1:$UP" >/dev/null 2>&1 & PIDS+=($!)
# The gateway's 429 bytes for every request, no decision made and nothing
# parsed past the blank line: how fast a refusal can go out on this
# machine at all, from an event loop per core on its own epoll (gnet, as
# nginx and HAProxy are built) and from a goroutine per connection on Go's
# network poller (as every Go HTTP server is built, the gateway's planes
# among them).
"$WORK/loopceiling" -listen "127.0.0.1:$LCP" >/dev/null 2>&1 & PIDS+=($!)
"$WORK/loopceiling" -mode goroutine -listen "127.0.0.1:$LCG" >/dev/null 2>&1 & PIDS+=($!)
"$WORK/sluice" import nginx "$WORK/limit.conf" >"$WORK/gw.yaml"
# The event loop again, each request parsed by fasthttp's parser and
# decided by sluice's engine on the gateway's rules, its refusal rendered
# as the gateway renders it; no forwarding, no observability: what a plane
# of the gateway's own on an event loop could do at most.
"$WORK/loopceiling" -mode decide -config "$WORK/gw.yaml" -listen "127.0.0.1:$LCD" >/dev/null 2>&1 & PIDS+=($!)
"$WORK/sluice" gateway --config "$WORK/gw.yaml" --upstream "http://127.0.0.1:$UP" --listen "127.0.0.1:$SLF" --admin-listen "" --watch 0 --data-plane fasthttp >/dev/null 2>&1 & PIDS+=($!)
"$WORK/sluice" gateway --config "$WORK/gw.yaml" --upstream "http://127.0.0.1:$UP" --listen "127.0.0.1:$SLN" --admin-listen "" --watch 0 --data-plane net/http >/dev/null 2>&1 & PIDS+=($!)
for p in $UP $NGL $NGB $SLF $SLN $HAP $FHB $LCP $LCG $LCD; do wait_port "$p"; done

# wrk prints "Requests/sec: N" and, with --latency, "99% X"; X is in us, ms or s.
run_wrk() { # url -> "rps p99_ms"
	wrk -t2 -c64 -d"${SECS}s" --latency "$1" 2>/dev/null | awk '
		/Requests\/sec/ {rps=$2}
		/^ +99%/ {v=$2; u=v; gsub(/[0-9.]/,"",u); gsub(/[a-z]/,"",v); if(u=="us")v/=1000; if(u=="s")v*=1000; p99=v}
		END {printf "%.0f %.3f\n", rps, p99}'
}
declare -A RES
record() { RES[$1]="${RES[$1]:-} $2"; }

HTTP=("nginx-limit_req=$NGL" "nginx-bare=$NGB" "haproxy-stick-table=$HAP" "fasthttp-bare=$FHB" "sluice-fasthttp=$SLF" "sluice-net/http=$SLN" "gnet-429=$LCP" "goroutine-429=$LCG" "gnet-decide-429=$LCD")
for r in $([[ $PARTS == *http* ]] && seq "$ROUNDS"); do
	for i in "${!HTTP[@]}"; do
		c=${HTTP[$(( (i + r) % ${#HTTP[@]} ))]}; name=${c%%=*}; p=${c#*=}
		if [[ $name != *-429 ]]; then # they refuse everything
			read -r rps p99 < <(run_wrk "http://127.0.0.1:$p/")
			record "$name/allow/rps" "$rps"; record "$name/allow/p99" "$p99"
		fi
		if [ "$name" != nginx-bare ]; then
			read -r rps p99 < <(run_wrk "http://127.0.0.1:$p/strict")
			record "$name/reject/rps" "$rps"; record "$name/reject/p99" "$p99"
		fi
		echo "round $r: $name done" >&2
	done
done

# The gRPC service: sluice (Redis and embedded) against envoyproxy/ratelimit
# (defaults and its documented tuning) on one redis-server.
RP=$(port); redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & PIDS+=($!); wait_port "$RP"
mkdir -p "$WORK/rt/ratelimit/config"
cat >"$WORK/rt/ratelimit/config/bench.yaml" <<EOF
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: h2load
    value: allowed
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: h2load
    value: over
    rate_limit: {unit: second, requests_per_unit: 1}
EOF
# The JSON API's rule: the same limit (a fixed window, as the reference's), keyed
# by the request's attribute.
cat >"$WORK/api.yaml" <<EOF
rules:
  - {id: api, key: [user], rate: 1000, per: 1s, algorithm: fixed-window}
EOF
G1=$(port); G2=$(port); G3=$(port); J1=$(port); J2=$(port)
"$WORK/sluice" serve --config "$WORK/rt/ratelimit/config/bench.yaml" --config "$WORK/api.yaml" --listen "127.0.0.1:$J1" --grpc-listen "127.0.0.1:$G1" --store "redis://127.0.0.1:$RP" --watch 0 >/dev/null 2>&1 & PIDS+=($!)
"$WORK/sluice" serve --config "$WORK/rt/ratelimit/config/bench.yaml" --config "$WORK/api.yaml" --listen "127.0.0.1:$J2" --grpc-listen "127.0.0.1:$G2" --watch 0 >/dev/null 2>&1 & PIDS+=($!)
# The same service on grpc-go instead of sluice's own gRPC server, for the
# difference the server makes.
"$WORK/sluice" serve --config "$WORK/rt/ratelimit/config/bench.yaml" --listen "127.0.0.1:$(port)" --grpc-listen "127.0.0.1:$G3" --grpc-server grpc-go --watch 0 >/dev/null 2>&1 & PIDS+=($!)
GRPC=("sluice-redis=$G1" "sluice-embedded=$G2" "sluice-embedded-grpc-go=$G3")
JSON=("sluice-redis=$J1/v1/check" "sluice-embedded=$J2/v1/check")
if [ -n "${RATELIMIT_BIN:-}" ]; then
	for variant in defaults tuned; do
		G=$(port); H=$(port)
		env -i PATH="$PATH" USE_STATSD=false LOG_LEVEL=error RUNTIME_ROOT="$WORK/rt" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
			REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" GRPC_HOST=127.0.0.1 GRPC_PORT="$G" HOST=127.0.0.1 PORT="$H" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(port)" \
			$( [ $variant = tuned ] && echo REDIS_PIPELINE_WINDOW=150us REDIS_PIPELINE_LIMIT=8 LOCAL_CACHE_SIZE_IN_BYTES=1048576 ) \
			"$RATELIMIT_BIN" >/dev/null 2>&1 & PIDS+=($!)
		GRPC+=("ratelimit-$variant=$G")
		[ $variant = tuned ] && JSON+=("ratelimit-tuned=$H/json") # its JSON endpoint
	done
fi
for c in "${GRPC[@]}"; do wait_port "${c#*=}"; done
for r in $([[ $PARTS == *grpc* ]] && seq "$ROUNDS"); do
	for i in "${!GRPC[@]}"; do
		c=${GRPC[$(( (i + r) % ${#GRPC[@]} ))]}; name=${c%%=*}; p=${c#*=}
		read -r _ rps _ _ _ p99 _ errs _ < <("$WORK/grpcload" -addr "127.0.0.1:$p" -c 64 -d "${SECS}s" -domain bench -keys 1000 -client "$GRPC_CLIENT")
		record "$name/grpc/rps" "$rps"; record "$name/grpc/p99" "$p99"; record "$name/grpc/errors" "$errs"
		# Redis bytes per key for the same rules, at once (the keys live about
		# a second past their 1 s window): MEMORY USAGE averaged over every
		# key the contender just wrote, sluice's {9:user=k999}bench.user82qjF
		# against the reference's bench_user_k999_1796038982.
		case $name in
		sluice-redis) pat='{*}bench.user?????' ;;
		ratelimit-*) pat='bench_user_*' ;;
		*) pat='' ;;
		esac
		if [ -n "$pat" ]; then
			read -r n bytes < <(redis-cli -p "$RP" --raw EVAL "local n,s,c=0,0,'0' repeat local r=redis.call('SCAN',c,'MATCH',ARGV[1],'COUNT',1000) c=r[1] for _,k in ipairs(r[2]) do s=s+redis.call('MEMORY','USAGE',k,'SAMPLES','0') n=n+1 end until c=='0' return {n,s}" 0 "$pat" | paste -sd' ')
			[ "${n:-0}" -gt 0 ] && record "${name%-*}/redis/bytes-per-key" "$(awk -v s="$bytes" -v n="$n" 'BEGIN {printf "%.1f", s / n}')"
			redis-cli -p "$RP" flushall >/dev/null # the next contender starts on an empty Redis
		fi
		echo "round $r: $name done" >&2
	done
done

# The same gRPC contenders with nghttp2's h2load as the client (the HTTP/2
# library of Envoy's family): one connection with 64 calls in flight, one
# request repeated, on a descriptor always allowed and on one almost always
# over its limit. h2load counts HTTP statuses only; every contender answers
# these calls with grpc-status 0 (OK and OVER_LIMIT are both answers).
# p99 from h2load's per-request log.
mkreq() { python3 - "$1" "$2" <<'PY'
import struct, sys
def s(f, b): return bytes([f << 3 | 2]) + bytes([len(b)]) + b
entry = s(1, b"h2load") + s(2, sys.argv[1].encode())
req = s(1, b"bench") + s(2, s(1, entry))
open(sys.argv[2], "wb").write(b"\0" + struct.pack(">I", len(req)) + req)
PY
}
mkreq allowed "$WORK/h2-allowed.bin"; mkreq over "$WORK/h2-over.bin"
run_h2load() { # port body -> "rps p99_ms errors"
	rm -f "$WORK/h2.log"
	out=$(h2load -D "$SECS" -c 1 -m 64 -t 1 --warm-up-time=1 -d "$2" -H 'content-type: application/grpc' -H 'te: trailers' \
		--log-file="$WORK/h2.log" "http://127.0.0.1:$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" 2>&1)
	rps=$(echo "$out" | awk '/^finished in/ {print int($4)}')
	bad=$(echo "$out" | awk '/^requests:/ {print $10 + $12 + $14}') # failed + errored + timeout
	non2xx=$(echo "$out" | awk '/^status codes:/ {print $5 + $7 + $9}')
	p99=$(awk '{print $3}' "$WORK/h2.log" | sort -n | awk '{a[NR]=$1} END {if (NR) printf "%.3f", a[int(NR*0.99)]/1000; else print 0}')
	echo "${rps:-0} ${p99:-0} $(( ${bad:-0} + ${non2xx:-0} ))"
}
for r in $([[ $PARTS == *grpc* ]] && seq "$ROUNDS"); do
	for i in "${!GRPC[@]}"; do
		c=${GRPC[$(( (i + r) % ${#GRPC[@]} ))]}; name=${c%%=*}; p=${c#*=}
		for kind in allowed over; do
			read -r rps p99 errs < <(run_h2load "$p" "$WORK/h2-$kind.bin")
			record "$name/h2load-$kind/rps" "$rps"; record "$name/h2load-$kind/p99" "$p99"; record "$name/h2load-$kind/errors" "$errs"
		done
		redis-cli -p "$RP" flushall >/dev/null
		echo "round $r: $name h2load done" >&2
	done
done

# The JSON API, 1,000 users, wrk generating each body: sluice's POST
# /v1/check with the user as an attribute, the reference's POST /json with
# the descriptor.
cat >"$WORK/sluice.lua" <<'EOF'
local i = 0
request = function()
  i = i + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, '{"attributes":{"user":"k' .. (i % 1000) .. '"}}')
end
EOF
cat >"$WORK/ratelimit.lua" <<'EOF'
local i = 0
request = function()
  i = i + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, '{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"k' .. (i % 1000) .. '"}]}]}')
end
EOF
for c in "${JSON[@]}"; do p=${c#*=}; wait_port "${p%%/*}"; done
for r in $([[ $PARTS == *json* ]] && seq "$ROUNDS"); do
	for i in "${!JSON[@]}"; do
		c=${JSON[$(( (i + r) % ${#JSON[@]} ))]}; name=${c%%=*}; target=${c#*=}
		script=sluice.lua; [[ $name == ratelimit-* ]] && script=ratelimit.lua
		out=$(wrk -t2 -c64 -d"${SECS}s" --latency -s "$WORK/$script" "http://127.0.0.1:$target" 2>/dev/null)
		read -r rps p99 < <(echo "$out" | awk '
			/Requests\/sec/ {rps=$2}
			/^ +99%/ {v=$2; u=v; gsub(/[0-9.]/,"",u); gsub(/[a-z]/,"",v); if(u=="us")v/=1000; if(u=="s")v*=1000; p99=v}
			END {printf "%.0f %.3f\n", rps, p99}')
		bad=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
		record "$name/json/rps" "$rps"; record "$name/json/p99" "$p99"; record "$name/json/non-2xx" "${bad:-0}"
		redis-cli -p "$RP" flushall >/dev/null
		echo "round $r: $name json done" >&2
	done
done

stats() { echo "$1" | tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {printf "%s %s %s\n", a[int((NR+1)/2)], a[1], a[NR]}'; }
med() { stats "$1" | cut -d' ' -f1; }
printf '\n%-34s %12s %12s %12s\n' "contender/path/metric" median min max
for k in $(printf '%s\n' "${!RES[@]}" | sort); do
	read -r m lo hi < <(stats "${RES[$k]}")
	printf '%-34s %12s %12s %12s\n' "$k" "$m" "$lo" "$hi"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }
echo
echo "ratios (medians):"
echo "  gateway (fasthttp) / nginx limit_req, requests/s allowed: $(ratio "$(med "${RES[sluice-fasthttp/allow/rps]:-}")" "$(med "${RES[nginx-limit_req/allow/rps]:-}")")"
echo "  gateway (fasthttp) / nginx limit_req, p99 allowed:        $(ratio "$(med "${RES[sluice-fasthttp/allow/p99]:-}")" "$(med "${RES[nginx-limit_req/allow/p99]:-}")")"
echo "  gateway (fasthttp) / nginx limit_req, requests/s 429:     $(ratio "$(med "${RES[sluice-fasthttp/reject/rps]:-}")" "$(med "${RES[nginx-limit_req/reject/rps]:-}")")"
echo "  gateway (net/http) / nginx limit_req, requests/s allowed: $(ratio "$(med "${RES[sluice-net/http/allow/rps]:-}")" "$(med "${RES[nginx-limit_req/allow/rps]:-}")")"
echo "  gateway (fasthttp) / nginx limit_req, p99 429:            $(ratio "$(med "${RES[sluice-fasthttp/reject/p99]:-}")" "$(med "${RES[nginx-limit_req/reject/p99]:-}")")"
echo "  bare fasthttp proxy (no limiter) / nginx limit_req, allowed: $(ratio "$(med "${RES[fasthttp-bare/allow/rps]:-}")" "$(med "${RES[nginx-limit_req/allow/rps]:-}")")"
echo "  gateway (fasthttp) / bare fasthttp proxy, allowed:        $(ratio "$(med "${RES[sluice-fasthttp/allow/rps]:-}")" "$(med "${RES[fasthttp-bare/allow/rps]:-}")")"
echo "  bare fasthttp 429 (no decision) / nginx limit_req, 429:   $(ratio "$(med "${RES[fasthttp-bare/reject/rps]:-}")" "$(med "${RES[nginx-limit_req/reject/rps]:-}")")"
echo "  gateway (fasthttp) / bare fasthttp 429, requests/s 429:   $(ratio "$(med "${RES[sluice-fasthttp/reject/rps]:-}")" "$(med "${RES[fasthttp-bare/reject/rps]:-}")")"
echo "  event loop 429 (gnet, no decision) / nginx limit_req, 429: $(ratio "$(med "${RES[gnet-429/reject/rps]:-}")" "$(med "${RES[nginx-limit_req/reject/rps]:-}")")"
echo "  event loop 429 (gnet, no decision) / HAProxy, 429:         $(ratio "$(med "${RES[gnet-429/reject/rps]:-}")" "$(med "${RES[haproxy-stick-table/reject/rps]:-}")")"
echo "  goroutine 429 (Go's poller, no decision) / nginx limit_req, 429: $(ratio "$(med "${RES[goroutine-429/reject/rps]:-}")" "$(med "${RES[nginx-limit_req/reject/rps]:-}")")"
echo "  gateway (fasthttp) / goroutine 429, requests/s 429:       $(ratio "$(med "${RES[sluice-fasthttp/reject/rps]:-}")" "$(med "${RES[goroutine-429/reject/rps]:-}")")"
echo "  event loop deciding (gnet, parsed and decided) / nginx limit_req, 429: $(ratio "$(med "${RES[gnet-decide-429/reject/rps]:-}")" "$(med "${RES[nginx-limit_req/reject/rps]:-}")")"
echo "  event loop deciding (gnet, parsed and decided) / HAProxy, 429:         $(ratio "$(med "${RES[gnet-decide-429/reject/rps]:-}")" "$(med "${RES[haproxy-stick-table/reject/rps]:-}")")"
echo "  gateway (fasthttp) / HAProxy stick table, requests/s allowed: $(ratio "$(med "${RES[sluice-fasthttp/allow/rps]:-}")" "$(med "${RES[haproxy-stick-table/allow/rps]:-}")")"
echo "  gateway (fasthttp) / HAProxy stick table, p99 allowed:        $(ratio "$(med "${RES[sluice-fasthttp/allow/p99]:-}")" "$(med "${RES[haproxy-stick-table/allow/p99]:-}")")"
echo "  gateway (fasthttp) / HAProxy stick table, requests/s 429:     $(ratio "$(med "${RES[sluice-fasthttp/reject/rps]:-}")" "$(med "${RES[haproxy-stick-table/reject/rps]:-}")")"
if [ -n "${RATELIMIT_BIN:-}" ]; then
	echo "  gRPC sluice Redis / envoyproxy/ratelimit tuned, decisions/s:    $(ratio "$(med "${RES[sluice-redis/grpc/rps]:-}")" "$(med "${RES[ratelimit-tuned/grpc/rps]:-}")")"
	echo "  gRPC sluice Redis / envoyproxy/ratelimit tuned, p99:            $(ratio "$(med "${RES[sluice-redis/grpc/p99]:-}")" "$(med "${RES[ratelimit-tuned/grpc/p99]:-}")")"
	echo "  gRPC sluice Redis / envoyproxy/ratelimit defaults, decisions/s: $(ratio "$(med "${RES[sluice-redis/grpc/rps]:-}")" "$(med "${RES[ratelimit-defaults/grpc/rps]:-}")")"
	echo "  gRPC (h2load) sluice Redis / envoyproxy/ratelimit tuned, allowed:     $(ratio "$(med "${RES[sluice-redis/h2load-allowed/rps]:-}")" "$(med "${RES[ratelimit-tuned/h2load-allowed/rps]:-}")")"
	echo "  gRPC (h2load) sluice Redis / envoyproxy/ratelimit tuned, p99 allowed: $(ratio "$(med "${RES[sluice-redis/h2load-allowed/p99]:-}")" "$(med "${RES[ratelimit-tuned/h2load-allowed/p99]:-}")")"
	echo "  gRPC (h2load) sluice Redis / envoyproxy/ratelimit tuned, over limit:  $(ratio "$(med "${RES[sluice-redis/h2load-over/rps]:-}")" "$(med "${RES[ratelimit-tuned/h2load-over/rps]:-}")")"
	echo "  gRPC sluice embedded / envoyproxy/ratelimit tuned, decisions/s: $(ratio "$(med "${RES[sluice-embedded/grpc/rps]:-}")" "$(med "${RES[ratelimit-tuned/grpc/rps]:-}")")"
	echo "  gRPC sluice embedded / envoyproxy/ratelimit tuned, p99:         $(ratio "$(med "${RES[sluice-embedded/grpc/p99]:-}")" "$(med "${RES[ratelimit-tuned/grpc/p99]:-}")")"
	echo "  JSON sluice Redis / envoyproxy/ratelimit tuned /json, decisions/s:    $(ratio "$(med "${RES[sluice-redis/json/rps]:-}")" "$(med "${RES[ratelimit-tuned/json/rps]:-}")")"
	echo "  JSON sluice embedded / envoyproxy/ratelimit tuned /json, decisions/s: $(ratio "$(med "${RES[sluice-embedded/json/rps]:-}")" "$(med "${RES[ratelimit-tuned/json/rps]:-}")")"
	echo "  Redis bytes/key, sluice / envoyproxy/ratelimit:                 $(ratio "$(med "${RES[sluice/redis/bytes-per-key]:-}")" "$(med "${RES[ratelimit/redis/bytes-per-key]:-}")")"
fi
echo "  gRPC sluice embedded, own server / grpc-go, decisions/s:      $(ratio "$(med "${RES[sluice-embedded/grpc/rps]:-}")" "$(med "${RES[sluice-embedded-grpc-go/grpc/rps]:-}")")"
echo
echo "gRPC load generator: $GRPC_CLIENT"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3), $(date -u +%F)"
