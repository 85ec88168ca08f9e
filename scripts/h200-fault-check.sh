#!/bin/bash
# The agent's fault figures and NVML event set against nvidia-smi, on a real
# GPU guest, in one run: for the H200 VM (issue 25). Read-only for the card:
# it changes no setting, resets nothing, injects nothing. Needs only the
# factory-agent binary beside this script (static but for glibc) and the
# driver's nvidia-smi on PATH. Takes about 15 seconds.
#
#   ./h200-fault-check.sh [OUT_DIR]      (default ./h200-faults-<UTC time>)
#
# It runs:
#   factory-agent faults watch --seconds 10 -o json   (NVML's event set: Xid and
#       ECC events registered on every GPU, then waited on in one-second
#       nvmlEventSetWait_v2 calls; none is expected on a healthy card, and
#       every wait must end in its timeout, not an error)
# then, back to back:
#   factory-agent health -o json --state-dir OUT/state
#   nvidia-smi -q
#   nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits
#   nvidia-smi -q -d MEMORY
#   nvidia-smi --query-gpu=total_energy_consumption --format=csv,noheader,nounits
#       (recorded as it answers: the agent's energy_mj is compared by hand)
# and `factory-agent health-compare ... --q nvidia-smi-q.txt`: the earlier
# figures within their tolerances, and every fault figure both report
# exactly (serial, PCIe replays, clock event reasons, ECC counts, retired
# pages, remapped rows). It prints the verdicts and leaves the outputs in
# OUT_DIR with env.txt and COMMANDS, ready to commit as a fixture
# (tests/fixtures/device/). Exit 0: the event set registered and waited
# without error and the figures agree; 1: they differ; 2: it could not run.
set -u

here="$(cd "$(dirname "$0")" && pwd)"
agent="${FACTORY_AGENT:-$here/factory-agent}"
out="${1:-$PWD/h200-faults-$(date -u +%Y%m%dT%H%M%SZ)}"
fields="memory.total,memory.used,memory.reserved,memory.free,utilization.gpu,temperature.gpu,power.draw,clocks.sm,clocks.mem,pstate,mig.mode.current"

die() { echo "h200-fault-check: $*" >&2; exit 2; }
[ -x "$agent" ] || die "no factory-agent at $agent: put the binary beside this script"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi is not on PATH: is the NVIDIA driver installed?"
mkdir -p "$out/state" || die "cannot make $out"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "kernel: $(uname -r)"
  grep -h '^PRETTY_NAME=' /etc/os-release 2>/dev/null || true
  echo "agent: $("$agent" --version 2>&1)"
  nvidia-smi --version 2>&1 | sed -n '1,4p'
} > "$out/env.txt"

cat > "$out/COMMANDS" <<CMDS
factory-agent faults watch --seconds 10 -o json > faults-watch.json
factory-agent health -o json --state-dir state > agent-health.json
nvidia-smi -q > nvidia-smi-q.txt
nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits > nvidia-smi-query-gpu.csv
nvidia-smi -q -d MEMORY > nvidia-smi-q-memory.txt
nvidia-smi --query-gpu=total_energy_consumption --format=csv,noheader,nounits > nvidia-smi-energy.txt
factory-agent health-compare --agent agent-health.json --query-gpu nvidia-smi-query-gpu.csv --fields $fields --q-memory nvidia-smi-q-memory.txt --q nvidia-smi-q.txt
CMDS

"$agent" faults watch --seconds 10 -o json > "$out/faults-watch.json" 2> "$out/faults-watch.err"
watch_status=$?
echo "== faults watch (exit $watch_status)"
cat "$out/faults-watch.json" "$out/faults-watch.err"

"$agent" health -o json --state-dir "$out/state" > "$out/agent-health.json" 2> "$out/agent-health.err"
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1
nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits > "$out/nvidia-smi-query-gpu.csv" 2>&1
nvidia-smi -q -d MEMORY > "$out/nvidia-smi-q-memory.txt" 2>&1
nvidia-smi --query-gpu=total_energy_consumption --format=csv,noheader,nounits \
  > "$out/nvidia-smi-energy.txt" 2>&1
echo "exit $?" >> "$out/nvidia-smi-energy.txt"

echo "== the agent's fault figures"
python3 - "$out/agent-health.json" <<'PY' || true
import json, sys
keys = ["serial", "lost", "pcie_replay_count", "clocks_event_reasons", "energy_mj",
        "ecc_errors_corrected_volatile", "ecc_errors_uncorrected_volatile",
        "ecc_errors_corrected_aggregate", "ecc_errors_uncorrected_aggregate",
        "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
        "remapped_rows_failure", "retired_pages_sbe", "retired_pages_dbe",
        "retired_pages_pending", "nvlink", "xids"]
h = json.load(open(sys.argv[1]))
for g in h["gpu"]["gpus"]:
    print("GPU %s %s" % (g.get("index"), g.get("uuid")))
    for k in keys:
        print("  %-34s %s" % (k, json.dumps(g.get(k))))
PY
echo "== nvidia-smi energy: $(tr '\n' ' ' < "$out/nvidia-smi-energy.txt")"

echo "== health-compare"
"$agent" health-compare --agent "$out/agent-health.json" \
  --query-gpu "$out/nvidia-smi-query-gpu.csv" --fields "$fields" \
  --q-memory "$out/nvidia-smi-q-memory.txt" --q "$out/nvidia-smi-q.txt" | tee "$out/compare.txt"
compare_status=${PIPESTATUS[0]}

rm -rf "$out/state"
if [ "$watch_status" -ne 0 ]; then
  echo "VERDICT: the event set did not register and wait cleanly (exit $watch_status)"
  exit 1
fi
exit "$compare_status"
