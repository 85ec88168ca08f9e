#!/bin/bash
# What an idle agent costs the coordinator (issue 24's figure), with real
# agents: a real `factory serve` on loopback, N real `factory-agent
# --link-only` processes (default 300), each enrolled with its own one-time
# token and connected; then the coordinator's resident memory (VmRSS, and
# its private part RssAnon) before the first agent and after all of them
# have been connected and idle for IDLE seconds, and the difference per
# agent; then the agents stop, and what stays (their tenants' state) is told
# apart from what went with their connections. The agents report health
# every HEALTH seconds (default 60: idle), so one health sample per tenant
# is held too, as in production.
#
#   bench/idle-agents.sh [--agents N] [--idle S] [--health S] [--out DIR]
#
# The binaries come from FACTORY_BIN and FACTORY_AGENT, else from beside this
# script, else from build/coordinator/ and build/agent/. Needs python3.
# Ports are picked on 127.0.0.1 only. Each agent needs about 10 MB of this
# machine's memory and three descriptors of the coordinator.
# Exit 0 when it measured, 2 when it could not run.
set -u

agents=300
idle=20
health=60
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) agents="$2"; shift 2 ;;
    --idle) idle="$2"; shift 2 ;;
    --health) health="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "idle-agents: unknown argument '$1' (see --help)" >&2; exit 2 ;;
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
die() { echo "idle-agents: $*" >&2; exit 2; }
[ -n "$factory" ] && [ -x "$factory" ] || die "no factory binary (set FACTORY_BIN or build it)"
[ -n "$agent" ] && [ -x "$agent" ] || die "no factory-agent binary (set FACTORY_AGENT or build it)"
command -v python3 >/dev/null || die "python3 is needed for JSON"
[ "$(ulimit -n)" -ge $((agents * 2 + 64)) ] || ulimit -n $((agents * 2 + 64)) 2>/dev/null ||
  die "the open-file limit ($(ulimit -n)) is too low for $agents agents"

work="$(mktemp -d /tmp/idle-agents.XXXXXX)"
[ -n "$out" ] || out="$work/out"
mkdir -p "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work/state" "$work/agents"
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
log_level: warn
YAML
"$factory" serve --config "$work/coordinator.yaml" > "$out/coordinator.log" 2>&1 &
cpid=$!
pids+=($cpid)
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$api_port") 2>/dev/null && break
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$api_port") 2>/dev/null || { cat "$out/coordinator.log"; die "factory serve did not start"; }

fac() { "$factory" --config "$work/coordinator.yaml" "$@"; }
kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
# How many agents are connected, from /metrics (a few hundred bytes), not
# from `status -o json`: that answer is about 3 KiB per tenant, built in the
# coordinator just before each reading, and it showed in the figure as 3 KiB
# per agent that the agents do not cost.
connected() {
  python3 - "$work/state" "$api_port" <<'PY'
import ssl, sys, urllib.request
state, port = sys.argv[1], sys.argv[2]
try:
    ctx = ssl.create_default_context(cafile=state + "/ca.crt")
    ctx.check_hostname = False
    token = open(state + "/admin.token").read().strip()
    req = urllib.request.Request("https://127.0.0.1:%s/metrics" % port,
                                 headers={"Authorization": "Bearer " + token})
    for line in urllib.request.urlopen(req, context=ctx, timeout=10).read().decode().splitlines():
        if line.startswith("factory_agents_connected "):
            print(int(float(line.split()[1])))
            break
    else:
        print(0)
except Exception:
    print(0)
PY
}

# The tokens first (each a tenant of its own), then the baseline: the
# coordinator as it is before any agent, its store holding the N tenants.
mkdir -p "$work/agents"
for i in $(seq "$agents"); do
  d="$work/agents/a$i"
  mkdir -p "$d"
  fac token create --tenant "idle-$i" -o json > "$d/token.json" || die "token create $i failed"
done
url="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["coordinator_url"])' "$work/agents/a1/token.json")"
ca="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ca_sha256"])' "$work/agents/a1/token.json")"
sleep 3
rss0="$(kib "$cpid" VmRSS)"
anon0="$(kib "$cpid" RssAnon)"

t0=$SECONDS
for i in $(seq "$agents"); do
  d="$work/agents/a$i"
  ( umask 077; python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$d/token.json" > "$d/token" )
  "$agent" --coordinator-url "$url" --ca-sha256 "$ca" --token-file "$d/token" \
    --state-dir "$d/state" --link-only --health-interval "$health" --log-level warn \
    > "$d/agent.log" 2>&1 &
  pids+=($!)
done
n=0
for _ in $(seq 240); do
  n="$(connected)"
  [ "$n" -ge "$agents" ] && break
  sleep 1
done
[ "$n" -ge "$agents" ] || die "only $n of $agents agents connected after 240 s (logs in $work/agents)"
took=$((SECONDS - t0))
sleep "$idle"
n="$(connected)"
rss1="$(kib "$cpid" VmRSS)"
anon1="$(kib "$cpid" RssAnon)"
fds="$(ls /proc/$cpid/fd | wc -l)"
# Then the agents leave: what stays is what their tenants cost (records,
# presence, the latest health, tokens spent), not their connections. The
# coordinator hands freed memory back every 5 s.
for p in "${pids[@]:1}"; do kill "$p" 2>/dev/null; done
for _ in $(seq 60); do
  [ "$(connected)" -eq 0 ] && break
  sleep 1
done
sleep 12
rss2="$(kib "$cpid" VmRSS)"
anon2="$(kib "$cpid" RssAnon)"

{
  echo "idle agents, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -n), $(nproc) cores"
  echo "coordinator: $("$factory" --version 2>&1 | head -1)"
  echo "$agents real factory-agent --link-only, each with its own token and tenant, health every ${health} s"
  echo "all connected ${took} s after the first started; ${n} connected after ${idle} s idle; coordinator fds ${fds}"
  echo "coordinator resident: ${rss0} KiB before the first agent, ${rss1} KiB with them (private ${anon0} -> ${anon1} KiB)"
  echo "after the agents left: ${rss2} KiB (private ${anon2} KiB)"
  python3 - "$rss0" "$rss1" "$anon0" "$anon1" "$rss2" "$agents" <<'PY'
import sys
r0, r1, a0, a1, r2, n = (int(x) for x in sys.argv[1:])
print("per idle agent: %.1f KiB resident, %.1f KiB private" % ((r1 - r0) / n, (a1 - a0) / n))
print("  of which its connection (gone when it left): %.1f KiB; its tenant's state (stays): %.1f KiB"
      % ((r1 - r2) / n, (r2 - r0) / n))
PY
} | tee "$out/idle-agents.txt"
echo "(logs in $out)"
