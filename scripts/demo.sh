#!/usr/bin/env bash
# make demo: the whole story on one machine, with no cluster and no GPU.
#
# Real: the `factory` coordinator and `factory-agent` binaries, TLS and mTLS
# websockets on loopback, enrollment, the plan engine, cloud-init user-data as
# rendered for the tenant, the agent download and its SHA-256 check.
# Simulated (test doubles, labelled as such in tests/): the Kubernetes API
# playing KubeVirt and CDI with two L4s on vfio-pci (tests/fakes/kube_apiserver.py),
# the VM booting and cloud-init applying its user-data (tests/guestsim/vm_runner.py),
# and the guest itself: a directory tree whose apt-get, dkms, nvidia-smi,
# reboot and Ollama are stand-ins answering with output captured from real
# machines (tests/guestsim/).
#
# Writes build/demo/: status.json (the final `factory status -o json`),
# usage.json (`factory usage -o json`),
# tenants.json (GET /v1/tenants), tenant-1.json, tenant-2.json, metrics.txt,
# events.txt (GET /v1/events for the whole run), dashboard.png (the dashboard
# in headless Chromium; skipped, saying so, where chromium is not installed),
# and the logs. Exits 0 only when every tenant is
# ready, and leaves no process running.
set -euo pipefail

build="${1:-build}"
top="$(cd "$(dirname "$0")/.." && pwd)"
cd "$top"
case "$build" in /*) ;; *) build="$top/$build" ;; esac
out="${FACTORY_DEMO_OUT:-$build/demo}"
factory="$build/coordinator/factory"
py=/usr/bin/python3
rm -rf "$out"
mkdir -p "$out"
work="$out/work"
mkdir -p "$work"

pids=()
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # The simulated guests' Ollama stand-ins.
  for root in "$work"/guests/*/root; do
    [ -d "$root" ] && tests/guestsim/guestsim.sh stop "$root" >/dev/null 2>&1 || true
  done
  exit $rc
}
trap cleanup EXIT INT TERM

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() {  # wait_for SECONDS CMD...
  local t=$(( $1 * 10 )); shift
  for _ in $(seq 1 "$t"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

cat <<'BANNER'
+--------------------------------------------------------------------------+
| Factory demo. SIMULATED here: the Kubernetes/KubeVirt API (a test double  |
| checking objects against KubeVirt's real OpenAPI schema), the VM boot,    |
| and the guest OS (stand-ins answering with output captured from a real    |
| L4 guest). REAL: factory, factory-agent, TLS/mTLS on loopback, cloud-init |
| user-data as rendered, the agent download and hash check, the plan.      |
+--------------------------------------------------------------------------+
BANNER

say "A Kubernetes API with KubeVirt, one node 'utho' with three L4s (10de:27b8) on vfio-pci [simulated]"
# The runbook's host had two; the third is for the runbook's third customer.
"$py" tests/fakes/kube_apiserver.py --pki-dir "$work/kube" --port-file "$work/kube.port" \
  --vfio-cards 10DE:27B8=3 > "$out/kube-apiserver.log" 2>&1 &
pids+=($!)
wait_for 20 test -s "$work/kube/kubeconfig" || { echo "the Kubernetes API test double did not start:"; cat "$out/kube-apiserver.log"; exit 1; }
kubeconfig="$work/kube/kubeconfig"

say "factory kubevirt allowlist --pci-id 10de:27b8 --resource-name nvidia.com/AD104GL_L4"
"$factory" kubevirt allowlist --kubeconfig "$kubeconfig" --pci-id 10de:27b8 \
  --resource-name nvidia.com/AD104GL_L4 --wait-timeout 30s

agents_port="$(free_port)"
api_port="$(free_port)"
cat > "$work/coordinator.yaml" <<EOF
state_dir: $work/state
external_url: wss://127.0.0.1:$agents_port
agents:
  listen: 127.0.0.1:$agents_port
  binary: $build/agent/factory-agent
api:
  listen: 127.0.0.1:$api_port
kube:
  kubeconfig: $kubeconfig
# The leader looks at each VM every 2 s here (15 s by default): the last
# tenant is made seconds before the usage table, which must show its GPU time.
usage:
  observe_every: 2s
EOF
cfg=(--config "$work/coordinator.yaml")

say "factory serve (agents on wss://127.0.0.1:$agents_port, API on https://127.0.0.1:$api_port)"
"$factory" serve "${cfg[@]}" > "$out/coordinator.log" 2>&1 &
pids+=($!)
wait_for 20 "$factory" "${cfg[@]}" status || { echo "factory serve did not start:"; cat "$out/coordinator.log"; exit 1; }
api_curl() { curl -s --cacert "$work/state/ca.crt" -H "Authorization: Bearer $(cat "$work/state/admin.token")" "$@"; }

# The status feed's live stream, read for the whole run: every agent
# connect, health change, step and phase as it happens.
api_curl -N "https://127.0.0.1:$api_port/v1/events" > "$out/events.txt" &
pids+=($!)

say "Simulated VMs: when KubeVirt reports a VMI Running, boot a simulated L4 guest and run its user-data [simulated]"
"$py" tests/guestsim/vm_runner.py --kubeconfig "$kubeconfig" --work "$work/guests" \
  --agent-arg=--heartbeat --agent-arg=1 \
  --agent-arg=--endpoint-usage-interval --agent-arg=2 > "$out/vm-runner.log" 2>&1 &
runner=$!
pids+=($runner)

# The VM simulator exits 1 at once when it breaks (a guest it cannot create, a
# command that reached one of its guards): say why and stop, rather than
# wait out a --wait that can no longer end well.
runner_failed() {
  echo "the VM simulator stopped (tests/guestsim/vm_runner.py); its log, $out/vm-runner.log, ends:" >&2
  tail -n 20 "$out/vm-runner.log" >&2
  exit 1
}
while_simulating() {  # while_simulating CMD...: runs CMD, unless the VM simulator dies first
  "$@" &
  local cmd=$!
  pids+=($cmd)
  while kill -0 "$cmd" 2>/dev/null; do
    if ! kill -0 "$runner" 2>/dev/null; then kill -TERM "$cmd" 2>/dev/null; wait "$cmd" || true; runner_failed; fi
    sleep 0.2
  done
  wait "$cmd"
}

say "factory catalog list"
"$factory" "${cfg[@]}" catalog list

# The admin's key for the guest's ubuntu user (a throwaway one for the demo).
ssh-keygen -q -t ed25519 -N '' -C demo-admin -f "$work/id_ed25519"

say "factory tenant create tenant-1 --tier gpu-vm --ssh-key id_ed25519.pub --wait"
while_simulating "$factory" "${cfg[@]}" tenant create tenant-1 --tier gpu-vm --ssh-key "$work/id_ed25519.pub" \
  --ssh-node-port 30022 --wait --timeout 3m

say "factory tenant create tenant-2 --tier gpu-k8s --wait   (its own RKE2, the GPU Operator, HAMi: one card as ten GPUs)"
while_simulating "$factory" "${cfg[@]}" tenant create tenant-2 --tier gpu-k8s --ssh-key "$work/id_ed25519.pub" \
  --ssh-node-port 30023 --wait --timeout 3m

say "factory tenant create t5 --tier model-endpoint --wait   (nothing but a keyed model API: no login)"
while_simulating "$factory" "${cfg[@]}" tenant create t5 --tier model-endpoint --wait --timeout 3m

say "factory tenant credentials t5, then one chat completion through the endpoint (curl, with the key)"
"$factory" "${cfg[@]}" tenant credentials t5 -o json > "$work/t5-credentials.json"
chmod 600 "$work/t5-credentials.json"
t5_field() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]], end="")' "$work/t5-credentials.json" "$1"; }
t5_field ca > "$out/endpoint-ca.crt"
t5_url="$(t5_field url)"
echo "endpoint: $t5_url (CA: build/demo/endpoint-ca.crt; key: factory tenant credentials t5)"
# The key goes to curl in a header file, never on a command line.
( umask 077; printf 'Authorization: Bearer %s\n' "$(t5_field api_key)" > "$work/t5-auth.header" )
curl -sS --fail-with-body --cacert "$out/endpoint-ca.crt" -H @"$work/t5-auth.header" \
  -H 'Content-Type: application/json' \
  -d '{"model":"llama3.2:1b","messages":[{"role":"user","content":"Say hello to the platform team."}]}' \
  "$t5_url/v1/chat/completions" > "$out/t5-chat-completion.json" \
  || { echo "the endpoint did not answer the chat completion:"; cat "$out/t5-chat-completion.json"; exit 1; }
"$py" -c 'import json,sys; c=json.load(open(sys.argv[1])); print("  %s: %s" % (c["model"], c["choices"][0]["message"]["content"]))' \
  "$out/t5-chat-completion.json"
no_key="$(curl -s -o /dev/null -w '%{http_code}' --cacert "$out/endpoint-ca.crt" "$t5_url/v1/models")"
echo "  without the key: HTTP $no_key"
[ "$no_key" = 401 ] || { echo "the endpoint answered $no_key without a key, not 401"; exit 1; }

# A tenant is ready when its plan is done; its first health report follows
# a moment later (the agent samples at once when the plan finishes).
reported() {
  "$factory" "${cfg[@]}" status -o json | "$py" -c '
import json, sys
for t in json.load(sys.stdin)["tenants"]:
    h = t.get("health", {})
    if not h.get("gpu", {}).get("gpus"): sys.exit(1)
    if t.get("tier") == "gpu-k8s" and "allocatable" not in h.get("k8s", {}): sys.exit(1)'
}
wait_for 30 reported || echo "warning: not every tenant has reported its health within 30 s"

say "factory status"
"$factory" "${cfg[@]}" status
"$factory" "${cfg[@]}" status -o json > "$out/status.json"
"$factory" "${cfg[@]}" tenant show tenant-1 -o json > "$out/tenant-1.json"
"$factory" "${cfg[@]}" tenant show tenant-2 -o json > "$out/tenant-2.json"
"$factory" "${cfg[@]}" tenant show t5 -o json > "$out/t5.json"
# /metrics takes the admin token like the rest of the API (api.metrics_public opens it).
api_curl "https://127.0.0.1:$api_port/metrics" > "$out/metrics.txt"
api_curl "https://127.0.0.1:$api_port/v1/tenants" > "$out/tenants.json"

say "The dashboard at https://127.0.0.1:$api_port/ (headless Chromium, signed in with the admin token)"
if command -v chromium >/dev/null 2>&1 && command -v node >/dev/null 2>&1 && [ -d /usr/share/nodejs/ws ]; then
  NODE_PATH=/usr/share/nodejs node tests/support/dashboard_probe.js "https://127.0.0.1:$api_port/" \
    "$work/state/admin.token" "$out/dashboard.png" 2 > "$out/dashboard-probe.log" 2>&1 \
    && echo "build/demo/dashboard.png" \
    || { echo "the dashboard did not load in Chromium:"; cat "$out/dashboard-probe.log"; exit 1; }
else
  echo "skipping build/demo/dashboard.png: chromium (and node with node-ws) is not installed; scripts/install-deps.sh --demo installs them"
fi
for g in "$work"/guests/*/; do
  n="$(basename "$g")"
  cp "$g/agent.log" "$out/$n-agent.log" 2>/dev/null || true
  cp "$g/cloud-init-output.log" "$out/$n-cloud-init-output.log" 2>/dev/null || true
done

# t5's agent reports its key's counts every 2 s here (a durable event): wait
# for the chat completion's tokens to be stored while the guests still run
# (a report spooled at a guest's stop is delivered at its next start), and
# for the leader's next look at every VM (usage.observe_every above).
for _ in $(seq 1 30); do
  "$factory" "${cfg[@]}" usage -o json > "$out/usage-wait.json"
  "$py" -c 'import json,sys; d=json.load(open(sys.argv[1]))["tenants"]; sys.exit(0 if any(k["completion_tokens"] > 0 for t in d if t["name"] == "t5" for k in t["keys"]) and all(t["gpu_seconds"] > 0 for t in d if t["gpu_model"]) else 1)' "$out/usage-wait.json" && break
  sleep 1
done

# Stopped now, the simulator says whether anything went wrong in it (exit 1:
# a command reached a guard; the log says which).
kill -TERM "$runner"
wait "$runner" || runner_failed

say "What the tenants report"
"$py" - "$out/status.json" <<'PYEOF'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = [t["name"] for t in doc["tenants"] if t.get("phase") != "ready"]
for t in doc["tenants"]:
    h = t.get("health", {})
    for g in h.get("gpu", {}).get("gpus", []):
        print("  %s: %s, %d MiB, driver %s" % (t["name"], g.get("name"), g.get("memory_total_mib", 0),
                                               h["gpu"].get("driver_version")))
    for m in h.get("ollama", {}).get("models", []):
        print("  %s: model %s, %s%% on the GPU" % (t["name"], m.get("name"), m.get("gpu_percent")))
    k8s = h.get("k8s", {})
    for n in k8s.get("nodes", []):
        print("  %s: node %s, allocatable nvidia.com/gpu %s" % (t["name"], n.get("name"), n.get("allocatable")))
if bad:
    print("not ready: " + ", ".join(bad))
    sys.exit(1)
print("every tenant is ready; see build/demo/status.json")
PYEOF

# GPU time per tenant, from the VM provider's own timestamps, and t5's tokens
# per key, from Ollama's own counts as its agent reported them (durable
# events, every 2 s in this demo, 60 s by default, waited for above while
# the guests still ran) (docs/usage.md): the leader looked at each VM every
# 2 s, and the wait above saw every tenant's GPU time.
say "factory usage   (GPU-seconds per tenant, tokens per key, over the last 30 days; docs/usage.md)"
"$factory" "${cfg[@]}" usage
"$factory" "${cfg[@]}" usage -o json > "$out/usage.json"
"$py" - "$out/usage.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))["tenants"]
idle = sorted({r["name"] for r in rows if r["gpu_model"] and r["gpu_seconds"] <= 0})
if idle:
    print("no GPU time counted for: " + ", ".join(idle))
    sys.exit(1)
t5 = [k for r in rows if r["name"] == "t5" for k in r["keys"]]
if not any(k["completion_tokens"] > 0 for k in t5):
    print("no tokens counted for t5's key: %s" % t5)
    sys.exit(1)
print("GPU time counted for every tenant with a card, and t5's tokens (%s); see build/demo/usage.json"
      % ", ".join("%s: %d prompt + %d completion in %d requests"
                  % (k["name"], k["prompt_tokens"], k["completion_tokens"], k["requests"]) for k in t5))
PYEOF
