# What the harness scripts of bench/service share, sourced after `set -euo
# pipefail`: `needs CMD...` stops at the first command missing; WORK is a
# scratch directory and PIDS the processes started, both gone on exit;
# `port` is a free loopback port and `wait_port P` waits (10 s at most) for
# one to open; `nginx_conf` writes $WORK/nginx.conf, the http block's body
# read from its input.
needs() {
	for cmd in "$@"; do
		command -v "$cmd" >/dev/null || { echo "$(basename "$0"): $cmd is not installed" >&2; exit 2; }
	done
}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
nginx_conf() {
	{
		cat <<EOF
daemon off; master_process on; worker_processes 2; pid $WORK/nginx.pid; error_log $WORK/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/b; proxy_temp_path $WORK/p; fastcgi_temp_path $WORK/f; uwsgi_temp_path $WORK/u; scgi_temp_path $WORK/s;
EOF
		cat
		echo "}"
	} >"$WORK/nginx.conf"
}
