#!/usr/bin/env bash
# User-space instructions per request of minproxy and the gateway, counted
# by valgrind's callgrind: a figure that, unlike requests/s on a shared
# machine, does not move with what else the machine is doing, so that a
# change to the request path can be judged on any machine (repeat runs
# agree within about 3%: the goroutines' interleaving varies). It leaves
# out the kernel's share of a request (the socket reads and writes, which
# cost both proxies alike) and memory stalls; run.sh measures the whole.
#
# Each proxy runs under callgrind with the two backends of run.sh outside
# it; WARM requests are sent and the counters zeroed (callgrind_control
# -d), then N requests, and the counters dumped: the dump holds exactly the
# N requests. icount prints both proxies' instructions per request by
# category and the gateway's costliest functions.
#
# The gateway scrapes the backends once an hour here, not every 50 ms as in
# run.sh: under callgrind a second of wall time holds some fifty times
# fewer requests, and a scrape, about 140,000 instructions, would be
# charged to them fifty times over (at run.sh's rates scraping comes to
# about 0.1 µs per request).
#
# Two workarounds for valgrind 3.19 (Debian 12): it does not decode
# RDTSCP, which the Go runtime's cputicks uses when the CPU has it, so the
# binaries are built with a copy of GOROOT whose cputicks takes its other
# path (RDTSC between fences; nothing else changes); and callgrind aborts
# on the signal of the runtime's asynchronous preemption, so it runs with
# GODEBUG=asyncpreemptoff=1.
#
# With CACHE=1 callgrind also simulates the first-level caches (the
# host's sizes, as valgrind reads them) and the output ends with each
# proxy's instruction- and data-cache misses per request: a measure of how
# much code and memory a request touches, which instructions alone do not
# give. (The simulated last level is left out: on these guests it is a
# share of a cache other guests use, which no simulation knows.) It runs
# about twice as long.
#
# Usage: benchmarks/overhead/instructions.sh        (from anywhere in the repo)
# Environment: N (requests counted, 4000), WARM (1000), CONNS (16), BODY
#              (1KB or 220KB), BASE_PORT (19100), CACHE (1 to simulate the
#              caches), OUT (a directory to keep the callgrind files and
#              listings).
# Everything listens on 127.0.0.1 only.
set -euo pipefail

N=${N:-4000}
WARM=${WARM:-1000}
CONNS=${CONNS:-16}
BODY=${BODY:-1KB}
BASE_PORT=${BASE_PORT:-19100}
CACHE=${CACHE:-0}
OUT=${OUT:-}

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/inferroute-icount.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "$OUT" ]; then mkdir -p "$OUT" && cp "$WORK"/*.txt "$WORK"/*.callgrind "$OUT"/ 2>/dev/null || true; fi
	rm -rf "$WORK"
}
trap cleanup EXIT
log() { echo "icount: $*" >&2; }
# retry TRIES DELAY COMMAND...: runs COMMAND until it succeeds, at most
# TRIES times, DELAY seconds apart; fails when it never does.
retry() {
	local tries=$1 delay=$2
	shift 2
	for _ in $(seq 1 "$tries"); do
		"$@" && return 0
		sleep "$delay"
	done
	return 1
}

for tool in valgrind callgrind_control callgrind_annotate curl; do
	command -v "$tool" >/dev/null || { log "$tool not found (Debian: apt-get install valgrind curl)"; exit 1; }
done
case "$BODY" in
1KB) SIZE=1024 ;;
220KB) SIZE=$((220 * 1024)) ;;
*) log "BODY must be 1KB or 220KB"; exit 1 ;;
esac

# A GOROOT whose runtime.cputicks does not use RDTSCP.
GOROOT_SRC=$(go env GOROOT)
GOARCH=$(go env GOARCH)
log "copying GOROOT ($GOROOT_SRC) to patch runtime.cputicks"
cp -r "$GOROOT_SRC" "$WORK/goroot"
chmod -R u+w "$WORK/goroot"
if [ "$GOARCH" = amd64 ]; then
	asm="$WORK/goroot/src/runtime/asm_amd64.s"
	if ! grep -q 'CMPB	internal∕cpu·X86+const_offsetX86HasRDTSCP(SB), $1' "$asm"; then
		log "runtime/asm_amd64.s has changed: cannot patch cputicks"
		exit 1
	fi
	sed -i 's/^\tCMPB\tinternal∕cpu·X86+const_offsetX86HasRDTSCP(SB), \$1$/\tJMP\tfences/; /^\tJMP\tfences$/{n;/^\tJNE\tfences$/d}' "$asm"
	grep -q 'HasRDTSCP' "$asm" && { log "patching cputicks failed"; exit 1; }
fi
export GOROOT="$WORK/goroot" PATH="$WORK/goroot/bin:$PATH" GOFLAGS=-trimpath

log "building backend, minproxy, gateway and icount"
for cmd in backend minproxy icount; do
	(cd "$ROOT" && go build -o "$WORK/$cmd" "./benchmarks/overhead/$cmd")
done
(cd "$ROOT" && go build -o "$WORK/gateway" ./examples/gateway)

awk -v size="$SIZE" -f "$ROOT/benchmarks/overhead/body.awk" >"$WORK/body.json"

B1=$((BASE_PORT + 1)) B2=$((BASE_PORT + 2)) PROXY=$((BASE_PORT + 90))
"$WORK/backend" -listen "127.0.0.1:$B1" & PIDS+=($!)
"$WORK/backend" -listen "127.0.0.1:$B2" & PIDS+=($!)
for port in "$B1" "$B2"; do
	retry 50 0.1 curl -s -o /dev/null "http://127.0.0.1:$port/metrics" || true
done
# A backend that could not listen (the port taken) has exited by now.
for p in "${PIDS[@]}"; do
	kill -0 "$p" 2>/dev/null || { log "a backend did not start (ports $B1, $B2; set BASE_PORT)"; exit 1; }
done
cat >"$WORK/gateway.yaml" <<YAML
listen: 127.0.0.1:$PROXY
logLevel: warn
scrape: {interval: 1h}
pools:
  - name: llama
    models: [meta-llama/Llama-3.1-8B-Instruct]
    endpoints:
      - {name: be-1, address: 127.0.0.1:$B1, engine: vllm}
      - {name: be-2, address: 127.0.0.1:$B2, engine: vllm}
YAML

URL="http://127.0.0.1:$PROXY/v1/chat/completions"
count() { # count NAME COMMAND...
	local name=$1
	shift
	GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind "${SIM[@]}" --callgrind-out-file="$WORK/callgrind.$name" "$@" 2>"$WORK/valgrind-$name.log" &
	local pid=$!
	PIDS+=("$pid")
	retry 300 0.2 curl -s -o /dev/null -H 'Content-Type: application/json' --data-binary @"$WORK/body.json" "$URL" || true
	log "$name: $WARM requests to warm up, then $N counted ($CONNS connections, $BODY)"
	"$WORK/icount" load -url "$URL" -n "$WARM" -c "$CONNS" -body "$WORK/body.json"
	callgrind_control -z "$pid" >/dev/null
	"$WORK/icount" load -url "$URL" -n "$N" -c "$CONNS" -body "$WORK/body.json"
	callgrind_control -d "$pid" >/dev/null
	# The dump is written asynchronously, when valgrind next polls.
	retry 100 0.2 compgen -G "$WORK/callgrind.$name.*" >/dev/null || true
	sleep 1
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	local dump
	dump=$(ls "$WORK/callgrind.$name".* | tail -1)
	mv "$dump" "$WORK/$name.callgrind"
	dump=$WORK/$name.callgrind
	callgrind_annotate --auto=no --threshold=100 --show=Ir "$dump" >"$WORK/$name.txt"
	DUMPS+=("$name:$dump")
}
SIM=()
if [ "$CACHE" = 1 ]; then SIM=(--cache-sim=yes); fi
DUMPS=()
count minproxy "$WORK/minproxy" -listen "127.0.0.1:$PROXY" -upstreams "127.0.0.1:$B1,127.0.0.1:$B2"
count gateway "$WORK/gateway" -config "$WORK/gateway.yaml"

echo "inferroute instruction count, $(date -u +%Y-%m-%dT%H:%MZ), $(go version | awk '{print $3}'), $(valgrind --version), $BODY body, $CONNS connections, $N requests after $WARM"
"$WORK/icount" report -n "$N" "$WORK/minproxy.callgrind" "$WORK/gateway.callgrind"
if [ "$CACHE" = 1 ]; then
	# The dump's summary line holds the program's totals in the order of
	# its events line (Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw).
	echo
	echo "first-level cache misses per request (callgrind's simulation of the host's caches; $(grep -m1 '^I1 cache:' "$WORK/gateway.txt" | sed 's/^I1 cache: *//') I1, $(grep -m1 '^D1 cache:' "$WORK/gateway.txt" | sed 's/^D1 cache: *//') D1):"
	for d in "${DUMPS[@]}"; do
		awk -v name="${d%%:*}" -v n="$N" '
			/^events:/ { for (i = 2; i <= NF; i++) col[$i] = i }
			/^summary:/ {
				if (!("I1mr" in col)) { print name ": no cache events in the dump"; exit 1 }
				printf "  %-9s instructions %.0f, I1 misses %.0f, D1 misses %.0f (reads %.0f, writes %.0f)\n", name ":",
					$col["Ir"] / n, $col["I1mr"] / n, ($col["D1mr"] + $col["D1mw"]) / n, $col["D1mr"] / n, $col["D1mw"] / n
			}' "${d#*:}"
	done
fi
