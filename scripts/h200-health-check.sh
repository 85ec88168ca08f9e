#!/bin/bash
# The agent's GPU figures against nvidia-smi's, on a real GPU guest, in one
# run: for the lead's check on the H200 VM (Ubuntu 24.04, driver 580, one
# H200). Needs only the factory-agent binary beside this script (built
# statically but for glibc) and the driver's nvidia-smi on PATH; changes
# nothing on the machine. Takes about a second.
#
#   ./h200-health-check.sh [OUT_DIR]      (default ./h200-health-<UTC time>)
#
# It runs, back to back:
#   factory-agent health -o json --raw                  (NVML; --raw adds NVML's bytes)
#   nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits
#   nvidia-smi -q -d MEMORY
# and `factory-agent health-compare` on what they printed: memory
# (total, reserved, used, free) must be exact against both nvidia-smi
# outputs; utilization ±10 points, temperature ±3 C, power ±15 W or 10%,
# SM clock ±20%, memory clock ±5%, pstate and MIG mode exact. It prints the
# three outputs and the verdict, and leaves them in OUT_DIR with env.txt
# and COMMANDS, ready to commit as a fixture (tests/fixtures/device/).
# Exit 0: they agree; 1: they differ; 2: it could not run.
#
# Why: on this machine `nvidia-smi -q` said FB Used 0 MiB, Reserved 616 MiB,
# and the agent before NVML's v2 memory info said memory_used_mib 615 (v1
# counts the reserved memory as used).
#
# Tests run it on the simulated guest with FACTORY_AGENT (the binary) and
# FACTORY_HEALTH_ROOT (the guest's root) set; leave both unset on the VM.
set -u

here="$(cd "$(dirname "$0")" && pwd)"
agent="${FACTORY_AGENT:-$here/factory-agent}"
root="${FACTORY_HEALTH_ROOT:-}"
out="${1:-$PWD/h200-health-$(date -u +%Y%m%dT%H%M%SZ)}"
fields="memory.total,memory.used,memory.reserved,memory.free,utilization.gpu,temperature.gpu,power.draw,clocks.sm,clocks.mem,pstate,mig.mode.current"

die() { echo "h200-health-check: $*" >&2; exit 2; }
[ -x "$agent" ] || die "no factory-agent at $agent: put the binary beside this script"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi is not on PATH: is the NVIDIA driver installed?"
mkdir -p "$out" || die "cannot make $out"

root_args=()
[ -n "$root" ] && root_args=(--root "$root")

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "kernel: $(uname -r)"
  grep -h '^PRETTY_NAME=' "$root/etc/os-release" 2>/dev/null || true
  echo "agent: $("$agent" --version 2>&1)"
  nvidia-smi --version 2>&1 | sed -n '1,4p'
} > "$out/env.txt"

cat > "$out/COMMANDS" <<CMDS
factory-agent health -o json --raw > agent-health.json
nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits > nvidia-smi-query-gpu.csv
nvidia-smi -q -d MEMORY > nvidia-smi-q-memory.txt
factory-agent health-compare --agent agent-health.json --query-gpu nvidia-smi-query-gpu.csv --fields $fields --q-memory nvidia-smi-q-memory.txt
CMDS

# Back to back: the memory figures of an idle GPU hold still between them.
"$agent" health -o json --raw "${root_args[@]}" > "$out/agent-health.json" 2> "$out/agent-health.err"
agent_rc=$?
nvidia-smi "--query-gpu=$fields" --format=csv,noheader,nounits > "$out/nvidia-smi-query-gpu.csv" 2>&1
query_rc=$?
nvidia-smi -q -d MEMORY > "$out/nvidia-smi-q-memory.txt" 2>&1
memory_rc=$?

show() {  # show TITLE FILE
  echo "==== $1"
  cat "$2"
  echo
}
show "factory-agent health -o json --raw (exit $agent_rc)" "$out/agent-health.json"
[ -s "$out/agent-health.err" ] && show "factory-agent health: stderr" "$out/agent-health.err"
show "nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits (exit $query_rc)" "$out/nvidia-smi-query-gpu.csv"
show "nvidia-smi -q -d MEMORY (exit $memory_rc)" "$out/nvidia-smi-q-memory.txt"

[ $query_rc -eq 0 ] || die "nvidia-smi --query-gpu failed (exit $query_rc); its output is above"
[ $memory_rc -eq 0 ] || die "nvidia-smi -q -d MEMORY failed (exit $memory_rc); its output is above"

compare=("$agent" health-compare --agent "$out/agent-health.json" --query-gpu "$out/nvidia-smi-query-gpu.csv"
         --fields "$fields" --q-memory "$out/nvidia-smi-q-memory.txt")
"${compare[@]}" -o json > "$out/verdict.json" 2>&1
"${compare[@]}" > "$out/verdict.txt" 2>&1
verdict_rc=$?
show "the agent against nvidia-smi" "$out/verdict.txt"
echo "outputs kept in $out"
[ $verdict_rc -le 1 ] || die "the comparison could not run (exit $verdict_rc)"
exit $verdict_rc
