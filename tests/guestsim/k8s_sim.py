"""GUEST SIMULATOR: the guest's own Kubernetes (RKE2's server, its kubectl,
and helm with the GPU Operator and HAMi charts). A SIMULATION for tests on a
machine with no VM, no containers and no cluster; see tests/guestsim/README.md.

Run by the stand-ins, never directly:
  opt/kubectl              -> k8s_sim.py kubectl ARGS...
  opt/helm                 -> k8s_sim.py helm ARGS...
  systemctl start rke2-server (bin/_lib.sh) -> k8s_sim.py server-start
  opt/rke2-uninstall.sh    -> k8s_sim.py uninstall

What it models, all of it state under <root>/.guestsim/state/{k8s,helm}/:
  - the cluster's ranges are fixed at the server's first start: they come
    from <root>/etc/rancher/rke2/config.yaml, or RKE2's defaults
    (10.42.0.0/16, 10.43.0.0/16, 10.43.0.10) when it has none (or when the
    knob rke2_dns_clash says the server ignored it); only rke2-uninstall.sh
    forgets them, as with the real RKE2;
  - the node is Ready rke2_ready_delay seconds (default 1) after the server
    started, unless the guest's DNS server (from DHCP: the host cluster's
    10.43.0.10) lies inside the cluster's service range: then the guest's
    kube-proxy captures it, lookups are refused, rke2-canal stays in
    ImagePullBackOff and the node NotReady (the runbook's failure);
  - helm releases with their user-supplied values; `--wait` succeeds only
    when what the chart runs can become ready (a Ready node; for HAMi a
    running device plugin wherever one is scheduled) and fails at once with
    Helm's "context deadline exceeded" otherwise (it does not spend the
    timeout);
  - the GPU Operator release does at once what its DaemonSets do over a few
    minutes on a real guest: the driver container loads nvidia 580.126.20
    (the profile's DRIVER_VERSION; a values driver.version other than that
    loads nothing, there being no capture of another), nvidia-smi appears under
    /run/nvidia/driver, the toolkit writes /run/nvidia/validations/toolkit-ready,
    the RuntimeClass nvidia exists, NFD labels the node
    nvidia.com/gpu.present=true; its own device plugin runs unless the values
    say devicePlugin.enabled: false;
  - HAMi's device plugin DaemonSet has the chart's node selector
    (devicePlugin.nvidiaNodeSelector, default gpu: "on"): on an unlabelled
    node it has no pod at all; with gpuOperatorToolkitReady.enabled its pod
    waits in Init until the toolkit is ready; without a loaded driver it
    crashes (NVML); knob hami_device_plugin_crash crashes it too. While it
    runs the node advertises nvidia.com/gpu = deviceSplitCount (default 10)
    x the GPUs on the bus. (The runbook calls the unlabelled case "the HAMi
    pods stay Pending"; with the chart's DaemonSet no device plugin pod is
    even created, and a pod asking for nvidia.com/gpu stays Pending.)
  - Pods applied with `kubectl apply -f` (the runbook's gpu-test pods):
    Running when the node has the nvidia.com/gpu they ask for, else Pending;
    `kubectl exec POD -- nvidia-smi` prints the runbook's capture from such a
    pod (tenant2-pod-nvidia-smi-hami-1024MiB.txt), its memory limit being the
    pod's nvidia.com/gpumem.
  - MIG (profiles with MIG_PROFILES: the H200): with the GPU Operator's
    values mig.strategy mixed and a mig-manager config it creates
    (migManager.config.create/name/data["config.yaml"], mig-parted's format),
    labelling the node nvidia.com/mig.config=NAME makes mig-manager apply
    that entry at once: the card's MIG mode and instances change through
    mig_sim.py (nvidia-smi in the guest shows them), the node gets
    nvidia.com/mig.config.state=success, and the operator's device plugin
    advertises nvidia.com/mig-<profile> per created slice (GPUs in MIG mode
    no longer count as nvidia.com/gpu). A config name the ConfigMap lacks,
    or a profile the card does not offer, leaves the state failed and
    advertises nothing. WITH_REBOOT's reboot is not modelled (the mode
    change is applied at once, as on a card the driver can reset).

Output is shaped like the real tools' (kubectl's JSON objects and tables,
helm's messages and JSON); the node's allocatable is the runbook's capture
(l4-runbook/tenant2-node-allocatable.txt). What it does not do: an API
server, containers, images, networking, scheduling beyond the above, any
chart template, CRDs, or any other kubectl/helm command.
"""

import datetime
import fcntl
import ipaddress
import json
import os
import re
import sys
import time

import yaml

ROOT = os.environ.get("FACTORY_GUESTSIM_ROOT", "")
HOME = os.environ.get("GS_HOME", os.path.dirname(os.path.abspath(__file__)))
G = os.path.join(ROOT, ".guestsim")
STATE = os.path.join(G, "state")
K8S = os.path.join(STATE, "k8s")
HELM = os.path.join(STATE, "helm")

DEFAULT_RANGES = {"cluster-cidr": "10.42.0.0/16", "service-cidr": "10.43.0.0/16", "cluster-dns": "10.43.0.10"}
KUBECONFIG = "etc/rancher/rke2/rke2.yaml"
API = "127.0.0.1:6443"

# The charts the simulated repositories serve: {repo url: {chart: {version: appVersion}}}.
CHART_INDEX = {
    "https://nvidia.github.io/gpu-operator": {"gpu-operator": {"v26.3.2": "v26.3.2"}},
    "https://project-hami.github.io/HAMi/": {"hami": {"2.10.0": "2.10.0"}},
}
CHART_DESCRIPTIONS = {
    "gpu-operator": "NVIDIA GPU Operator creates/configures/manages GPUs atop Kubernetes",
    "hami": "Heterogeneous AI Computing Virtualization Middleware",
}


# --------------------------------------------------------------------------- plumbing

def p(*parts):
    return os.path.join(*parts)


def rootp(abs_path):
    return p(ROOT, abs_path.lstrip("/"))


def config(key):
    try:
        with open(p(G, "config")) as f:
            for line in f:
                if line.startswith(key + "="):
                    return line[len(key) + 1:].rstrip("\n")
    except OSError:
        pass
    return ""


def profile(key):
    try:
        with open(p(G, "profile.env")) as f:
            for line in f:
                m = re.match(r"^%s=(.*)$" % re.escape(key), line.rstrip("\n"))
                if m:
                    v = m.group(1)
                    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
                        v = v[1:-1]
                    return v
    except OSError:
        pass
    return ""


def knob(name):
    """The knob's content ("" when set without content), None when off."""
    try:
        with open(p(G, "knobs", name)) as f:
            return f.read().strip()
    except OSError:
        return None


def count(name):
    d = p(STATE, "counters")
    os.makedirs(d, exist_ok=True)
    f = p(d, name)
    with open(f + ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        n = 0
        try:
            with open(f) as r:
                n = int(r.read().strip() or 0)
        except (OSError, ValueError):
            pass
        with open(f + ".tmp", "w") as w:
            w.write("%d\n" % (n + 1))
        os.replace(f + ".tmp", f)


def load(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def save(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def write_text(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def iso(t=None):
    return datetime.datetime.fromtimestamp(t if t is not None else time.time(), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def age(since):
    s = max(0, int(time.time() - since))
    if s < 120:
        return "%ds" % s
    if s < 3 * 3600:
        return "%dm" % (s // 60)
    if s < 48 * 3600:
        return "%dh" % (s // 3600)
    return "%dd" % (s // 86400)


def out(text=""):
    sys.stdout.write(text)


def die(msg, code=1):
    sys.stderr.write(msg + "\n")
    sys.exit(code)


# --------------------------------------------------------------------------- the guest

def node_name():
    return config("hostname") or "tenant-2"


def gpu_functions():
    base = rootp("/sys/bus/pci/devices")
    found = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return found
    for a in names:
        try:
            with open(p(base, a, "vendor")) as f:
                vendor = f.read().strip()
            with open(p(base, a, "class")) as f:
                klass = f.read().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass.startswith("0x03"):
            found.append(a)
    return found


def module_loaded():
    return os.path.isdir(rootp("/sys/module/nvidia"))


def guest_dns():
    """The nameservers the guest got from DHCP (what systemd-resolved holds,
    guestsim.sh writes it from the profile), else /etc/resolv.conf's
    (skipping the 127.0.0.53 stub)."""
    try:
        with open(p(STATE, "resolved", "servers")) as f:
            servers = f.read().split()
        if servers:
            return servers
    except OSError:
        pass
    servers = []
    for f in ("/run/systemd/resolve/resolv.conf", "/etc/resolv.conf"):
        try:
            with open(rootp(f)) as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) >= 2 and parts[0] == "nameserver" and not parts[1].startswith("127."):
                        servers.append(parts[1])
        except OSError:
            continue
        if servers:
            break
    return servers


def read_rke2_config():
    try:
        with open(rootp("/etc/rancher/rke2/config.yaml")) as f:
            c = yaml.safe_load(f) or {}
        return c if isinstance(c, dict) else {}
    except (OSError, yaml.YAMLError):
        return {}


# --------------------------------------------------------------------------- the cluster

def cluster():
    return load(p(K8S, "cluster.json"), None)


def server():
    return load(p(K8S, "server.json"), None)


def api_up():
    try:
        with open(p(STATE, "services", "rke2-server.result")) as f:
            active = f.read().strip() == "active"
    except OSError:
        active = False
    return active and server() is not None and cluster() is not None


def ready_delay():
    k = knob("rke2_ready_delay")
    try:
        return float(k) if k not in (None, "") else 1.0
    except ValueError:
        return 1.0


def dns_clash(c=None):
    c = c or cluster()
    if not c:
        return None
    svc = ipaddress.ip_network(c["service-cidr"], strict=False)
    for s in guest_dns():
        try:
            if ipaddress.ip_address(s) in svc:
                return s
        except ValueError:
            continue
    return None


def node_ready():
    if not api_up():
        return False
    if dns_clash():
        return False
    return time.time() >= server()["started"] + ready_delay()


def releases():
    d = p(HELM, "releases")
    out_ = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out_
    for n in names:
        if n.endswith(".json"):
            r = load(p(d, n), None)
            if r:
                out_.append(r)
    return out_


def release_path(ns, name):
    return p(HELM, "releases", "%s__%s.json" % (ns, name))


def deployed_chart(chart):
    """The release of this chart whose objects are in the cluster: a release
    whose --wait failed (status failed) or that is still pending keeps what
    it created, as Helm does without --atomic."""
    for r in releases():
        if r["chart"] == chart and r["status"] != "uninstalled":
            return r
    return None


def get_in(d, path, default=None):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def user_labels():
    return load(p(K8S, "labels.json"), {}).get(node_name(), {})


def node_labels():
    n = node_name()
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": "rke2",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": n,
        "kubernetes.io/os": "linux",
        "node-role.kubernetes.io/control-plane": "true",
        "node-role.kubernetes.io/etcd": "true",
        "node.kubernetes.io/instance-type": "rke2",
    }
    if deployed_chart("gpu-operator") and gpu_functions():
        labels["nvidia.com/gpu.present"] = "true"  # node-feature-discovery's label
    labels.update(user_labels())
    return labels


def toolkit_ready():
    return os.path.exists(rootp("/run/nvidia/validations/toolkit-ready"))


def hami_plugin_state(values=None, labels=None):
    """None: HAMi not deployed; 'absent': no pod (the node does not match the
    DaemonSet's node selector); 'init', 'crash', 'running'."""
    rel = deployed_chart("hami")
    if values is None:
        if not rel:
            return None
        values = rel["values"]
    labels = node_labels() if labels is None else labels
    selector = get_in(values, ["devicePlugin", "nvidiaNodeSelector"], {"gpu": "on"}) or {}
    for k, v in selector.items():
        if v is None:
            continue  # `gpu: null` removes the chart's default
        if labels.get(k) != str(v):
            return "absent"
    if get_in(values, ["devicePlugin", "gpuOperatorToolkitReady", "enabled"], False) and not toolkit_ready():
        return "init"
    if not module_loaded() or knob("hami_device_plugin_crash") is not None:
        return "crash"
    return "running"


def operator_plugin_running():
    rel = deployed_chart("gpu-operator")
    if not rel:
        return False
    return get_in(rel["values"], ["devicePlugin", "enabled"], True) is not False and module_loaded()


def mig_state():
    """mig_sim.py's state of GPU 0, or None when the profile has no MIG."""
    if not profile("MIG_PROFILES"):
        return None
    return load(p(STATE, "mig", "state.json"), None)


def mig_sim(*args):
    import subprocess
    env = dict(os.environ, FACTORY_GUESTSIM_ROOT=ROOT)
    return subprocess.run([sys.executable, p(HOME, "mig_sim.py")] + list(args), env=env,
                          capture_output=True, text=True)


def mig_allocatable():
    """{nvidia.com/mig-<profile>: n} the operator's device plugin advertises (mixed strategy)."""
    rel = deployed_chart("gpu-operator")
    if not rel or not operator_plugin_running() or not node_ready():
        return {}
    if get_in(rel["values"], ["mig", "strategy"], "single") != "mixed":
        return {}
    st = mig_state()
    if not st or st.get("current") != "Enabled":
        return {}
    out = {}
    for g in st.get("gpu_instances", []):
        if g.get("ci"):
            key = "nvidia.com/mig-" + g["profile"]
            out[key] = out.get(key, 0) + 1
    return out


def mig_manager_apply():
    """mig-manager: applies the entry the node's nvidia.com/mig.config names."""
    rel = deployed_chart("gpu-operator")
    if not rel or not node_ready() or not module_loaded() or not profile("MIG_PROFILES"):
        return
    if get_in(rel["values"], ["migManager", "enabled"], True) is False:
        return
    name = user_labels().get("nvidia.com/mig.config")
    if not name:
        return
    cfg = get_in(rel["values"], ["migManager", "config"], {}) or {}
    state = "failed"
    try:
        doc = yaml.safe_load(((cfg.get("data") or {}).get("config.yaml")) or "") if cfg.get("create") else None
        entries = ((doc or {}).get("mig-configs") or {}).get(name)
    except yaml.YAMLError:
        entries = None
    if entries:
        entry = None
        for e in entries:
            d = e.get("devices")
            if d == "all" or (isinstance(d, list) and 0 in d):
                entry = e
                break
        ok = entry is not None
        if ok and entry.get("mig-enabled"):
            mig_sim("mode", "1")
            mig_sim("mig", "-i", "0", "-dci")
            mig_sim("mig", "-i", "0", "-dgi")
            # mig-parted creates by profile name, larger slices first.
            names = sorted((entry.get("mig-devices") or {}).items(),
                           key=lambda kv: -int(str(kv[0]).split("g.")[0]))
            ids = ",".join(",".join([str(k)] * int(v)) for k, v in names)
            if ids:
                ok = mig_sim("mig", "-i", "0", "-cgi", ids, "-C").returncode == 0
        elif ok:
            mig_sim("mig", "-i", "0", "-dci")
            mig_sim("mig", "-i", "0", "-dgi")
            mig_sim("mode", "0")
        state = "success" if ok else "failed"
    all_labels = load(p(K8S, "labels.json"), {})
    mine = all_labels.get(node_name(), {})
    mine["nvidia.com/mig.config.state"] = state
    all_labels[node_name()] = mine
    save(p(K8S, "labels.json"), all_labels)


def gpu_allocatable():
    """(count, who) for nvidia.com/gpu, or (None, None) when nobody advertises it."""
    n = len(gpu_functions())
    if not node_ready() or n == 0:
        return None, None
    if mig_allocatable():
        # The card is in MIG mode: it is advertised by its slices only.
        n -= 1
        return (n, "gpu-operator") if n > 0 else (None, None)
    if operator_plugin_running():
        # Two plugins registering the same resource: the kubelet keeps the
        # last registration; the operator's plugin re-registers on restart.
        return n, "gpu-operator"
    if hami_plugin_state() == "running":
        split = get_in(deployed_chart("hami")["values"], ["devicePlugin", "deviceSplitCount"], 10)
        return int(split) * n, "hami"
    return None, None


# What l4-runbook/tenant2-node-allocatable.txt shows, in kubectl's order.
ALLOCATABLE = [
    ("cpu", "8"),
    ("ephemeral-storage", "97743690881"),
    ("hugepages-1Gi", "0"),
    ("hugepages-2Mi", "0"),
    ("memory", "16367176Ki"),
]
# No capture shows the capacity: it is the captured allocatable plus the
# kubelet's default eviction thresholds (memory.available<100Mi,
# nodefs.available<10%), rounded.
CAPACITY = [
    ("cpu", "8"),
    ("ephemeral-storage", "106058692Ki"),
    ("hugepages-1Gi", "0"),
    ("hugepages-2Mi", "0"),
    ("memory", "16469576Ki"),
]


def resources(base):
    r = dict(base)
    g, _ = gpu_allocatable()
    if g is not None:
        r["nvidia.com/gpu"] = str(g)
    for k, v in mig_allocatable().items():
        r[k] = str(v)
    r["pods"] = "110"
    return r


def node_object():
    c = cluster()
    s = server()
    ready = node_ready()
    n = node_name()
    if ready:
        cond = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status"}
    else:
        cond = {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                "message": "container runtime network not ready: NetworkReady=false "
                           "reason:NetworkPluginNotReady message:Network plugin returns error: "
                           "cni plugin not initialized"}
    cond.update({"lastHeartbeatTime": iso(), "lastTransitionTime": iso(s["started"])})
    pod_net = ipaddress.ip_network(c["cluster-cidr"], strict=False)
    pod_cidr = "%s/24" % pod_net.network_address
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": n,
            "uid": "00000000-0000-4000-8000-00000000f00d",
            "creationTimestamp": iso(c["created"]),
            "labels": node_labels(),
            "annotations": {
                "rke2.io/node-args": json.dumps(["server"]),
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.2.2"}, {"type": "Hostname", "address": n}],
            "allocatable": resources(ALLOCATABLE),
            "capacity": resources(CAPACITY),
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "message": "kubelet has sufficient memory available"},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                 "message": "kubelet has no disk pressure"},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
                 "message": "kubelet has sufficient PID available"},
                cond,
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://2.1.4-k3s1",
                "kernelVersion": config("kernel"),
                "kubeProxyVersion": c.get("version", ""),
                "kubeletVersion": c.get("version", ""),
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.3 LTS",
            },
        },
    }


def container_status(name, state, reason="", message="", restarts=0, started=None):
    if state == "running":
        st = {"running": {"startedAt": iso(started)}}
    elif state == "completed":
        st = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": iso(started), "finishedAt": iso(started)}}
    else:
        w = {"reason": reason}
        if message:
            w["message"] = message
        st = {"waiting": w}
    return {"name": name, "ready": state == "running", "restartCount": restarts, "state": st,
            "image": "", "imageID": ""}


def pod(ns, name, containers, phase="Running", state="running", reason="", message="", labels=None,
        limits=None, init=None, node_selector=None, scheduled=True, restarts=0, owner=None):
    s = server() or {"started": time.time()}
    spec = {"containers": [{"name": c, "image": img, "resources": {"limits": dict(limits or {})} if limits else {}}
                           for c, img in containers]}
    if scheduled:
        spec["nodeName"] = node_name()
    if node_selector:
        spec["nodeSelector"] = node_selector
    conds = [{"type": "PodScheduled", "status": "True" if scheduled else "False"}]
    if not scheduled:
        conds[0].update({"reason": "Unschedulable", "message": message})
    else:
        conds.append({"type": "Ready", "status": "True" if state == "running" else "False"})
    status = {"phase": phase, "conditions": conds}
    if scheduled:
        status["containerStatuses"] = [container_status(c, state, reason, message, restarts, s["started"])
                                       for c, _ in containers]
        status["startTime"] = iso(s["started"])
        if init:
            status["initContainerStatuses"] = init
    meta = {"name": name, "namespace": ns, "labels": labels or {}, "creationTimestamp": iso(s["started"])}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def system_pods():
    n = node_name()
    clash = dns_clash()
    ready = node_ready()
    pods = [
        pod("kube-system", "etcd-" + n, [("etcd", "index.docker.io/rancher/hardened-etcd")], labels={"component": "etcd", "tier": "control-plane"}),
        pod("kube-system", "kube-apiserver-" + n, [("kube-apiserver", "index.docker.io/rancher/hardened-kubernetes")], labels={"component": "kube-apiserver", "tier": "control-plane"}),
        pod("kube-system", "kube-proxy-" + n, [("kube-proxy", "index.docker.io/rancher/hardened-kubernetes")], labels={"component": "kube-proxy", "tier": "control-plane"}),
    ]
    if clash:
        msg = ('Back-off pulling image "docker.io/rancher/hardened-calico": failed to resolve reference: '
               'dial tcp: lookup registry-1.docker.io on %s:53: read udp 10.0.2.2:41234->%s:53: read: '
               'connection refused' % (clash, clash))
        pods.append(pod("kube-system", "rke2-canal-7xk2q", [("calico-node", "docker.io/rancher/hardened-calico"),
                                                            ("kube-flannel", "docker.io/rancher/hardened-flannel")],
                        phase="Pending", state="waiting", reason="ImagePullBackOff", message=msg,
                        labels={"k8s-app": "canal"}, owner=("DaemonSet", "rke2-canal")))
        pods.append(pod("kube-system", "rke2-coredns-rke2-coredns-5c7b8c6f9d-4hx2m", [("coredns", "rancher/hardened-coredns")],
                        phase="Pending", state="waiting", scheduled=False,
                        message="0/1 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }.",
                        labels={"k8s-app": "kube-dns"}, owner=("ReplicaSet", "rke2-coredns-rke2-coredns-5c7b8c6f9d")))
    elif ready:
        pods.append(pod("kube-system", "rke2-canal-7xk2q", [("calico-node", "docker.io/rancher/hardened-calico"),
                                                            ("kube-flannel", "docker.io/rancher/hardened-flannel")],
                        labels={"k8s-app": "canal"}, owner=("DaemonSet", "rke2-canal")))
        pods.append(pod("kube-system", "rke2-coredns-rke2-coredns-5c7b8c6f9d-4hx2m", [("coredns", "rancher/hardened-coredns")],
                        labels={"k8s-app": "kube-dns"}, owner=("ReplicaSet", "rke2-coredns-rke2-coredns-5c7b8c6f9d")))
    else:
        pods.append(pod("kube-system", "rke2-canal-7xk2q", [("calico-node", "docker.io/rancher/hardened-calico"),
                                                            ("kube-flannel", "docker.io/rancher/hardened-flannel")],
                        phase="Pending", state="waiting", reason="PodInitializing", labels={"k8s-app": "canal"},
                        owner=("DaemonSet", "rke2-canal")))
    return pods


# The runbook's `kubectl -n gpu-operator get pods`, by name.
OPERATOR_PODS = [
    ("gpu-feature-discovery-zxjzv", "gpu-feature-discovery", "running"),
    ("gpu-operator-6d8769c57c-grnsv", "gpu-operator", "running"),
    ("gpu-operator-node-feature-discovery-gc-847bb8f7b6-n8rgg", "gc", "running"),
    ("gpu-operator-node-feature-discovery-master-d98f944cd-xcz7x", "master", "running"),
    ("gpu-operator-node-feature-discovery-worker-qwbc9", "worker", "running"),
    ("nvidia-container-toolkit-daemonset-b75h9", "nvidia-container-toolkit-ctr", "running"),
    ("nvidia-cuda-validator-cj7kp", "nvidia-cuda-validator", "completed"),
    ("nvidia-dcgm-exporter-mjdjf", "nvidia-dcgm-exporter", "running"),
    ("nvidia-driver-daemonset-5wlbr", "nvidia-driver-ctr", "running"),
    ("nvidia-operator-validator-v5s2v", "nvidia-operator-validator", "running"),
]


def operator_pods(rel):
    ns = rel["namespace"]
    pods = []
    for name, ctr, state in OPERATOR_PODS:
        pods.append(pod(ns, name, [(ctr, "nvcr.io/nvidia/" + ctr)], phase="Succeeded" if state == "completed" else "Running",
                        state=state, labels={"app": name.rsplit("-", 1)[0]}))
    if get_in(rel["values"], ["devicePlugin", "enabled"], True) is not False:
        pods.append(pod(ns, "nvidia-device-plugin-daemonset-8q2lw", [("nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin")],
                        labels={"app": "nvidia-device-plugin-daemonset"}, owner=("DaemonSet", "nvidia-device-plugin-daemonset")))
    return pods


def hami_pods(rel):
    ns = rel["namespace"]
    pods = [pod(ns, "hami-scheduler-6f7d9c8b5d-m2xkq", [("kube-scheduler", "registry.k8s.io/kube-scheduler"),
                                                        ("vgpu-scheduler-extender", "projecthami/hami")],
                labels={"app.kubernetes.io/component": "hami-scheduler", "app.kubernetes.io/instance": rel["name"],
                        "app.kubernetes.io/name": "hami"}, owner=("ReplicaSet", "hami-scheduler-6f7d9c8b5d"))]
    st = hami_plugin_state()
    labels = {"app.kubernetes.io/component": "hami-device-plugin", "app.kubernetes.io/instance": rel["name"],
              "app.kubernetes.io/name": "hami"}
    selector = get_in(rel["values"], ["devicePlugin", "nvidiaNodeSelector"], {"gpu": "on"})
    containers = [("device-plugin", "projecthami/hami"), ("vgpu-monitor", "projecthami/hami")]
    owner = ("DaemonSet", "hami-device-plugin")
    name = "hami-device-plugin-9vd4t"
    if st == "running":
        pods.append(pod(ns, name, containers, labels=labels, node_selector=selector, owner=owner))
    elif st == "init":
        init = [container_status("toolkit-validation", "waiting", "PodInitializing")]
        init[0]["state"] = {"running": {"startedAt": iso()}}
        init[0]["ready"] = False
        pods.append(pod(ns, name, containers, phase="Pending", state="waiting", reason="PodInitializing",
                        labels=labels, node_selector=selector, init=init, owner=owner))
    elif st == "crash":
        why = ("nvml init failed: ERROR_LIBRARY_NOT_FOUND" if not module_loaded()
               else "back-off 5m0s restarting failed container=device-plugin")
        pods.append(pod(ns, name, containers, phase="Running", state="waiting", reason="CrashLoopBackOff",
                        message=why, labels=labels, node_selector=selector, restarts=7, owner=owner))
    return pods


def workload_pods():
    applied = load(p(K8S, "pods.json"), [])
    g, _ = gpu_allocatable()
    free = g or 0
    result = []
    for m in applied:
        meta = m.get("metadata", {})
        ns = meta.get("namespace", "default")
        containers = m.get("spec", {}).get("containers", [])
        want = 0
        limits = {}
        for c in containers:
            lim = get_in(c, ["resources", "limits"], {}) or {}
            limits.update({k: str(v) for k, v in lim.items()})
            want += int(lim.get("nvidia.com/gpu", 0))
        names = [(c.get("name", "main"), c.get("image", "")) for c in containers]
        if want and want > free:
            msg = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
                   "available: 1 No preemption victims found for incoming pod.")
            pd = pod(ns, meta["name"], names, phase="Pending", state="waiting", scheduled=False, message=msg,
                     labels=meta.get("labels"), limits=limits)
        else:
            free -= want
            pd = pod(ns, meta["name"], names, labels=meta.get("labels"), limits=limits)
        # the pod's own resources, as applied
        pd["spec"]["containers"] = [{"name": c.get("name", "main"), "image": c.get("image", ""),
                                     "resources": c.get("resources", {})} for c in containers]
        result.append(pd)
    return result


def all_pods():
    pods = system_pods()
    for r in releases():
        if r["status"] == "uninstalled":
            continue
        if r["chart"] == "gpu-operator":
            pods += operator_pods(r)
        elif r["chart"] == "hami":
            pods += hami_pods(r)
    pods += workload_pods()
    # The API lists objects in key order: namespace, then name.
    return sorted(pods, key=lambda x: (x["metadata"]["namespace"], x["metadata"]["name"]))


def namespaces():
    ns = ["default", "kube-node-lease", "kube-public", "kube-system"]
    for n in load(p(K8S, "namespaces.json"), []):
        if n not in ns:
            ns.append(n)
    return ns


# --------------------------------------------------------------------------- GPU Operator effects

def operator_effects():
    """What the GPU Operator's DaemonSets leave on the guest: the driver
    container's module and nvidia-smi, the toolkit's ready file."""
    if not deployed_chart("gpu-operator") or not node_ready():
        return
    fns = gpu_functions()
    if not fns:
        return
    version = profile("DRIVER_VERSION") or "580.126.20"
    # The chart's driver.version picks the driver container's image. Only
    # the profile's driver has captures here: another version loads nothing
    # (its nvidia-smi could only be made up).
    wanted = get_in(deployed_chart("gpu-operator")["values"], ["driver", "version"], None)
    if wanted is not None and str(wanted) != version:
        return
    if not module_loaded():
        os.makedirs(rootp("/sys/module/nvidia"), exist_ok=True)
        write_text(rootp("/sys/module/nvidia/version"), version + "\n")
        os.makedirs(rootp("/sys/bus/pci/drivers/nvidia"), exist_ok=True)
        with open(rootp("/proc/modules"), "a") as f:
            f.write("nvidia 14376960 0 - Live 0x0000000000000000 (POE)\n")
        for a in fns:
            link = rootp("/sys/bus/pci/devices/%s/driver" % a)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink("../../../bus/pci/drivers/nvidia", link)
    smi = rootp("/run/nvidia/driver/usr/bin/nvidia-smi")
    if not os.path.lexists(smi):
        os.makedirs(os.path.dirname(smi), exist_ok=True)
        os.symlink(p(HOME, "opt", "nvidia-smi"), smi)
    write_text(rootp("/run/nvidia/validations/toolkit-ready"), "")
    save(p(K8S, "runtimeclasses.json"), {"nvidia": {"handler": "nvidia", "created": time.time()}})


# --------------------------------------------------------------------------- server / uninstall

def server_start():
    """systemctl start rke2-server: the first start fixes the cluster's ranges."""
    c = cluster()
    if c is None:
        conf = read_rke2_config()
        src = "/etc/rancher/rke2/config.yaml" if conf else "defaults (no /etc/rancher/rke2/config.yaml)"
        if knob("rke2_dns_clash") is not None:
            conf = {}
            src = "defaults: the server came up before /etc/rancher/rke2/config.yaml (knob rke2_dns_clash)"
        ranges = {k: str(conf.get(k, DEFAULT_RANGES[k])) for k in DEFAULT_RANGES}
        version = ""
        try:
            with open(p(K8S, "rke2-version")) as f:
                version = f.read().strip()
        except OSError:
            pass
        c = dict(ranges, created=time.time(), ranges_from=src, version=version)
        save(p(K8S, "cluster.json"), c)
    save(p(K8S, "server.json"), {"started": time.time()})
    # What the real server writes at start: the admin kubeconfig, its kubectl,
    # and the static pod manifests (their args carry the cluster's ranges).
    write_text(rootp("/" + KUBECONFIG),
               "# GUEST SIMULATOR: stands in for the admin kubeconfig RKE2 writes; the credentials are placeholders\n"
               "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: R1VFU1RTSU0=\n"
               "    server: https://%s\n  name: default\ncontexts:\n- context:\n    cluster: default\n    user: default\n"
               "  name: default\ncurrent-context: default\npreferences: {}\nusers:\n- name: default\n  user:\n"
               "    client-certificate-data: R1VFU1RTSU0=\n    client-key-data: R1VFU1RTSU0=\n" % API, 0o600)
    kubectl = rootp("/var/lib/rancher/rke2/bin/kubectl")
    write_text(kubectl,
               "#!/bin/sh\n# GUEST SIMULATOR: RKE2's kubectl (the stand-in tests/guestsim/opt/kubectl)\n"
               "FACTORY_GUESTSIM_ROOT='%s' exec '%s' \"$@\"\n" % (ROOT, p(HOME, "opt", "kubectl")), 0o755)
    manifests = rootp("/var/lib/rancher/rke2/agent/pod-manifests")
    write_text(p(manifests, "kube-apiserver.yaml"),
               "# GUEST SIMULATOR: the static pod RKE2 writes, trimmed to the arguments that carry the ranges\n"
               "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\n  namespace: kube-system\nspec:\n"
               "  containers:\n  - name: kube-apiserver\n    command:\n    - kube-apiserver\n    args:\n"
               "    - --secure-port=6443\n    - --service-cluster-ip-range=%s\n" % c["service-cidr"], 0o600)
    write_text(p(manifests, "kube-proxy.yaml"),
               "# GUEST SIMULATOR: the static pod RKE2 writes, trimmed to the arguments that carry the ranges\n"
               "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-proxy\n  namespace: kube-system\nspec:\n"
               "  containers:\n  - name: kube-proxy\n    command:\n    - kube-proxy\n    args:\n"
               "    - --cluster-cidr=%s\n" % c["cluster-cidr"], 0o600)
    # After a reboot the operator's driver container loads the module again.
    operator_effects()


def uninstall():
    """rke2-uninstall.sh: the cluster, its data and /etc/rancher/rke2 are gone."""
    import shutil
    for d in (K8S, HELM):
        shutil.rmtree(d, ignore_errors=True)
    for d in ("/etc/rancher/rke2", "/var/lib/rancher/rke2", "/run/nvidia/validations"):
        shutil.rmtree(rootp(d), ignore_errors=True)
    for f in ("rke2", "rke2-killall.sh", "rke2-uninstall.sh"):
        try:
            os.remove(p(G, "installed-bin", f))
        except OSError:
            pass
    for f in ("rke2-server.service", "rke2-agent.service"):
        try:
            os.remove(rootp("/usr/local/lib/systemd/system/" + f))
        except OSError:
            pass
    for f in ("rke2-server.enabled", "rke2-server.result"):
        try:
            os.remove(p(STATE, "services", f))
        except OSError:
            pass


# --------------------------------------------------------------------------- kubectl

REFUSED = "The connection to the server %s was refused - did you specify the right host or port?" % API


def kube_preamble(kubeconfig):
    path = kubeconfig or os.environ.get("KUBECONFIG", "")
    if not path:
        # kubectl without a kubeconfig tries localhost:8080
        die("E0101 00:00:00.000000 memcache.go:265] couldn't get current server API group list: Get "
            "\"http://localhost:8080/api?timeout=32s\": dial tcp 127.0.0.1:8080: connect: connection refused\n"
            "The connection to the server localhost:8080 was refused - did you specify the right host or port?")
    if not os.path.exists(path):
        die("error: stat %s: no such file or directory" % path)
    if not api_up():
        die(REFUSED)


def parse_kubectl(args):
    opts = {"kubeconfig": None, "namespace": None, "all_ns": False, "output": "", "files": [], "all": False,
            "overwrite": False, "show_labels": False}
    pos = []
    rest = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest = args[i + 1:]
            break
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            args = args[:i] + [k, v] + args[i + 1:]
            a = k
        if a == "--kubeconfig":
            opts["kubeconfig"] = args[i + 1]; i += 2; continue
        if a in ("-n", "--namespace"):
            opts["namespace"] = args[i + 1]; i += 2; continue
        if a in ("-A", "--all-namespaces"):
            opts["all_ns"] = True; i += 1; continue
        if a in ("-o", "--output"):
            opts["output"] = args[i + 1]; i += 2; continue
        if a in ("-f", "--filename"):
            opts["files"].append(args[i + 1]); i += 2; continue
        if a == "--all":
            opts["all"] = True; i += 1; continue
        if a == "--overwrite":
            opts["overwrite"] = True; i += 1; continue
        if a == "--show-labels":
            opts["show_labels"] = True; i += 1; continue
        if a in ("--request-timeout", "--timeout"):
            i += 2; continue
        if a.startswith("-") and a != "-":
            die("error: unknown flag: %s\nSee 'kubectl --help' for usage." % a)
        pos.append(a)
        i += 1
    return opts, pos, rest


def kind_of(word):
    w = word.lower()
    if w in ("node", "nodes", "no"):
        return "node"
    if w in ("pod", "pods", "po"):
        return "pod"
    if w in ("namespace", "namespaces", "ns"):
        return "namespace"
    if w in ("runtimeclass", "runtimeclasses"):
        return "runtimeclass"
    return None


def print_table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [str(c).ljust(widths[i]) if i < len(r) - 1 else str(c) for i, c in enumerate(r)]
        out("   ".join(cells).rstrip() + "\n")


def pod_status_word(pd):
    st = pd["status"]
    for cs in st.get("initContainerStatuses", []):
        if "running" in cs["state"] or "waiting" in cs["state"]:
            return "Init:0/%d" % len(st["initContainerStatuses"])
    for cs in st.get("containerStatuses", []):
        w = cs["state"].get("waiting")
        if w:
            return w.get("reason", "Waiting")
    if st["phase"] == "Succeeded":
        return "Completed"
    return st["phase"]


def kubectl_get(opts, pos):
    if not pos:
        die("You must specify the type of resource to get.")
    kind = kind_of(pos[0])
    names = pos[1:]
    if kind == "node":
        items = [node_object()]
        if names:
            items = [n for n in items if n["metadata"]["name"] in names]
            missing = [x for x in names if x not in [n["metadata"]["name"] for n in items]]
            if missing:
                die('Error from server (NotFound): nodes "%s" not found' % missing[0])
        if opts["output"] == "json":
            if len(names) == 1:
                out(json.dumps(items[0], indent=4) + "\n")
            else:
                out(json.dumps({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}, indent=4) + "\n")
            return
        rows = [["NAME", "STATUS", "ROLES", "AGE", "VERSION"] + (["LABELS"] if opts["show_labels"] else [])]
        c = cluster()
        for n in items:
            ready = [x for x in n["status"]["conditions"] if x["type"] == "Ready"][0]["status"] == "True"
            labels = n["metadata"]["labels"]
            roles = ",".join(sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")))
            row = [n["metadata"]["name"], "Ready" if ready else "NotReady", roles or "<none>", age(c["created"]),
                   n["status"]["nodeInfo"]["kubeletVersion"]]
            if opts["show_labels"]:
                row.append(",".join("%s=%s" % (k, v) for k, v in sorted(labels.items())))
            rows.append(row)
        print_table(rows)
        return
    if kind == "pod":
        pods = all_pods()
        if not opts["all_ns"]:
            ns = opts["namespace"] or "default"
            pods = [x for x in pods if x["metadata"]["namespace"] == ns]
        if names:
            pods = [x for x in pods if x["metadata"]["name"] in names]
            if not pods:
                die('Error from server (NotFound): pods "%s" not found' % names[0])
        if opts["output"] == "json":
            if len(names) == 1:
                out(json.dumps(pods[0], indent=4) + "\n")
            else:
                out(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods, "metadata": {"resourceVersion": ""}}, indent=4) + "\n")
            return
        if not pods:
            sys.stderr.write("No resources found in %s namespace.\n" % (opts["namespace"] or "default")
                             if not opts["all_ns"] else "No resources found\n")
            return
        s = server()
        head = (["NAMESPACE"] if opts["all_ns"] else []) + ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
        rows = [head]
        for x in pods:
            css = x["status"].get("containerStatuses", [])
            ready = sum(1 for cs in css if cs["ready"])
            restarts = sum(cs["restartCount"] for cs in css)
            row = ([x["metadata"]["namespace"]] if opts["all_ns"] else []) + [
                x["metadata"]["name"], "%d/%d" % (ready, len(x["spec"]["containers"])), pod_status_word(x),
                str(restarts), age(s["started"])]
            rows.append(row)
        print_table(rows)
        return
    if kind == "runtimeclass":
        rcs = load(p(K8S, "runtimeclasses.json"), {})
        if names and names[0] not in rcs:
            die('Error from server (NotFound): runtimeclasses.node.k8s.io "%s" not found' % names[0])
        shown = names or sorted(rcs)
        if not shown:
            sys.stderr.write("No resources found\n")
            return
        rows = [["NAME", "HANDLER", "AGE"]] + [[n, rcs[n]["handler"], age(rcs[n]["created"])] for n in shown]
        print_table(rows)
        return
    if kind == "namespace":
        if opts["output"] == "json":
            out(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}, "status": {"phase": "Active"}}
                for n in namespaces()], "metadata": {"resourceVersion": ""}}, indent=4) + "\n")
            return
        print_table([["NAME", "STATUS", "AGE"]] + [[n, "Active", age(cluster()["created"])] for n in namespaces()])
        return
    die('error: the server doesn\'t have a resource type "%s"' % pos[0])


def kubectl_describe(opts, pos):
    if not pos or kind_of(pos[0]) != "node":
        die("guestsim kubectl: only `describe node` is simulated")
    n = node_object()
    labels = n["metadata"]["labels"]
    lab = sorted("%s=%s" % kv for kv in labels.items())
    roles = ",".join(sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")))
    lines = ["Name:               %s" % n["metadata"]["name"],
             "Roles:              %s" % roles,
             "Labels:             %s" % lab[0]]
    lines += ["                    %s" % x for x in lab[1:]]
    lines.append("CreationTimestamp:  %s" % n["metadata"]["creationTimestamp"])
    lines.append("Conditions:")
    lines.append("  Type             Status  Reason                       Message")
    lines.append("  ----             ------  ------                       -------")
    for cnd in n["status"]["conditions"]:
        lines.append("  %-16s %-7s %-28s %s" % (cnd["type"], cnd["status"], cnd["reason"], cnd["message"]))
    lines.append("Addresses:")
    for a in n["status"]["addresses"]:
        lines.append("  %s:  %s" % (a["type"], a["address"]))

    def block(title, res):
        # kubectl lists the resources sorted by name
        order = sorted(res)
        lines.append(title + ":")
        for k in order:
            lines.append("  %-20s%s" % (k + ":", res[k]))

    block("Capacity", n["status"]["capacity"])
    block("Allocatable", n["status"]["allocatable"])
    lines.append("System Info:")
    info = n["status"]["nodeInfo"]
    lines.append("  Kernel Version:             %s" % info["kernelVersion"])
    lines.append("  OS Image:                   %s" % info["osImage"])
    lines.append("  Container Runtime Version:  %s" % info["containerRuntimeVersion"])
    lines.append("  Kubelet Version:            %s" % info["kubeletVersion"])
    out("\n".join(lines) + "\n")


def kubectl_label(opts, pos):
    if not pos or kind_of(pos[0]) != "node":
        die("guestsim kubectl: only `label node` is simulated")
    names = []
    pairs = {}
    for a in pos[1:]:
        if "=" in a:
            k, v = a.split("=", 1)
            pairs[k] = v
        elif a.endswith("-"):
            pairs[a[:-1]] = None
        else:
            names.append(a)
    if not pairs:
        die("error: at least one label update is required")
    if not names and not opts["all"]:
        die("error: resource(s) were provided, but no name was specified")
    count("kubectl.label")
    node = node_name()
    for nm in names:
        if nm != node:
            die('Error from server (NotFound): nodes "%s" not found' % nm)
    all_labels = load(p(K8S, "labels.json"), {})
    mine = all_labels.get(node, {})
    current = node_labels()
    changed = False
    for k, v in pairs.items():
        if v is None:
            if k in mine:
                del mine[k]
                changed = True
            continue
        if k in current and current[k] != v and not opts["overwrite"]:
            die("error: '%s' already has a value (%s), and --overwrite is false" % (k, current[k]))
        if current.get(k) != v:
            mine[k] = v
            changed = True
    all_labels[node] = mine
    save(p(K8S, "labels.json"), all_labels)
    if "nvidia.com/mig.config" in pairs:
        mig_manager_apply()
    out("node/%s %s\n" % (node, "labeled" if changed else "not labeled"))


def kubectl_apply(opts, pos):
    if not opts["files"]:
        die("error: must specify one of -f and -k")
    applied = load(p(K8S, "pods.json"), [])
    for f in opts["files"]:
        try:
            with open(f) as fh:
                docs = [d for d in yaml.safe_load_all(fh) if d]
        except OSError as e:
            die("error: the path \"%s\" does not exist" % f if not os.path.exists(f) else str(e))
        for d in docs:
            if d.get("kind") != "Pod":
                die("guestsim kubectl: only Pods can be applied here (got %s)" % d.get("kind"))
            meta = d.setdefault("metadata", {})
            meta.setdefault("namespace", opts["namespace"] or "default")
            same = [i for i, x in enumerate(applied)
                    if x["metadata"]["name"] == meta["name"] and x["metadata"].get("namespace") == meta["namespace"]]
            if same:
                word = "unchanged" if applied[same[0]] == d else "configured"
                applied[same[0]] = d
            else:
                word = "created"
                applied.append(d)
            out("pod/%s %s\n" % (meta["name"], word))
    save(p(K8S, "pods.json"), applied)


def kubectl_exec(opts, pos, rest):
    if not pos or not rest:
        die("error: you must specify at least one command for the container")
    name = pos[0]
    ns = opts["namespace"] or "default"
    pods = [x for x in all_pods() if x["metadata"]["name"] == name and x["metadata"]["namespace"] == ns]
    if not pods:
        die('Error from server (NotFound): pods "%s" not found' % name)
    pd = pods[0]
    if pd["status"]["phase"] != "Running":
        die("error: unable to upgrade connection: container not found (\"%s\")" % pd["spec"]["containers"][0]["name"])
    if rest[0] != "nvidia-smi" or len(rest) > 1:
        die("guestsim kubectl: exec runs only `nvidia-smi` in a pod")
    limits = {}
    for c in pd["spec"]["containers"]:
        limits.update(get_in(c, ["resources", "limits"], {}) or {})
    if "nvidia.com/gpu" not in limits:
        die('OCI runtime exec failed: exec failed: unable to start container process: exec: "nvidia-smi": '
            'executable file not found in $PATH: unknown', 126)
    with open(p(G, "data", "tenant2-pod-nvidia-smi-hami-1024MiB.txt")) as f:
        text = f.read()
    mem = limits.get("nvidia.com/gpumem")
    if mem is not None and str(mem) != "1024":
        text = text.replace("   1024MiB", ("%sMiB" % mem).rjust(len("   1024MiB")))
    elif mem is None:
        text = text.replace("   1024MiB", ("%sMiB" % profile("MEMORY_TOTAL")).rjust(len("   1024MiB")))
    out(text)


def kubectl(args):
    opts, pos, rest = parse_kubectl(args)
    if not pos:
        die("kubectl controls the Kubernetes cluster manager.\n(guestsim stand-in: see tests/guestsim/README.md)")
    verb = pos[0]
    if verb == "version":
        out("Client Version: %s\nKustomize Version: v5.7.1\n" % (load(p(K8S, "cluster.json"), {}) or {}).get("version", "v1.36.4+rke2r1"))
        return
    kube_preamble(opts["kubeconfig"])
    if verb == "get":
        kubectl_get(opts, pos[1:])
    elif verb == "describe":
        kubectl_describe(opts, pos[1:])
    elif verb == "label":
        kubectl_label(opts, pos[1:])
    elif verb == "apply":
        kubectl_apply(opts, pos[1:])
    elif verb == "exec":
        kubectl_exec(opts, pos[1:], rest)
    else:
        die("guestsim kubectl: '%s' is not simulated" % verb)


# --------------------------------------------------------------------------- helm

# The version of the release tarball the helm stand-in came from (bin/curl
# writes it into the tarball's helm script).
HELM_VERSION = os.environ.get("GUESTSIM_HELM_VERSION", "v0.0.0-guestsim")


def helm_kube(opts):
    path = opts.get("kubeconfig") or os.environ.get("KUBECONFIG", "")
    if not path:
        die("Error: Kubernetes cluster unreachable: Get \"http://localhost:8080/version\": dial tcp "
            "127.0.0.1:8080: connect: connection refused")
    if not os.path.exists(path):
        die("Error: Kubernetes cluster unreachable: stat %s: no such file or directory" % path)
    if not api_up():
        die("Error: Kubernetes cluster unreachable: Get \"https://%s/version\": dial tcp %s: connect: "
            "connection refused" % (API, API))


HELM_FLAGS_WITH_VALUE = {"--version", "--namespace", "-n", "-f", "--values", "--timeout", "--kubeconfig", "-o",
                         "--output", "--filter", "--kube-context"}
HELM_BOOL_FLAGS = {"--install", "-i", "--create-namespace", "--wait", "--atomic", "--force-update", "--short",
                   "-A", "--all-namespaces", "--debug", "--all", "-a"}


def parse_helm(args):
    opts = {"values": []}
    pos = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            args = args[:i] + [k, v] + args[i + 1:]
            a = k
        if a in HELM_FLAGS_WITH_VALUE:
            if i + 1 >= len(args):
                die("Error: flag needs an argument: %s" % a)
            v = args[i + 1]
            key = {"-n": "namespace", "--namespace": "namespace", "-f": "values", "--values": "values",
                   "-o": "output", "--output": "output"}.get(a, a.lstrip("-"))
            if key == "values":
                opts["values"].append(v)
            else:
                opts[key] = v
            i += 2
            continue
        if a in HELM_BOOL_FLAGS:
            opts[{"-i": "install", "-A": "all-namespaces", "-a": "all"}.get(a, a.lstrip("-"))] = True
            i += 1
            continue
        if a.startswith("-"):
            die("Error: unknown flag: %s" % a)
        pos.append(a)
        i += 1
    return opts, pos


def repos():
    return load(p(HELM, "repositories.json"), {})


def helm_repo(opts, pos):
    if not pos:
        die("Error: requires a subcommand (add, update, list)")
    sub = pos[0]
    if sub == "add":
        if len(pos) != 3:
            die("Error: \"helm repo add\" requires 2 arguments")
        name, url = pos[1], pos[2]
        rs = repos()
        if name in rs and rs[name]["url"] == url and not opts.get("force-update"):
            out("\"%s\" already exists with the same configuration, skipping\n" % name)
            return
        if name in rs and rs[name]["url"] != url and not opts.get("force-update"):
            die("Error: repository name (%s) already exists, please specify a different name" % name)
        if url.rstrip("/") not in [u.rstrip("/") for u in CHART_INDEX]:
            host = url.split("://", 1)[-1].split("/", 1)[0]
            die("Error: looks like \"%s\" is not a valid chart repository or cannot be reached: Get \"%s/index.yaml\": "
                "dial tcp: lookup %s: no such host" % (url, url.rstrip("/"), host))
        rs[name] = {"url": url, "updated": time.time()}
        save(p(HELM, "repositories.json"), rs)
        out("\"%s\" has been added to your repositories\n" % name)
        return
    if sub == "update":
        rs = repos()
        names = pos[1:] or sorted(rs)
        if not rs:
            die("Error: no repositories found. You must add one before updating")
        out("Hang tight while we grab the latest from your chart repositories...\n")
        for n in names:
            if n not in rs:
                die("Error: no repositories found matching '%s'.  Nothing will be updated" % n)
            rs[n]["updated"] = time.time()
            out("...Successfully got an update from the \"%s\" chart repository\n" % n)
        save(p(HELM, "repositories.json"), rs)
        out("Update Complete. \u2388Happy Helming!\u2388\n")
        return
    if sub == "list":
        rs = repos()
        if not rs:
            die("Error: no repositories to show")
        print_table([["NAME", "URL"]] + [[n, rs[n]["url"]] for n in sorted(rs)])
        return
    die("Error: unknown command \"%s\" for \"helm repo\"" % sub)


def load_values(files):
    merged = {}

    def merge(a, b):
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict):
                merge(a[k], v)
            else:
                a[k] = v
    for f in files:
        try:
            with open(f) as fh:
                v = yaml.safe_load(fh) or {}
        except OSError:
            die("Error: open %s: no such file or directory" % f)
        except yaml.YAMLError as e:
            die("Error: failed to parse %s: error converting YAML to JSON: %s" % (f, str(e).splitlines()[0]))
        if not isinstance(v, dict):
            die("Error: failed to parse %s: error unmarshaling JSON: json: cannot unmarshal into Go value of type map[string]interface {}" % f)
        merge(merged, v)
    return merged


def chart_lookup(chart_ref, version):
    if "/" not in chart_ref:
        die("Error: non-absolute URLs should be in form of repo_name/path_to_chart, got: %s" % chart_ref)
    repo, chart = chart_ref.split("/", 1)
    rs = repos()
    if repo not in rs:
        die("Error: repo %s not found" % repo)
    index = CHART_INDEX.get(rs[repo]["url"]) or CHART_INDEX.get(rs[repo]["url"].rstrip("/")) or {}
    versions = index.get(chart)
    if versions is None:
        die("Error: chart \"%s\" not found in %s index. (try 'helm repo update'): no chart name found" % (chart, repo))
    if version and version not in versions:
        die("Error: chart \"%s\" matching %s not found in %s index. (try 'helm repo update'): no chart version "
            "found for %s-%s" % (chart, version, repo, chart, version))
    v = version or sorted(versions)[-1]
    return chart, v, versions[v]


def why_not_ready(chart, values):
    """Why `--wait` would time out for this chart now, or None."""
    if not node_ready():
        return "Deployment is not ready: no node is Ready"
    if chart == "hami":
        st = hami_plugin_state(values=values)
        if st in ("init", "crash"):
            return "DaemonSet is not ready: hami-device-plugin. 0 out of 1 expected pods are ready"
    return None


def helm_upgrade(opts, pos):
    if len(pos) != 2:
        die("Error: \"helm upgrade\" requires 2 arguments")
    name, chart_ref = pos
    ns = opts.get("namespace", "default")
    helm_kube(opts)
    chart, version, app_version = chart_lookup(chart_ref, opts.get("version"))
    values = load_values(opts["values"])
    path = release_path(ns, name)
    existing = load(path, None)
    if existing is None and not opts.get("install"):
        die("Error: UPGRADE FAILED: \"%s\" has no deployed releases" % name)
    if existing and existing["status"].startswith("pending-"):
        die("Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress")
    if ns not in namespaces():
        if not opts.get("create-namespace"):
            die("Error: INSTALLATION FAILED: create: failed to create: namespaces \"%s\" not found" % ns)
        save(p(K8S, "namespaces.json"), [n for n in namespaces() if n not in
                                          ("default", "kube-node-lease", "kube-public", "kube-system")] + [ns])
    fresh = existing is None or existing["status"] == "uninstalled"
    if fresh:
        out("Release \"%s\" does not exist. Installing it now.\n" % name)
    now = time.time()
    rel = {
        "name": name, "namespace": ns, "chart": chart, "chart_version": version, "app_version": app_version,
        "revision": 1 if fresh else existing["revision"] + 1, "values": values,
        "first_deployed": now if fresh else existing["first_deployed"], "last_deployed": now,
        "status": "pending-install" if fresh else "pending-upgrade",
        "description": "Initial install underway" if fresh else "Preparing upgrade",
        "previous": None if fresh else {k: existing[k] for k in ("chart_version", "app_version", "values", "revision")},
    }
    save(path, rel)
    count("helm.install." + name)
    delay = knob("helm_install_delay")
    if delay:
        time.sleep(float(delay))
    fail = knob("helm_install_fail")
    reason = None
    if fail is not None and fail in ("", name):
        reason = "context deadline exceeded"
    elif opts.get("wait"):
        why = why_not_ready(chart, values)
        if why:
            sys.stderr.write("ready.go:303: [debug] %s\n" % why)
            reason = "context deadline exceeded"
    if reason:
        rel["status"] = "failed"
        rel["description"] = ("Release \"%s\" failed: %s" % (name, reason)) if fresh else ("Upgrade \"%s\" failed: %s" % (name, reason))
        save(path, rel)
        die("Error: %s: %s" % ("INSTALLATION FAILED" if fresh else "UPGRADE FAILED", reason))
    rel["status"] = "deployed"
    rel["description"] = "Install complete" if fresh else "Upgrade complete"
    save(path, rel)
    if chart == "gpu-operator":
        operator_effects()
        mig_manager_apply()
    if not fresh:
        out("Release \"%s\" has been upgraded. Happy Helming!\n" % name)
    out("NAME: %s\nLAST DEPLOYED: %s\nNAMESPACE: %s\nSTATUS: deployed\nREVISION: %d\nTEST SUITE: None\n"
        % (name, time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)), ns, rel["revision"]))


def release_json(rel):
    return {
        "name": rel["name"],
        "info": {
            "first_deployed": iso(rel["first_deployed"]),
            "last_deployed": iso(rel["last_deployed"]),
            "deleted": "",
            "description": rel["description"],
            "status": rel["status"],
        },
        "chart": {"metadata": {"name": rel["chart"], "version": rel["chart_version"], "appVersion": rel["app_version"],
                               "apiVersion": "v2", "description": CHART_DESCRIPTIONS.get(rel["chart"], ""),
                               "type": "application"}},
        "config": rel["values"] or None,
        "version": rel["revision"],
        "namespace": rel["namespace"],
    }


def helm_find(opts, pos, what):
    if len(pos) != 1:
        die("Error: \"helm %s\" requires 1 argument" % what)
    helm_kube(opts)
    rel = load(release_path(opts.get("namespace", "default"), pos[0]), None)
    if not rel or rel["status"] == "uninstalled":
        die("Error: release: not found")
    return rel


def helm_status(opts, pos):
    rel = helm_find(opts, pos, "status")
    if opts.get("output") == "json":
        out(json.dumps(release_json(rel)) + "\n")
        return
    out("NAME: %s\nLAST DEPLOYED: %s\nNAMESPACE: %s\nSTATUS: %s\nREVISION: %d\nTEST SUITE: None\n"
        % (rel["name"], time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(rel["last_deployed"])),
           rel["namespace"], rel["status"], rel["revision"]))


def helm_get(opts, pos):
    if not pos or pos[0] != "values":
        die("guestsim helm: only `get values` is simulated")
    rel = helm_find(opts, pos[1:], "get values")
    if opts.get("output") == "json":
        out(json.dumps(rel["values"] or None) + "\n")
        return
    out("USER-SUPPLIED VALUES:\n" + (yaml.safe_dump(rel["values"], sort_keys=True) if rel["values"] else "null\n"))


def helm_list(opts, pos):
    helm_kube(opts)
    rels = [r for r in releases() if r["status"] != "uninstalled"]
    if not opts.get("all-namespaces"):
        rels = [r for r in rels if r["namespace"] == opts.get("namespace", "default")]
    if opts.get("filter"):
        rels = [r for r in rels if re.search(opts["filter"], r["name"])]
    if opts.get("output") == "json":
        out(json.dumps([{"name": r["name"], "namespace": r["namespace"], "revision": str(r["revision"]),
                         "updated": iso(r["last_deployed"]), "status": r["status"],
                         "chart": "%s-%s" % (r["chart"], r["chart_version"]), "app_version": r["app_version"]}
                        for r in rels]) + "\n")
        return
    rows = [["NAME", "NAMESPACE", "REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION"]]
    for r in rels:
        rows.append([r["name"], r["namespace"], str(r["revision"]), iso(r["last_deployed"]), r["status"],
                     "%s-%s" % (r["chart"], r["chart_version"]), r["app_version"]])
    print_table(rows)


def helm_uninstall(opts, pos):
    rel = helm_find(opts, pos, "uninstall")
    os.remove(release_path(rel["namespace"], rel["name"]))
    count("helm.uninstall." + rel["name"])
    out("release \"%s\" uninstalled\n" % rel["name"])


def helm_rollback(opts, pos):
    rel = helm_find(opts, pos[:1], "rollback")
    prev = rel.get("previous")
    if not prev:
        die("Error: release has no 1 version")
    rel.update({k: prev[k] for k in ("chart_version", "app_version", "values")})
    rel["revision"] += 1
    rel["status"] = "deployed"
    rel["description"] = "Rollback to %d" % prev["revision"]
    rel["last_deployed"] = time.time()
    rel["previous"] = None
    save(release_path(rel["namespace"], rel["name"]), rel)
    count("helm.rollback." + rel["name"])
    out("Rollback was a success! Happy Helming!\n")


def helm(args):
    opts, pos = parse_helm(args)
    if not pos:
        die("The Kubernetes package manager\n(guestsim stand-in: see tests/guestsim/README.md)")
    cmd = pos[0]
    if cmd == "version":
        out(HELM_VERSION + "\n" if opts.get("short") else
            'version.BuildInfo{Version:"%s", GitCommit:"", GitTreeState:"clean", GoVersion:""}\n' % HELM_VERSION)
    elif cmd == "repo":
        helm_repo(opts, pos[1:])
    elif cmd in ("upgrade", "install"):
        if cmd == "install":
            opts["install"] = True
        helm_upgrade(opts, pos[1:])
    elif cmd == "status":
        helm_status(opts, pos[1:])
    elif cmd == "get":
        helm_get(opts, pos[1:])
    elif cmd in ("list", "ls"):
        helm_list(opts, pos[1:])
    elif cmd in ("uninstall", "delete"):
        helm_uninstall(opts, pos[1:])
    elif cmd == "rollback":
        helm_rollback(opts, pos[1:])
    else:
        die("guestsim helm: '%s' is not simulated" % cmd)


def main():
    if not ROOT or not os.path.isfile(p(G, "config")):
        die("guestsim k8s: FACTORY_GUESTSIM_ROOT is not a simulated guest", 127)
    if len(sys.argv) < 2:
        die("usage: k8s_sim.py kubectl|helm|server-start|uninstall ...", 2)
    what, args = sys.argv[1], sys.argv[2:]
    if what == "kubectl":
        kubectl(args)
    elif what == "helm":
        helm(args)
    elif what == "server-start":
        server_start()
    elif what == "uninstall":
        uninstall()
    else:
        die("k8s_sim.py: unknown command %s" % what, 2)


if __name__ == "__main__":
    main()
