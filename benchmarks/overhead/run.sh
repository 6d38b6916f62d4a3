#!/usr/bin/env bash
# Overhead of the inferroute gateway, measured side by side in one run on
# loopback: wrk against (1) a backend directly, (2) nginx as a round-robin
# proxy to the same backends, (3) the gateway (body parsing, prompt hashing,
# routing table, scoring, picking, proxying), and two Go baselines that do
# no routing: (4) minproxy, the least a proxy served by net/http can do (a
# pooled hand-written client, round-robin; minproxy/), whose ratio to nginx
# is the most any net/http gateway can reach on the machine, and
# (5) httputil, the standard library's reverse proxy (httputilproxy/). Two
# bodies: a 1 KB chat request and a 220 KB prompt. Prints a table of
# requests/s and p50/p99.
#
# Three measurements, each the same for every target, in one run:
#   1. saturation: wrk closed loop, CONNS connections, ROUNDS rounds in
#      alternation, each target's median round (by requests/s);
#   2. fixed rate: vegeta (open loop, latency from each request's scheduled
#      start) at the same rate for direct, nginx and the gateway, below
#      each one's saturation (a quarter and half of the lowest saturation
#      rate of the three by default), so that p99 is the proxy's added time
#      more than queueing; and, as a control, nginx and the gateway each at
#      half of its own 220 KB saturation rate, with direct at that rate;
#   3. unloaded: wrk with one connection;
#   and, for the 1 KB ratio, paired slices: nginx, minproxy and the gateway
#   in turn for SLICE each, PAIRS times, so that each set compares them
#   over the same few seconds.
# Pinning: when taskset is present and there are at least 2 CPUs, the load
# generators run on LOAD_CPUS and every server (backends and proxies) on
# SERVER_CPUS, so that the load generator does not take CPU from the
# server under test; nginx gets one worker per server CPU and Go's
# GOMAXPROCS follows the affinity mask.
#
# Usage: benchmarks/overhead/run.sh            (from anywhere in the repo)
# Environment: DURATION (10s per run), CONNS (150), THREADS (wrk threads:
#              one per load CPU), BACKENDS (2), ROUNDS (3), BASE_PORT
#              (18100), PIN (1 = pin when possible, 0 = never), LOAD_CPUS
#              and SERVER_CPUS (taskset lists; default: the first half of
#              the CPUs for load, the rest for servers), LOADS (the
#              fixed rates as fractions of the lowest median saturation
#              rate of direct, nginx and the gateway for that body;
#              "0.25 0.5"), RATE_1KB and RATE_220KB (one fixed rate in
#              req/s for that body instead of LOADS), FIXED=0 to skip the
#              fixed-rate runs, OWN=0 to skip the control runs of nginx
#              and the gateway each at the highest of LOADS times its own
#              220 KB saturation rate, VEGETA (path of a vegeta binary; default:
#              built with go install from the Go module proxy), OUT (a
#              directory to keep the raw outputs and, with PROFILE=1, CPU
#              profiles of the gateway taken during its first saturation
#              run of each body), QUIET (the most steal, in percent of
#              a CPU set's time, that a round may have to count in the
#              quiet-rounds summary; 1), PAIRS (sets of 1 KB paired
#              slices; 10, 0 to skip them) and SLICE (each slice's
#              length; 3s).
# Everything listens on 127.0.0.1 only.
set -euo pipefail

DURATION=${DURATION:-10s}
CONNS=${CONNS:-150}
BACKENDS=${BACKENDS:-2}
ROUNDS=${ROUNDS:-3}
BASE_PORT=${BASE_PORT:-18100}
PIN=${PIN:-1}
FIXED=${FIXED:-1}
OWN=${OWN:-1}
LOADS=${LOADS:-0.25 0.5}
PROFILE=${PROFILE:-0}
PAIRS=${PAIRS:-10}
SLICE=${SLICE:-3s}
QUIET=${QUIET:-1}
OUT=${OUT:-}
VEGETA_VERSION=v12.13.0

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

log "building backend, minproxy, httputilproxy and gateway"
(cd "$ROOT" && go build -o "$WORK/backend" ./benchmarks/overhead/backend)
(cd "$ROOT" && go build -o "$WORK/minproxy" ./benchmarks/overhead/minproxy)
(cd "$ROOT" && go build -o "$WORK/httputilproxy" ./benchmarks/overhead/httputilproxy)
(cd "$ROOT" && go build -o "$WORK/gateway" ./examples/gateway)

VEGETA=${VEGETA:-$(command -v vegeta || true)}
if [ "$FIXED" = 1 ] && [ -z "$VEGETA" ]; then
	log "building vegeta $VEGETA_VERSION (open-loop load generator) with go install"
	if GOBIN="$WORK/bin" GOWORK=off GOFLAGS=-mod=mod go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION" >&2; then
		VEGETA="$WORK/bin/vegeta"
	else
		log "vegeta is not available: skipping the fixed-rate runs"
		FIXED=0
	fi
fi

# --- CPU pinning -------------------------------------------------------------
NCPU=$(nproc)
LOAD=()
SRV=()
if [ "$PIN" = 1 ] && [ "$NCPU" -ge 2 ] && command -v taskset >/dev/null; then
	half=$((NCPU / 2))
	LOAD_CPUS=${LOAD_CPUS:-0-$((half - 1))}
	SERVER_CPUS=${SERVER_CPUS:-$half-$((NCPU - 1))}
	LOAD=(taskset -c "$LOAD_CPUS")
	SRV=(taskset -c "$SERVER_CPUS")
	PINNING="load generators on CPUs $LOAD_CPUS, servers on CPUs $SERVER_CPUS (taskset)"
else
	LOAD_CPUS=""
	SERVER_CPUS=""
	PINNING="not pinned: load generators and servers share all $NCPU CPUs"
fi
# cpu_ids LIST prints the CPU numbers a taskset list names, one per line
# (all CPUs when empty).
cpu_ids() {
	if [ -z "$1" ]; then
		seq 0 $((NCPU - 1))
		return
	fi
	echo "$1" | tr ',' '\n' | awk -F- '{ for (i = $1; i <= (NF == 2 ? $2 : $1); i++) print i }'
}
# count_cpus LIST prints how many CPUs a taskset list names.
count_cpus() { cpu_ids "$1" | wc -l; }
THREADS=${THREADS:-$(count_cpus "$LOAD_CPUS")}
# cpu_snapshot prints, from one reading of /proc/stat, the busy, stolen
# and total jiffies of the server CPUs, then the stolen and total jiffies
# of the load generators' CPUs. Two snapshots give the shares of a round's
# CPU time that the servers used and that the hypervisor gave to other
# guests (steal: on a shared virtual machine, a round with much of it was
# slowed by the neighbours, not by its target; on the load CPUs a stall
# delays the reading of answers, so it shows in the latency measured).
cpu_snapshot() {
	awk -v srv="$(cpu_ids "$SERVER_CPUS")" -v load="$(cpu_ids "$LOAD_CPUS")" '
		BEGIN {
			n = split(srv, a, "\n"); for (i = 1; i <= n; i++) s["cpu" a[i]] = 1
			n = split(load, a, "\n"); for (i = 1; i <= n; i++) l["cpu" a[i]] = 1
		}
		{ t = 0; for (i = 2; i <= 9; i++) t += $i }
		$1 in s { total += t; busy += $2 + $3 + $4 + $7 + $8; steal += $9 }
		$1 in l { ltotal += t; lsteal += $9 }
		END { print busy + 0, steal + 0, total + 0, lsteal + 0, ltotal + 0 }' /proc/stat
}
# cpu_shares BEFORE AFTER prints, between two cpu_snapshot readings, the
# whole percentages of the server CPUs' time that was busy and stolen, and
# of the load CPUs' time that was stolen.
cpu_shares() {
	awk -v a="$1" -v b="$2" 'function pc(p, t) { return t > 0 ? 100 * p / t : 0 }
		BEGIN { split(a, x, " "); split(b, y, " ")
			printf "%.0f %.0f %.0f\n", pc(y[1] - x[1], y[3] - x[3]), pc(y[2] - x[2], y[3] - x[3]), pc(y[4] - x[4], y[5] - x[5]) }'
}
# cpu_per_request BEFORE AFTER REQUESTS prints the server CPUs' busy time
# between two cpu_snapshot readings per request, in microseconds: the CPU
# that the proxy and the backends together spent on each request. Stolen
# time is not busy time, so the time the hypervisor gives other guests,
# which lowers requests/s, is not counted in it; steal still raises it
# somewhat (session 22: nginx 43.1 µs per request with 1% stolen, 50.0
# with 9%). /proc/stat counts in ticks of 1/CLK_TCK s (10 ms at 100 Hz),
# so a 10 s round reads to about 0.1% of a saturated CPU.
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
# AWK_MEDIAN defines median(s), the median of the numbers in the
# space-separated list s, for the awk summaries that start with it.
AWK_MEDIAN='
	function median(s,   a, n, i, j, t) {
		n = split(s, a, " ")
		for (i = 2; i <= n; i++)
			for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}'
cpu_per_request() {
	awk -v a="$1" -v b="$2" -v n="$3" -v hz="$CLK_TCK" '
		BEGIN { split(a, x, " "); split(b, y, " "); printf "%.1f\n", (n > 0 ? (y[1] - x[1]) * 1e6 / hz / n : 0) }'
}
NGINX_WORKERS=$(count_cpus "$SERVER_CPUS")
log "$PINNING"

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
UPLIST=""
for i in $(seq 1 "$BACKENDS"); do
	port=$((BASE_PORT + i))
	"${SRV[@]}" "$WORK/backend" -listen "127.0.0.1:$port" &
	PIDS+=($!)
	UPSTREAMS+="    server 127.0.0.1:$port;"$'\n'
	ENDPOINTS+="      - {name: be-$i, address: 127.0.0.1:$port, engine: vllm}"$'\n'
	UPLIST+="${UPLIST:+,}127.0.0.1:$port"
done
DIRECT_PORT=$((BASE_PORT + 1))
HTTPUTIL_PORT=$((BASE_PORT + 70))
MINPROXY_PORT=$((BASE_PORT + 75))
NGINX_PORT=$((BASE_PORT + 80))
GATEWAY_PORT=$((BASE_PORT + 90))
# The targets as name:port, in the order they alternate: every one in the
# saturation and unloaded runs; FIXED_TARGETS, the three the issue names,
# in the fixed-rate runs (minproxy and httputil are baselines for Go's own
# cost).
TARGETS=(direct:$DIRECT_PORT nginx:$NGINX_PORT minproxy:$MINPROXY_PORT httputil:$HTTPUTIL_PORT gateway:$GATEWAY_PORT)
FIXED_TARGETS=(direct:$DIRECT_PORT nginx:$NGINX_PORT gateway:$GATEWAY_PORT)

mkdir -p "$WORK/nginx/logs"
USER_LINE=""
if [ "$(id -u)" = 0 ]; then USER_LINE="user root;"; fi
cat >"$WORK/nginx/nginx.conf" <<EOF
$USER_LINE
worker_processes $NGINX_WORKERS;
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
"${SRV[@]}" "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" &
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
"${SRV[@]}" "$WORK/httputilproxy" -listen "127.0.0.1:$HTTPUTIL_PORT" -upstreams "$UPLIST" &
PIDS+=($!)
"${SRV[@]}" "$WORK/minproxy" -listen "127.0.0.1:$MINPROXY_PORT" -upstreams "$UPLIST" &
PIDS+=($!)
PPROF_PORT=$((BASE_PORT + 91))
GATEWAY_FLAGS=()
if [ "$PROFILE" = 1 ]; then GATEWAY_FLAGS=(-pprof "127.0.0.1:$PPROF_PORT"); fi
"${SRV[@]}" "$WORK/gateway" -config "$WORK/gateway.yaml" "${GATEWAY_FLAGS[@]}" &
PIDS+=($!)

for target in "${TARGETS[@]}"; do wait_port "${target##*:}"; done

# --- bodies ----------------------------------------------------------------
# A chat completions body of about $1 bytes: a system prompt and a user
# message of English text.
make_body() { awk -v size="$1" -f "$ROOT/benchmarks/overhead/body.awk"; }
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
for target in "${TARGETS[@]}"; do
	port=${target##*:}
	code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
		--data-binary @"$WORK/body-1KB.json" "http://127.0.0.1:$port/v1/chat/completions")
	if [ "$code" != 200 ]; then
		log "port $port answered $code"
		exit 1
	fi
done

# --- runs ------------------------------------------------------------------
# run NAME PORT BODY [CONNS THREADS] prints "name body rps p50ms p99ms errors
# requests".
run() {
	local out
	out=$(BODY_FILE="$WORK/body-$3.json" "${LOAD[@]}" wrk -t"${5:-$THREADS}" -c"${4:-$CONNS}" -d"$DURATION" --latency \
		-s "$WORK/post.lua" "http://127.0.0.1:$2/v1/chat/completions")
	echo "$out" >"$WORK/wrk-$1-$3-${4:-$CONNS}${TAG:+-$TAG}.txt"
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
		/ requests in / { reqs = $1 }
		END { printf "%s %s %.0f %.3f %.3f %d %d\n", name, body, rps, p50, p99, errs, reqs }'
}
# measure NAME PORT BODY [CONNS THREADS] makes one run between two readings
# of /proc/stat and leaves its result line in M_LINE, the server CPUs'
# busy and stolen shares and the load CPUs' stolen share in M_BUSY,
# M_STOLEN and M_LSTOLEN (percent), and the server CPU per request in
# M_US (microseconds).
measure() {
	local snap snap2
	snap=$(cpu_snapshot)
	M_LINE=$(run "$@")
	snap2=$(cpu_snapshot)
	read -r M_BUSY M_STOLEN M_LSTOLEN < <(cpu_shares "$snap" "$snap2")
	M_US=$(cpu_per_request "$snap" "$snap2" "${M_LINE##* }")
}

RESULTS=()
STEAL=()     # "phase name body round server% load%" (steal) of every loaded round
SERVERCPU=() # "name body round busy% µs/request" of every saturation round
for round in $(seq 1 "$ROUNDS"); do
	for body in 1KB 220KB; do
		for target in "${TARGETS[@]}"; do
			name=${target%%:*}
			port=${target##*:}
			log "round $round/$ROUNDS: wrk $name $body ($CONNS connections, $DURATION)"
			if [ "$PROFILE" = 1 ] && [ "$round" = 1 ] && [ "$name" = gateway ]; then
				secs=${DURATION%s}
				if ! [[ $secs =~ ^[0-9]+$ ]]; then secs=10; fi
				secs=$((secs > 4 ? secs - 2 : 2))
				curl -s -o "$WORK/gateway-$body.pprof" "http://127.0.0.1:$PPROF_PORT/debug/pprof/profile?seconds=$secs" &
			fi
			measure "$name" "$port" "$body"
			log "  $M_LINE (server CPUs ${M_BUSY}% busy, ${M_STOLEN}% stolen, $M_US µs per request; load CPUs ${M_LSTOLEN}% stolen)"
			RESULTS+=("$M_LINE")
			STEAL+=("saturation $name $body $round $M_STOLEN $M_LSTOLEN")
			SERVERCPU+=("$name $body $round $M_BUSY $M_US")
		done
	done
done
# median_round KEY NAME BODY LINE...: of the result lines of target NAME
# with body BODY, the median round by column KEY (numeric).
median_round() {
	local key=$1 name=$2 body=$3
	shift 3
	printf '%s\n' "$@" | awk -v n="$name" -v b="$body" '$1 == n && $2 == b' |
		sort -k"$key,$key"g | sed -n "$(((ROUNDS + 1) / 2))p"
}
MEDIANS=()
for body in 1KB 220KB; do
	for target in "${TARGETS[@]}"; do
		name=${target%%:*}
		MEDIANS+=("$(median_round 3 "$name" "$body" "${RESULTS[@]}")") # by req/s
	done
done

# Paired slices: the 1 KB ratio again, from short slices in which nginx,
# minproxy and the gateway take turns (PAIRS sets of SLICE each, the order
# reversed every other set: nginx minproxy gateway, then gateway minproxy
# nginx), so that each set's ratio compares the targets over the same few
# seconds. The rounds above run each target for 10 s some 30 s apart, and
# on a shared machine the speed the proxies get can change by half in that
# time (session 51: nginx's server CPU per 1 KB request 57.2 µs in one
# round and 106.7 in the next), which puts that change into the round's
# ratio; alternating short slices shares a slow spell between the targets
# instead, and reversing the order cancels a steady drift within two sets.
# The ratio of the slices' summed requests is the figure; each set's ratio
# shows its spread.
PAIRED=()    # "name 1KB rps p50 p99 errors requests set" of every slice
PAIREDCPU=() # "name set busy% µs/request" of every slice
if [ "$PAIRS" -gt 0 ]; then
	order=(nginx:$NGINX_PORT minproxy:$MINPROXY_PORT gateway:$GATEWAY_PORT)
	for pset in $(seq 1 "$PAIRS"); do
		if [ $((pset % 2)) = 0 ]; then turn=("${order[2]}" "${order[1]}" "${order[0]}"); else turn=("${order[@]}"); fi
		for target in "${turn[@]}"; do
			name=${target%%:*}
			port=${target##*:}
			DURATION=$SLICE TAG=slice$pset measure "$name" "$port" 1KB
			log "paired set $pset/$PAIRS: $M_LINE (server CPUs ${M_BUSY}% busy, $M_US µs per request)"
			PAIRED+=("$M_LINE $pset")
			PAIREDCPU+=("$name $pset $M_BUSY $M_US")
		done
	done
fi

# Fixed rate: vegeta sends at a constant rate whatever the answers' latency
# (an open loop: a slow answer does not delay the next request, so queueing
# shows in the latency instead of lowering the rate, unlike a closed-loop
# wrk). Each rate is the same for the three targets: LOADS lists fractions
# of the lowest median saturation rate of the three, so every target runs
# below its saturation, and the added latency is read at more than one
# load. Like the saturation runs, the targets alternate, ROUNDS times, and
# the table shows each one's median round, here by p99. A run's body field
# is BODY@RATE.
FIXEDR=()
RATES=()
FIXEDCPU=() # "name body@rate round busy% µs/request" of every fixed-rate round
OWNRATES=() # "name port rate shared" of the control runs (below); shared=1 when the rate is one of RATES
OWNFIXED=() # their result lines, as in ALLFIXED
# vegeta_round NAME PORT BODY RATE ROUND runs one fixed-rate round against
# NAME on PORT, logs it, records its steal (phase "fixed") and the server
# CPU it took in FIXEDCPU, and leaves its result line, "name body@rate
# req/s p50 p90 p99 errors" (milliseconds), in VR_LINE.
vegeta_round() {
	local name=$1 port=$2 body=$3 rate=$4 round=$5
	local br="$body@$rate" res snap snap2 busy stolen lstolen us
	printf 'POST http://127.0.0.1:%s/v1/chat/completions\nContent-Type: application/json\n@%s\n' \
		"$port" "$WORK/body-$body.json" >"$WORK/targets-$name-$body.txt"
	log "fixed rate, round $round/$ROUNDS: vegeta $name $body ($rate req/s, $DURATION, at most $CONNS connections)"
	res="$WORK/vegeta-$name-$br-$round"
	snap=$(cpu_snapshot)
	"${LOAD[@]}" "$VEGETA" attack -targets "$WORK/targets-$name-$body.txt" -rate "$rate/1s" -duration "$DURATION" \
		-max-connections "$CONNS" -http2=false -timeout 30s >"$res.bin"
	snap2=$(cpu_snapshot)
	"$VEGETA" report -type json "$res.bin" >"$res.json"
	rm -f "$res.bin"
	VR_LINE=$(jq -r --arg n "$name" --arg b "$br" \
		'"\($n) \($b) \(.throughput | floor) \(.latencies["50th"] / 1e6) \(.latencies["90th"] / 1e6) \(.latencies["99th"] / 1e6) \(.requests - (.status_codes["200"] // 0))"' \
		"$res.json")
	read -r busy stolen lstolen < <(cpu_shares "$snap" "$snap2")
	us=$(cpu_per_request "$snap" "$snap2" "$(jq -r '.requests' "$res.json")")
	log "  $VR_LINE (server CPUs ${busy}% busy, ${stolen}% stolen, $us µs per request; load CPUs ${lstolen}% stolen)"
	STEAL+=("fixed $name $br $round $stolen $lstolen")
	FIXEDCPU+=("$name $br $round $busy $us")
}
if [ "$FIXED" = 1 ]; then
	for body in 1KB 220KB; do
		var="RATE_$body"
		if [ -n "${!var:-}" ]; then
			RATES+=("$body@${!var}")
			continue
		fi
		for load in $LOADS; do
			rate=$(printf '%s\n' "${MEDIANS[@]}" | awk -v b="$body" -v f="$load" -v names="${FIXED_TARGETS[*]}" '
				BEGIN { n = split(names, a, " "); for (i = 1; i <= n; i++) { split(a[i], nt, ":"); want[nt[1]] = 1 } }
				$2 == b && ($1 in want) { if (min == "" || $3 < min) min = $3 }
				END { printf "%d", min * f }')
			RATES+=("$body@$rate")
		done
	done
	# Each proxy at its own rate, a control (OWN=1, the default). The
	# rates above are the same for every target, fractions of the slowest
	# one's saturation rate, so at the highest of them the gateway runs
	# closer to its own limit than nginx does. Each round therefore also
	# runs nginx and the gateway at the highest of LOADS times its *own*
	# median 220 KB saturation rate, with `direct` at the same rate (a rate
	# already among the shared ones is not run again). The summary gives,
	# by round, what each adds to direct's p99 there and the servers' CPU
	# per request against the same target's saturated figure. In session
	# 33, by hand, nginx stayed within 5 ms in eight rounds of eight this
	# way, its CPU per request the same as saturated, and the gateway did
	# not in three, its CPU per request up to 1.57 times saturated: a
	# measure of how much of a miss is the Go runtime's wake-ups rather
	# than the machine.
	if [ "$OWN" = 1 ] && [ -z "${RATE_220KB:-}" ]; then
		top=$(printf '%s\n' $LOADS | sort -g | tail -1)
		for target in nginx:$NGINX_PORT gateway:$GATEWAY_PORT; do
			rate=$(printf '%s\n' "${MEDIANS[@]}" | awk -v n="${target%%:*}" -v f="$top" '$1 == n && $2 == "220KB" { printf "%d", $3 * f }')
			shared=0
			for br in "${RATES[@]}"; do
				if [ "$br" = "220KB@$rate" ]; then shared=1; fi
			done
			OWNRATES+=("${target%%:*} ${target##*:} $rate $shared")
		done
	fi
	ALLFIXED=()
	for round in $(seq 1 "$ROUNDS"); do
		for br in "${RATES[@]}"; do
			body=${br%%@*}
			rate=${br##*@}
			for target in "${FIXED_TARGETS[@]}"; do
				vegeta_round "${target%%:*}" "${target##*:}" "$body" "$rate" "$round"
				ALLFIXED+=("$VR_LINE")
			done
		done
		for own in "${OWNRATES[@]}"; do
			read -r name port rate shared <<<"$own"
			if [ "$shared" = 1 ]; then continue; fi # its rounds are in ALLFIXED
			for target in "$name:$port" "direct:$DIRECT_PORT"; do
				vegeta_round "${target%%:*}" "${target##*:}" 220KB "$rate" "$round"
				OWNFIXED+=("$VR_LINE")
			done
		done
	done
	for br in "${RATES[@]}"; do
		for target in "${FIXED_TARGETS[@]}"; do
			name=${target%%:*}
			FIXEDR+=("$(median_round 6 "$name" "$br" "${ALLFIXED[@]}")") # by p99
		done
	done
fi

# Unloaded latency: one connection, so the p99 difference is the time each
# proxy adds to a request rather than queueing behind the other 149.
UNLOADED=()
for body in 1KB 220KB; do
	for target in "${TARGETS[@]}"; do
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
echo "inferroute overhead, $(date -u +%Y-%m-%dT%H:%MZ), $BACKENDS backends, $NCPU CPUs, loopback; $PINNING; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "saturation: wrk -t$THREADS -c$CONNS -d$DURATION (closed loop), median of $ROUNDS rounds by req/s"
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
			g = "gateway/" body; x = "nginx/" body; d = "direct/" body; h = "httputil/" body; m = "minproxy/" body
			# Three decimals and a verdict from the unrounded ratio: at two
			# decimals 0.496 prints as 0.50 beside a target of 0.5.
			ratio = (rps[x] > 0 ? rps[g] / rps[x] : 0)
			printf "%s saturated: gateway/nginx req/s = %.3f (target >= 0.5: %s); minproxy/nginx = %.3f; httputil/nginx = %.3f; gateway p99 - direct p99 = %.2f ms\n",
				body, ratio, (ratio >= 0.5 ? "met" : "NOT met"), (rps[x] > 0 ? rps[m] / rps[x] : 0), (rps[x] > 0 ? rps[h] / rps[x] : 0), p99[g] - p99[d]
		}
	}'
# Each round's ratio, to show the noise the medians smooth, and the median
# of those ratios: the figure above divides the median of the gateway's
# rounds by the median of nginx's, which may come from different rounds
# (at 21:10Z on 12-05, rounds of 0.602, 0.365 and 0.623 printed 0.413), so
# the median of ratios taken within a round is printed beside it. RESULTS
# is in round order, so the n-th line of a target and body is its round n.
printf '%s\n' "${RESULTS[@]}" | awk "$AWK_MEDIAN"'
	{ r = seen[$2 "/" $1]++; rps[$2 "/" $1, r] = $3; if (r + 1 > rounds) rounds = r + 1 }
	# byround(body, n): in each round, the requests/s of target n over
	# those of nginx.
	function byround(body, n,   r, x, list) {
		for (r = 0; r < rounds; r++) {
			x = rps[body "/nginx", r]
			list = list sprintf(" %.3f", x > 0 ? rps[body "/" n, r] / x : 0)
		}
		return list
	}
	END {
		for (b = 1; b <= 2; b++) {
			body = (b == 1) ? "1KB" : "220KB"
			for (t = 1; t <= 2; t++) {
				n = (t == 1) ? "gateway" : "minproxy"
				list = byround(body, n)
				printf "%s %s/nginx req/s by round:%s; median %.3f\n", body, n, list, median(list)
			}
		}
	}'
# The same comparison by CPU instead of by rate: each round's busy time of
# the server CPUs per request (the proxy's and the backends' together),
# which does not count stolen time. With the server CPUs saturated and nothing
# stolen, requests/s is the inverse of this figure, so nginx's µs over the
# gateway's is the requests/s ratio that the target asks for, read from
# the CPU each request cost rather than from how much CPU the round got.
printf '%s\n' "${SERVERCPU[@]}" | awk "$AWK_MEDIAN"'
	{
		k = $2 "/" $1; r = seen[k]++; us[k, r] = $5; busy[k, r] = $4
		if (r + 1 > rounds) rounds = r + 1
		if (!($1 in named)) { named[$1] = 1; names[nn++] = $1 }
	}
	END {
		for (b = 1; b <= 2; b++) {
			body = (b == 1) ? "1KB" : "220KB"
			line = body " server CPU per request by round (µs, proxy and backends, stolen time excluded; server CPUs busy):"
			for (i = 0; i < nn; i++) {
				k = body "/" names[i]
				line = line (i ? ";" : "") " " names[i]
				for (r = 0; r < rounds; r++) line = line sprintf(" %.1f (%d%%)", us[k, r], busy[k, r])
			}
			print line
			list = ""
			for (r = 0; r < rounds; r++) {
				g = us[body "/gateway", r]
				list = list sprintf(" %.3f", g > 0 ? us[body "/nginx", r] / g : 0)
			}
			m = median(list)
			printf "%s nginx/gateway server CPU per request by round:%s; median %.3f (as a requests/s ratio, target >= 0.5: %s)\n",
				body, list, m, (m >= 0.5 ? "met" : "NOT met")
		}
	}'
if [ "$PAIRS" -gt 0 ]; then
	echo
	echo "1KB paired slices: wrk -t$THREADS -c$CONNS -d$SLICE, $PAIRS sets of nginx, minproxy and the gateway in turn (the order reversed every other set)"
	# The interval: the ratio of the summed requests over 2000 resamples
	# of the sets with replacement (a percentile bootstrap, with a fixed
	# seed so that the same slices print the same interval); how far the
	# figure could move with other sets of the same machine.
	printf '%s\n' "${PAIRED[@]}" | awk "$AWK_MEDIAN"'
		{ rps[$1, $8] = $3; req[$1, $8] = $7; reqs[$1] += $7; if ($8 > sets) sets = $8 }
		# ratio(n): the requests of target n in all slices over those of nginx.
		function ratio(n) { return reqs["nginx"] > 0 ? reqs[n] / reqs["nginx"] : 0 }
		# bysets(n): in each set, the requests/s of target n over those of nginx.
		function bysets(n,   s, list) {
			for (s = 1; s <= sets; s++) list = list sprintf(" %.3f", rps["nginx", s] > 0 ? rps[n, s] / rps["nginx", s] : 0)
			return list
		}
		function interval(n,   b, i, j, s, num, den, r, t) {
			srand(1)
			for (b = 0; b < 2000; b++) {
				num = den = 0
				for (i = 0; i < sets; i++) { s = 1 + int(rand() * sets); num += req[n, s]; den += req["nginx", s] }
				r[b] = (den > 0 ? num / den : 0)
			}
			for (i = 1; i < 2000; i++) for (j = i; j > 0 && r[j - 1] > r[j]; j--) { t = r[j]; r[j] = r[j - 1]; r[j - 1] = t }
			return sprintf("%.3f-%.3f", r[49], r[1949])
		}
		END {
			printf "1KB paired: gateway/nginx requests in all slices = %.3f (target >= 0.5: %s; 95%% bootstrap interval over the sets %s); by set:%s; median %.3f\n",
				ratio("gateway"), (ratio("gateway") >= 0.5 ? "met" : "NOT met"), interval("gateway"), bysets("gateway"), median(bysets("gateway"))
			printf "1KB paired: minproxy/nginx requests in all slices = %.3f (95%% interval %s); by set:%s; median %.3f\n",
				ratio("minproxy"), interval("minproxy"), bysets("minproxy"), median(bysets("minproxy"))
		}'
	printf '%s\n' "${PAIREDCPU[@]}" | awk "$AWK_MEDIAN"'
		{ us[$1, $2] = $4; l[$1] = l[$1] sprintf(" %.1f", $4); if ($2 > sets) sets = $2 }
		END {
			printf "1KB paired: server CPU per request by set (µs): nginx%s; minproxy%s; gateway%s\n", l["nginx"], l["minproxy"], l["gateway"]
			list = ""
			for (s = 1; s <= sets; s++) list = list sprintf(" %.3f", us["gateway", s] > 0 ? us["nginx", s] / us["gateway", s] : 0)
			printf "1KB paired: nginx/gateway server CPU per request by set:%s; median %.3f\n", list, median(list)
		}'
fi
if [ "$FIXED" = 1 ]; then
	echo
	echo "fixed rate: vegeta attack -rate R/1s -duration $DURATION -max-connections $CONNS (open loop), median of $ROUNDS rounds by p99; body@R: ${RATES[*]} req/s"
	printf '%s\n' "${FIXEDR[@]}" | awk '
		{ k = $1 "/" $2; rps[k] = $3; p50[k] = $4; p90[k] = $5; p99[k] = $6; errs[k] = $7; order[n++] = k
		  if (!($2 in seen)) { seen[$2] = 1; brs[nb++] = $2 } }
		END {
			printf "| %-8s | %-11s | %10s | %9s | %9s | %9s | %6s |\n", "target", "body@rate", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors"
			printf "|----------|-------------|------------|-----------|-----------|-----------|--------|\n"
			for (i = 0; i < n; i++) {
				k = order[i]; split(k, a, "/")
				printf "| %-8s | %-11s | %10.0f | %9.3f | %9.3f | %9.3f | %6d |\n", a[1], a[2], rps[k], p50[k], p90[k], p99[k], errs[k]
			}
			for (j = 0; j < nb; j++) {
				br = brs[j]
				g = "gateway/" br; x = "nginx/" br; d = "direct/" br
				added = p99[g] - p99[d]
				printf "%s req/s fixed rate: over direct, gateway adds p50 %.3f, p99 %.3f ms%s; nginx adds p50 %.3f, p99 %.3f ms\n", br,
					p50[g] - p50[d], added, (br ~ /^220KB/ ? (added <= 5 ? " (target p99 <= 5: met)" : " (target p99 <= 5: NOT met)") : ""),
					p50[x] - p50[d], p99[x] - p99[d]
			}
		}'
fi
if [ ${#OWNRATES[@]} -gt 0 ]; then
	echo
	echo "each at its own rate (a control; the rates above are the same for all targets): nginx and the gateway at $top of their own 220KB saturation rates, direct at the same rates, by round"
	{
		printf 'O %s\n' "${OWNRATES[@]}"
		printf 'F %s\n' "${ALLFIXED[@]}" "${OWNFIXED[@]}"
		printf 'C %s\n' "${FIXEDCPU[@]}"
		printf 'S %s\n' "${SERVERCPU[@]}"
	} | awk "$AWK_MEDIAN"'
		$1 == "O" { names[no++] = $2; rate[$2] = $4 }
		$1 == "F" { r = ++nf[$2, $3]; p99[$2, $3, r] = $7 }
		$1 == "C" { busy[$2, $3, $4] = $5; us[$2, $3, $4] = $6 }
		$1 == "S" && $3 == "220KB" { sat[$2] = sat[$2] " " $6 }
		END {
			for (i = 0; i < no; i++) {
				n = names[i]; br = "220KB@" rate[n]; s = median(sat[n])
				added = ""; ratio = ""; b = ""
				for (r = 1; r <= nf[n, br] && r <= nf["direct", br]; r++) {
					added = added sprintf(" %+.3f", p99[n, br, r] - p99["direct", br, r])
					ratio = ratio sprintf(" %.2f", s > 0 ? us[n, br, r] / s : 0)
					b = b sprintf(" %d%%", busy[n, br, r])
				}
				if (added == "") { printf "220KB %s at %d req/s: no round\n", n, rate[n]; continue }
				m = median(added)
				printf "220KB %s at %d req/s: p99 over direct by round (ms):%s; median of the rounds %+.3f (within 5: %s); server CPU per request over its saturated figure (%.1f µs):%s; server CPUs busy:%s\n",
					n, rate[n], added, m, (m <= 5 ? "yes" : "no"), s, ratio, b
			}
		}'
fi
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
			printf "%s unloaded: gateway p99 - direct p99 = %.3f ms\n", body, p99["gateway/" body] - p99["direct/" body]
		}
	}'
# Steal: the share of the CPUs' time the hypervisor gave to other guests,
# on the server CPUs and on the load generators' (where a stall delays the
# reading of answers, so it shows in the latency measured although no
# server was slowed). It is zero on a dedicated machine; where it is not,
# the rounds with most of it are the ones to distrust.
echo
printf '%s\n' "${STEAL[@]}" | awk '
	function note(p, k, v) {
		sum[p, k] += v
		if (!((p, k) in max) || v > max[p, k]) { max[p, k] = v; at[p, k] = $2 " " $3 " round " $4 }
	}
	{ n[$1]++; note($1, "server", $5 + 0); note($1, "load", $6 + 0) }
	END {
		line = "steal (CPU time the hypervisor gave to other guests), per loaded round:"
		split("saturation fixed", ph, " ")
		for (i = 1; i <= 2; i++) {
			p = ph[i]
			if (!(p in n)) continue
			line = line sprintf(" %s: server CPUs mean %.0f%%, highest %d%% (%s), load CPUs mean %.0f%%, highest %d%% (%s);",
				(p == "fixed" ? "fixed rate" : p), sum[p, "server"] / n[p], max[p, "server"], at[p, "server"],
				sum[p, "load"] / n[p], max[p, "load"], at[p, "load"])
		}
		print line " every round is in the log"
	}'
# Some hypervisors do not account steal to their guests at all: /proc/stat
# then reads zero since boot however much the machine's speed changes
# (session 25's guest: `direct` at 22.4k and 37.2k requests/s in two
# rounds of one run, with no steal ever recorded). Say so, since every
# round is then "quiet".
if awk '$1 == "cpu" { exit ($9 + 0 > 0) }' /proc/stat; then
	echo "this machine has recorded no stolen time since it booted (/proc/stat): if it is a virtual machine whose hypervisor does not report steal, the quiet rounds below cannot tell a slowed round from a quiet one"
fi
# quiet_rounds QUIET: reads "S phase name body round server% load%" (the
# steal of each loaded run), "R name body req/s p50 p99 errors" (the
# saturation runs) and "F name body@rate req/s p50 p90 p99 errors" (the
# fixed-rate runs), each kind in round order, and prints the targets'
# figures over the rounds in which both runs compared had at most QUIET
# percent stolen on both CPU sets.
quiet_rounds() {
	awk -v q="$1" "$AWK_MEDIAN"'
		$1 == "S" { quiet[$2, $3, $4, $5] = ($6 + 0 <= q && $7 + 0 <= q) }
		$1 == "R" { r = ++nr[$2, $3]; rps[$2, $3, r] = $4 }
		$1 == "F" { r = ++nf[$2, $3]; p99[$2, $3, r] = $7; if (!($3 in seen)) { seen[$3] = 1; brs[nb++] = $3 } }
		END {
			printf "quiet rounds (at most %s%% of the server and the load CPUs stolen during both runs compared):\n", q
			for (b = 1; b <= 2; b++) {
				body = (b == 1) ? "1KB" : "220KB"
				list = ""; k = 0
				for (r = 1; r <= nr["gateway", body]; r++)
					if (quiet["saturation", "gateway", body, r] && quiet["saturation", "nginx", body, r] && rps["nginx", body, r] > 0) {
						list = list sprintf(" %.3f", rps["gateway", body, r] / rps["nginx", body, r]); k++
					}
				if (k == 0) { printf "%s saturated, gateway/nginx req/s: no quiet round of %d\n", body, nr["gateway", body]; continue }
				m = median(list)
				printf "%s saturated, gateway/nginx req/s in quiet rounds:%s (%d of %d); median %.3f (target >= 0.5: %s)\n",
					body, list, k, nr["gateway", body], m, (m >= 0.5 ? "met" : "NOT met")
			}
			for (j = 0; j < nb; j++) {
				br = brs[j]
				if (br !~ /^220KB@/) continue
				list = ""; k = 0
				for (r = 1; r <= nf["gateway", br]; r++)
					if (quiet["fixed", "gateway", br, r] && quiet["fixed", "direct", br, r]) {
						list = list sprintf(" %+.3f", p99["gateway", br, r] - p99["direct", br, r]); k++
					}
				if (k == 0) { printf "%s req/s fixed rate, gateway p99 - direct p99: no quiet round of %d\n", br, nf["gateway", br]; continue }
				m = median(list)
				printf "%s req/s fixed rate, gateway p99 - direct p99 in quiet rounds (ms):%s (%d of %d); median %+.3f (target <= 5: %s)\n",
					br, list, k, nf["gateway", br], m, (m <= 5 ? "met" : "NOT met")
			}
		}'
}

# The targets again, from the quiet rounds only: those in which at most
# QUIET percent of both the server and the load CPUs' time was stolen
# during each of the two runs compared (gateway and nginx at saturation,
# gateway and direct at a fixed rate). Each round pairs runs made within
# a minute or two of each other, so a round's ratio or difference is
# the one least disturbed by the machine; the median is over the quiet
# rounds, and a figure with no quiet round is not a measurement.
{
	printf 'S %s\n' "${STEAL[@]}"
	printf 'R %s\n' "${RESULTS[@]}"
	if [ "$FIXED" = 1 ]; then printf 'F %s\n' "${ALLFIXED[@]}"; fi
} | quiet_rounds "$QUIET"
if [ -n "$OUT" ]; then
	mkdir -p "$OUT"
	printf '%s\n' "${STEAL[@]}" >"$OUT/steal-rounds.txt"
	cp "$WORK"/wrk-*.txt "$OUT"/
	cp "$WORK"/vegeta-*.json "$OUT"/ 2>/dev/null || true
	printf '%s\n' "${RESULTS[@]}" >"$OUT/saturation-rounds.txt"
	printf '%s\n' "${SERVERCPU[@]}" >"$OUT/server-cpu-rounds.txt"
	if [ "$FIXED" = 1 ]; then
		printf '%s\n' "${ALLFIXED[@]}" >"$OUT/fixed-rounds.txt"
		printf '%s\n' "${FIXEDCPU[@]}" >"$OUT/fixed-cpu-rounds.txt"
		if [ ${#OWNFIXED[@]} -gt 0 ]; then printf '%s\n' "${OWNFIXED[@]}" >"$OUT/own-rounds.txt"; fi
	fi
	cp "$WORK"/gateway-*.pprof "$WORK/gateway" "$OUT"/ 2>/dev/null || true
	log "raw outputs in $OUT"
fi
