#!/bin/bash
# What the agent costs the customer's VM, measured in one run on the guest
# itself (issue 14's agent figures): a real `factory serve` on loopback, one
# real `factory-agent --link-only` enrolled with it and reporting health
# every INTERVAL seconds, and then:
#   - the agent's resident memory (VmRSS, and its private part RssAnon) and
#     CPU per health cycle and as a share of one core, over SECONDS;
#   - every process the agent started meanwhile (none is the goal when NVML
#     works: no nvidia-smi in the steady state);
#   - the health source the coordinator saw (nvml, nvidia-smi or none);
#   - one GPU sample through the agent (`factory-agent health -o json`, a new
#     process: NVML loaded, one sample, exit) against one
#     `nvidia-smi --query-gpu` run, each REPEAT times: wall time and peak RSS.
# Read-only for the GPU: NVML and nvidia-smi queries only.
#
#   bench/agent-footprint.sh [--seconds N] [--interval S] [--repeat R] [--out DIR]
#
# The binaries come from FACTORY_BIN and FACTORY_AGENT, else from beside this
# script, else from build/coordinator/ and build/agent/. Needs python3 (for
# JSON and rusage). Ports are picked on 127.0.0.1 only.
# Exit 0 when it measured, 2 when it could not run.
set -u

seconds=60
interval=10
repeat=10
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --interval) interval="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "agent-footprint: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

here="$(cd "$(dirname "$0")" && pwd)"
pick() {  # pick ENV NAME DIR: the binary from the environment, beside us, or build/DIR/
  local env="$1" name="$2" dir="$3"
  if [ -n "${!env:-}" ]; then echo "${!env}"; return; fi
  for c in "$here/$name" "$here/../build/$dir/$name"; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
}
factory="$(pick FACTORY_BIN factory coordinator)"
agent="$(pick FACTORY_AGENT factory-agent agent)"
die() { echo "agent-footprint: $*" >&2; exit 2; }
[ -n "$factory" ] && [ -x "$factory" ] || die "no factory binary (set FACTORY_BIN or build it)"
[ -n "$agent" ] && [ -x "$agent" ] || die "no factory-agent binary (set FACTORY_AGENT or build it)"
command -v python3 >/dev/null || die "python3 is needed for JSON and rusage"

work="$(mktemp -d /tmp/agent-footprint.XXXXXX)"
[ -n "$out" ] || out="$work/out"
mkdir -p "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work/state" "$work/agent-state"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
agents_port="$(free_port)"
api_port="$(free_port)"
cat > "$work/coordinator.yaml" <<YAML
state_dir: $work/state
external_url: wss://127.0.0.1:$agents_port
agents:
  listen: 127.0.0.1:$agents_port
  binary: $agent
api:
  listen: 127.0.0.1:$api_port
log_level: info
YAML
"$factory" serve --config "$work/coordinator.yaml" > "$out/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$api_port") 2>/dev/null && break
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$api_port") 2>/dev/null || { cat "$out/coordinator.log"; die "factory serve did not start"; }

fac() { "$factory" --config "$work/coordinator.yaml" "$@"; }
fac token create --tenant footprint -o json > "$work/token.json" || die "token create failed"
jget() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
( umask 077; jget "$work/token.json" token > "$work/token" )

"$agent" --coordinator-url "$(jget "$work/token.json" coordinator_url)" \
  --ca-sha256 "$(jget "$work/token.json" ca_sha256)" --token-file "$work/token" \
  --state-dir "$work/agent-state" --link-only --health-interval "$interval" \
  --log-level info > "$out/agent.log" 2>&1 &
apid=$!
pids+=($apid)

# Warm up: enrolled, connected, the first health sample sent.
sleep $((interval + 5))
kill -0 "$apid" 2>/dev/null || { cat "$out/agent.log"; die "the agent exited"; }

ticks="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
c0="$(cpu_ticks "$apid")"
t0="$(date +%s.%N)"
children="$work/children"
: > "$children"
peak_rss=0
end=$((SECONDS + seconds))
while [ $SECONDS -lt $end ]; do
  # Anything the agent starts (nvidia-smi, say) shows as its child.
  for c in $(cat "/proc/$apid/task/"*/children 2>/dev/null); do
    echo "$(cat "/proc/$c/comm" 2>/dev/null)" >> "$children"
  done
  r="$(kib "$apid" VmRSS)"
  [ "${r:-0}" -gt "$peak_rss" ] && peak_rss="$r"
  sleep 0.1
done
c1="$(cpu_ticks "$apid")"
t1="$(date +%s.%N)"
rss="$(kib "$apid" VmRSS)"
anon="$(kib "$apid" RssAnon)"

fac status -o json > "$out/status.json" 2>/dev/null
source="$(python3 - "$out/status.json" <<'PY'
import json, sys
try:
    t = [t for t in json.load(open(sys.argv[1]))["tenants"] if t["name"] == "footprint"][0]
    h = t.get("health") or {}
    print((h.get("gpu") or {}).get("source", "no health sample"))
except Exception as e:
    print("unknown (%s)" % e)
PY
)"

# One sample in a new process, against one nvidia-smi run.
percall() {  # percall LABEL CMD...: mean wall ms and peak RSS of REPEAT runs
  python3 - "$repeat" "$@" <<'PY'
import resource, subprocess, sys, time
n, label, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
walls = []
for _ in range(n):
    t = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    walls.append((time.monotonic() - t) * 1000)
    # factory-agent health exits 1 when the sample has a problem (no GPU):
    # it still sampled. Anything else did not run.
    if r.returncode not in (0, 1):
        print("  %-34s exit %d (%s)" % (label, r.returncode, " ".join(cmd)))
        sys.exit(0)
walls.sort()
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("  %-34s median %7.1f ms  min %7.1f ms  peak RSS %6.1f MB  (%d runs, last exit %d)"
      % (label, walls[len(walls) // 2], walls[0], peak / 1024, n, r.returncode))
PY
}

{
  echo "agent footprint, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -n), $(nproc) cores"
  echo "agent: $("$agent" --version 2>&1 | head -1)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "steady state, --link-only, health every ${interval} s, over ${seconds} s:"
  python3 - "$c0" "$c1" "$t0" "$t1" "$ticks" "$interval" <<'PY'
import sys
c0, c1, t0, t1, hz, iv = (float(x) for x in sys.argv[1:])
cpu = (c1 - c0) / hz
wall = t1 - t0
cycles = wall / iv
print("  CPU: %.3f s in %.1f s = %.4f%% of one core; %.1f ms per health cycle"
      % (cpu, wall, 100 * cpu / wall, 1000 * cpu / cycles))
PY
  echo "  resident: $((rss / 1024)).$(((rss % 1024) * 10 / 1024)) MB now (private $((anon / 1024)).$(((anon % 1024) * 10 / 1024)) MB), peak $((peak_rss / 1024)).$(((peak_rss % 1024) * 10 / 1024)) MB"
  if [ -s "$children" ]; then
    echo "  processes the agent started: $(sort "$children" | uniq -c | awk '{printf "%s x%s ", $2, $1}')"
  else
    echo "  processes the agent started: none"
  fi
  echo "  health source the coordinator saw: $source"
  echo
  echo "one GPU sample in a new process, ${repeat} runs each:"
  percall "factory-agent health -o json" "$agent" health -o json
  if command -v nvidia-smi >/dev/null; then
    percall "nvidia-smi --query-gpu (11 fields)" nvidia-smi \
      --query-gpu=memory.total,memory.used,memory.reserved,memory.free,utilization.gpu,temperature.gpu,power.draw,clocks.sm,clocks.mem,pstate,mig.mode.current \
      --format=csv,noheader,nounits
  else
    echo "  nvidia-smi: not on this machine"
  fi
} | tee "$out/footprint.txt"
echo "(logs and status in $out)"
