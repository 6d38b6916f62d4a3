#!/usr/bin/env bash
# Overhead of the inferroute gateway, measured side by side in one run on
# loopback: wrk against (1) a backend directly, (2) nginx as a round-robin
# proxy to the same backends, (3) the gateway (body parsing, prompt hashing,
# routing table, scoring, picking, proxying). Two bodies: a 1 KB chat
# request and a 220 KB prompt. Prints a table of requests/s and p50/p99.
#
# Usage: benchmarks/overhead/run.sh            (from anywhere in the repo)
# Environment: DURATION (10s per run), CONNS (150), THREADS (2),
#              BACKENDS (2), ROUNDS (3), BASE_PORT (18100).
# Everything listens on 127.0.0.1 only. The targets are measured in
# alternation, ROUNDS times, and the table shows each one's median round
# (by requests/s), so that a burst of other load on the machine does not
# fall on one target only.
set -euo pipefail

DURATION=${DURATION:-10s}
CONNS=${CONNS:-150}
THREADS=${THREADS:-2}
BACKENDS=${BACKENDS:-2}
ROUNDS=${ROUNDS:-3}
BASE_PORT=${BASE_PORT:-18100}

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/inferroute-overhead.XXXXXX)
PIDS=()

cleanup() {
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

log() { echo "overhead: $*" >&2; }

# --- tools -----------------------------------------------------------------
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
	log "installing wrk and nginx with apt-get"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq wrk nginx-light >/dev/null
fi
NGINX=$(command -v nginx)

log "building backend and gateway"
(cd "$ROOT" && go build -o "$WORK/backend" ./benchmarks/overhead/backend)
(cd "$ROOT" && go build -o "$WORK/gateway" ./examples/gateway)

# --- processes -------------------------------------------------------------
wait_port() {
	for _ in $(seq 1 200); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
		sleep 0.05
	done
	log "port $1 did not open"
	exit 1
}

UPSTREAMS=""
ENDPOINTS=""
for i in $(seq 1 "$BACKENDS"); do
	port=$((BASE_PORT + i))
	"$WORK/backend" -listen "127.0.0.1:$port" &
	PIDS+=($!)
	UPSTREAMS+="    server 127.0.0.1:$port;"$'\n'
	ENDPOINTS+="      - {name: be-$i, address: 127.0.0.1:$port, engine: vllm}"$'\n'
done
DIRECT_PORT=$((BASE_PORT + 1))
NGINX_PORT=$((BASE_PORT + 80))
GATEWAY_PORT=$((BASE_PORT + 90))

mkdir -p "$WORK/nginx/logs"
USER_LINE=""
if [ "$(id -u)" = 0 ]; then USER_LINE="user root;"; fi
cat >"$WORK/nginx/nginx.conf" <<EOF
$USER_LINE
worker_processes auto;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_max_body_size 8m;
  client_body_buffer_size 512k;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  upstream backends {
$UPSTREAMS
    keepalive 256;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://backends;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" &
PIDS+=($!)

cat >"$WORK/gateway.yaml" <<EOF
listen: 127.0.0.1:$GATEWAY_PORT
logLevel: warn
scrape: {interval: 50ms}
pools:
  - name: llama
    models: [meta-llama/Llama-3.1-8B-Instruct]
    endpoints:
$ENDPOINTS
EOF
"$WORK/gateway" -config "$WORK/gateway.yaml" &
PIDS+=($!)

wait_port "$DIRECT_PORT"
wait_port "$NGINX_PORT"
wait_port "$GATEWAY_PORT"

# --- bodies ----------------------------------------------------------------
# A chat completions body of about $1 bytes: a system prompt and a user
# message of English text.
make_body() {
	awk -v size="$1" 'BEGIN {
		s = "The quick brown fox jumps over the lazy dog while the model server keeps its cache warm. "
		text = ""
		while (length(text) < size - 220) text = text s
		text = substr(text, 1, size - 220)
		printf "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":64,\"temperature\":0.7,\"user\":\"bench\"}", text
	}'
}
make_body 1024 >"$WORK/body-1KB.json"
make_body $((220 * 1024)) >"$WORK/body-220KB.json"

cat >"$WORK/post.lua" <<'EOF'
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
EOF

# Check that every target answers before measuring.
for port in "$DIRECT_PORT" "$NGINX_PORT" "$GATEWAY_PORT"; do
	code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
		--data-binary @"$WORK/body-1KB.json" "http://127.0.0.1:$port/v1/chat/completions")
	if [ "$code" != 200 ]; then
		log "port $port answered $code"
		exit 1
	fi
done

# --- runs ------------------------------------------------------------------
# run NAME PORT BODY [CONNS THREADS] prints "name body rps p50ms p99ms errors".
run() {
	local out
	out=$(BODY_FILE="$WORK/body-$3.json" wrk -t"${5:-$THREADS}" -c"${4:-$CONNS}" -d"$DURATION" --latency \
		-s "$WORK/post.lua" "http://127.0.0.1:$2/v1/chat/completions")
	echo "$out" >"$WORK/wrk-$1-$3-${4:-$CONNS}.txt"
	echo "$out" | awk -v name="$1" -v body="$3" '
		function ms(v) {
			if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
			if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
			if (v ~ /m$/) return substr(v, 1, length(v) - 1) * 60000
			if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000
			return v + 0
		}
		$1 == "50%" { p50 = ms($2) }
		$1 == "99%" { p99 = ms($2) }
		$1 == "Requests/sec:" { rps = $2 }
		/Non-2xx or 3xx responses:/ { errs += $NF }
		/Socket errors:/ { gsub(/,/, ""); errs += $4 + $6 + $8 + $10 }
		END { printf "%s %s %.0f %.3f %.3f %d\n", name, body, rps, p50, p99, errs }'
}

RESULTS=()
for round in $(seq 1 "$ROUNDS"); do
	for body in 1KB 220KB; do
		for target in direct:$DIRECT_PORT nginx:$NGINX_PORT gateway:$GATEWAY_PORT; do
			name=${target%%:*}
			port=${target##*:}
			log "round $round/$ROUNDS: wrk $name $body ($CONNS connections, $DURATION)"
			line=$(run "$name" "$port" "$body")
			log "  $line"
			RESULTS+=("$line")
		done
	done
done
MEDIANS=()
for body in 1KB 220KB; do
	for name in direct nginx gateway; do
		MEDIANS+=("$(printf '%s\n' "${RESULTS[@]}" | awk -v n="$name" -v b="$body" '$1 == n && $2 == b' |
			sort -k3,3n | sed -n "$(((ROUNDS + 1) / 2))p")")
	done
done

# Unloaded latency: one connection, so the p99 difference is the time each
# proxy adds to a request rather than queueing behind the other 149.
UNLOADED=()
for body in 1KB 220KB; do
	for target in direct:$DIRECT_PORT nginx:$NGINX_PORT gateway:$GATEWAY_PORT; do
		name=${target%%:*}
		port=${target##*:}
		log "unloaded: wrk $name $body (1 connection, $DURATION)"
		line=$(run "$name" "$port" "$body" 1 1)
		log "  $line"
		UNLOADED+=("$line")
	done
done

# --- table -----------------------------------------------------------------
echo
echo "inferroute overhead: wrk -t$THREADS -c$CONNS -d$DURATION, $BACKENDS backends, $(nproc) CPUs, loopback, median of $ROUNDS rounds"
printf '%s\n' "${MEDIANS[@]}" | awk '
	{ rps[$1 "/" $2] = $3; p50[$1 "/" $2] = $4; p99[$1 "/" $2] = $5; errs[$1 "/" $2] = $6; order[n++] = $1 "/" $2 }
	END {
		printf "| %-8s | %-5s | %10s | %9s | %9s | %6s |\n", "target", "body", "req/s", "p50 ms", "p99 ms", "errors"
		printf "|----------|-------|------------|-----------|-----------|--------|\n"
		for (i = 0; i < n; i++) {
			k = order[i]; split(k, a, "/")
			printf "| %-8s | %-5s | %10.0f | %9.2f | %9.2f | %6d |\n", a[1], a[2], rps[k], p50[k], p99[k], errs[k]
		}
		for (b = 1; b <= 2; b++) {
			body = (b == 1) ? "1KB" : "220KB"
			g = "gateway/" body; x = "nginx/" body; d = "direct/" body
			printf "%s: gateway/nginx req/s = %.2f (target >= 0.5); gateway p99 - direct p99 = %.2f ms\n",
				body, (rps[x] > 0 ? rps[g] / rps[x] : 0), p99[g] - p99[d]
		}
	}'
echo
echo "unloaded: wrk -t1 -c1 -d$DURATION, one round"
printf '%s\n' "${UNLOADED[@]}" | awk '
	{ rps[$1 "/" $2] = $3; p50[$1 "/" $2] = $4; p99[$1 "/" $2] = $5; errs[$1 "/" $2] = $6; order[n++] = $1 "/" $2 }
	END {
		printf "| %-8s | %-5s | %10s | %9s | %9s | %6s |\n", "target", "body", "req/s", "p50 ms", "p99 ms", "errors"
		printf "|----------|-------|------------|-----------|-----------|--------|\n"
		for (i = 0; i < n; i++) {
			k = order[i]; split(k, a, "/")
			printf "| %-8s | %-5s | %10.0f | %9.3f | %9.3f | %6d |\n", a[1], a[2], rps[k], p50[k], p99[k], errs[k]
		}
		for (b = 1; b <= 2; b++) {
			body = (b == 1) ? "1KB" : "220KB"
			printf "%s unloaded: gateway p99 - direct p99 = %.3f ms (target for 220KB <= 5)\n", body, p99["gateway/" body] - p99["direct/" body]
		}
	}'
