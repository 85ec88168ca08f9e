"""The NVIDIA GPU Operator's side of the fake Kubernetes API server.

STANDS IN FOR: the GPU Operator (v26.x, github.com/NVIDIA/gpu-operator) on the
host cluster, as far as `factory host bind --via gpu-operator` and
`factory kubevirt allowlist` observe it, on the one Node the fake serves:

- its ClusterPolicy (nvidia.com/v1, cluster-scoped, named "cluster-policy"
  as the Helm chart names it), checked against the real CRD's schema
  (k8s_schema.py); `--gpu-operator sandbox` installs it with
  spec.sandboxWorkloads.enabled: true, `--gpu-operator container` with the
  chart's default (false);
- the node labelling of controllers/state_manager.go: nvidia.com/gpu.present
  on a node with NVIDIA GPUs; when sandboxWorkloads is enabled, the node's
  nvidia.com/gpu.workload.config label picks the operand set (container,
  vm-passthrough, vm-vgpu; a missing or unknown value means the default,
  container); without sandboxWorkloads the label is ignored and the node stays
  on containers. The operand labels (nvidia.com/gpu.deploy.*) are set and
  swept as getEffectiveStateLabels / removeGPUStateLabels do;
- the operand pods of a vm-passthrough node, in namespace gpu-operator, each
  with the init containers and container names of its DaemonSet
  (assets/state-*/0500_daemonset.yaml):
  nvidia-vfio-manager-* (init k8s-driver-manager `uninstall_driver`, then
  `vfio-manage bind --all`), nvidia-sandbox-validator-* (init
  cc-manager-validation, vfio-pci-validation, vgpu-manager-validation,
  vgpu-devices-validation) and nvidia-sandbox-device-plugin-daemonset-*
  (init vfio-pci-validation waiting for the validator, then the
  kubevirt-gpu-device-plugin);
- what those operands do: vfio-manager binds every NVIDIA GPU of the node to
  vfio-pci (in the --host-root tree when there is one: driver links moved,
  driver_override written, as the kernel shows it); the validator passes when
  every GPU is on vfio-pci and otherwise exits 1 with nvidia-validator's
  message, so kubelet restarts it with back-off (Init:CrashLoopBackOff); the
  device plugin then advertises the GPUs on vfio-pci per device ID, named by
  the plugin's rule (getDeviceName in pkg/device_plugin/device_plugin.go) from
  ITS pci.ids (--plugin-pci-ids; default the host tree's
  /usr/share/misc/pci.ids), the raw device ID when that list lacks the card;
- the known failures, each as the real components produce it:
  * the host loads the NVIDIA driver (from the tree: /sys/module/nvidia and a
    GPU on nvidia; or --host-nvidia-driver): k8s-driver-manager finds
    `nvidia-smi` working on /host, labels the node
    nvidia.com/gpu.deploy.driver=pre-installed (which the operator sweeps
    again on its next pass) and exits 1 with "driver is pre-installed on
    host", so vfio-manager never binds and the validator crash-loops too;
  * a GPU vfio-manage cannot bind (--vfio-bind-fails ADDR): vfio-manage only
    warns and goes on, so the validator crash-loops naming that device;
  * the label with sandboxWorkloads off: nothing happens (the operator logs
    "no GPU workload config" and keeps the container set).
- pod logs: GET .../pods/NAME/log?container=C[&previous=true] answers the
  lines those components print (text/plain).

DOES NOT: run the container-workload operands (driver, toolkit, device
plugin, DCGM: their pods are not made), model vGPU or Kata, NFD beyond the
node's pci-10de label, or the operator's Deployment itself.

Test control: POST /_fake/gpu-operator {"hostDriver": bool,
"vfioBindFails": ["0000:41:00.0"], "pluginPciIds": PATH} changes those knobs
while the fake runs.
"""
import copy
import os
import re
import time

NS = "gpu-operator"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
GPU_PRESENT = "nvidia.com/gpu.present"
DRIVER_DEPLOY = "nvidia.com/gpu.deploy.driver"
KUBEVIRT_PLUGIN_DEPLOY = "nvidia.com/gpu.deploy.sandbox-device-plugin"
KATA_PLUGIN_DEPLOY = "nvidia.com/gpu.deploy.kata-sandbox-device-plugin"

# controllers/state_manager.go, gpuStateLabels.
STATE_LABELS = {
    "container": {
        DRIVER_DEPLOY: "true",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/gpu.deploy.container-toolkit": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.dcgm": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "true",
        "nvidia.com/gpu.deploy.node-status-exporter": "true",
        "nvidia.com/gpu.deploy.operator-validator": "true",
        "nvidia.com/gpu.deploy.client": "true",
    },
    "vm-passthrough": {
        KUBEVIRT_PLUGIN_DEPLOY: "true",
        "nvidia.com/gpu.deploy.sandbox-validator": "true",
        "nvidia.com/gpu.deploy.vfio-manager": "true",
        "nvidia.com/gpu.deploy.kata-manager": "true",
        "nvidia.com/gpu.deploy.cc-manager": "true",
        "nvidia.com/gpu.deploy.client": "true",
    },
    "vm-vgpu": {
        KUBEVIRT_PLUGIN_DEPLOY: "true",
        "nvidia.com/gpu.deploy.vgpu-manager": "true",
        "nvidia.com/gpu.deploy.vgpu-device-manager": "true",
        "nvidia.com/gpu.deploy.sandbox-validator": "true",
        "nvidia.com/gpu.deploy.cc-manager": "true",
        "nvidia.com/gpu.deploy.client": "true",
    },
}
ALL_STATE_KEYS = {k for m in STATE_LABELS.values() for k in m} | {
    KATA_PLUGIN_DEPLOY, "nvidia.com/gpu.deploy.mig-manager"}

VALIDATOR_INITS = ["cc-manager-validation", "vfio-pci-validation", "vgpu-manager-validation",
                   "vgpu-devices-validation"]


def cluster_policy(sandbox):
    """The ClusterPolicy the Helm chart (deployments/gpu-operator, default
    values) renders, with sandboxWorkloads as asked."""
    image = {"repository": "nvcr.io/nvidia", "imagePullPolicy": "IfNotPresent"}
    return {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy",
                     "labels": {"app.kubernetes.io/component": "gpu-operator",
                                "app.kubernetes.io/managed-by": "Helm"}},
        "spec": {
            "operator": {"defaultRuntime": "containerd", "runtimeClass": "nvidia",
                         "initContainer": dict(image, image="cuda",
                                               version="13.0.1-base-ubi9")},
            "daemonsets": {"priorityClassName": "system-node-critical",
                           "updateStrategy": "RollingUpdate",
                           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                            "effect": "NoSchedule"}]},
            "driver": dict(image, enabled=True, image="driver", version="580.95.05",
                           kernelModuleType="auto"),
            "toolkit": dict(image, enabled=True, image="k8s/container-toolkit",
                            version="v1.18.0"),
            "devicePlugin": dict(image, enabled=True, image="k8s-device-plugin",
                                 version="v0.18.0"),
            "dcgm": dict(image, enabled=False, image="cloud-native/dcgm",
                         version="4.4.1-2-ubuntu22.04"),
            "dcgmExporter": dict(image, enabled=True, image="k8s/dcgm-exporter",
                                 version="4.4.1-4.6.0-ubuntu22.04"),
            "gfd": dict(image, enabled=True, image="k8s-device-plugin", version="v0.18.0"),
            "nodeStatusExporter": dict(image, enabled=False, image="gpu-operator",
                                       version="v26.7.0"),
            "validator": dict(image, image="gpu-operator", version="v26.7.0"),
            "sandboxWorkloads": {"enabled": bool(sandbox), "defaultWorkload": "container",
                                 "mode": "kubevirt"},
            "vfioManager": {"enabled": True, "repository": "nvcr.io/nvidia/cloud-native",
                            "image": "k8s-driver-manager", "version": "v0.12.0",
                            "imagePullPolicy": "IfNotPresent"},
            "sandboxDevicePlugin": dict(image, enabled=True, image="kubevirt-gpu-device-plugin",
                                        version="v1.6.0"),
        },
        "status": {"state": "ready", "namespace": NS},
    }


def plugin_device_name(pci_ids_path, device_id):
    """getDeviceName: the device's pci.ids name under vendor 10de, trimmed,
    upper-cased, '/' and '.' to '_', white space runs to '_', then anything
    outside [A-Za-z0-9_.] dropped; "" when the list lacks it."""
    if not pci_ids_path or not os.path.isfile(pci_ids_path):
        return ""
    with open(pci_ids_path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines) and not lines[i].startswith("10de"):
        i += 1
    prefix = "\t" + device_id
    for line in lines[i + 1:]:
        if line.startswith("#"):
            continue
        if not line.startswith("\t"):
            return ""
        if not line.startswith(prefix):
            continue
        name = line[len(prefix):].strip().upper().replace("/", "_").replace(".", "_")
        name = re.sub(r"\s+", "_", name)
        return re.sub(r"[^a-zA-Z0-9_.]+", "", name)
    return ""


def tree_gpus(root):
    """The NVIDIA GPUs (class 03xx) of a sysfs tree: address, device ID, driver."""
    out = []
    devdir = os.path.join(root, "sys", "bus", "pci", "devices")
    for addr in sorted(os.listdir(devdir)):
        d = os.path.join(devdir, addr)
        try:
            with open(os.path.join(d, "vendor")) as f:
                vendor = f.read().strip().lower().replace("0x", "")
            with open(os.path.join(d, "device")) as f:
                device = f.read().strip().lower().replace("0x", "")
            with open(os.path.join(d, "class")) as f:
                cls = f.read().strip().lower().replace("0x", "")
        except OSError:
            continue
        if vendor != "10de" or not cls.startswith("03"):
            continue
        drv = os.path.join(d, "driver")
        driver = os.path.basename(os.readlink(drv)) if os.path.islink(drv) else ""
        out.append({"addr": addr, "device": device, "driver": driver, "native": driver})
    return out


def parse_node_gpus(specs):
    """--node-gpus 10DE:27B8=2[,...] (on no driver), for a fake without a tree."""
    out = []
    n = 0
    for spec in specs or []:
        for part in spec.split(","):
            k, _, v = part.partition("=")
            device = k.strip().lower().split(":")[-1]
            for _ in range(int(v or "1")):
                n += 1
                out.append({"addr": "0000:%02x:00.0" % n, "device": device, "driver": "",
                            "native": ""})
    return out


class GpuOperator:
    def __init__(self, store, res_by_kind, node_name, args):
        self.store, self.node_name, self.args = store, node_name, args
        self.res = {k: res_by_kind[v] for k, v in {
            "node": ("v1", "Node"), "pod": ("v1", "Pod"), "ns": ("v1", "Namespace"),
            "cp": ("nvidia.com/v1", "ClusterPolicy")}.items()}
        self.root = args.host_root
        self.gpus = tree_gpus(self.root) if self.root else parse_node_gpus(args.node_gpus)
        self.host_driver_flag = bool(args.host_nvidia_driver)
        self.bind_fails = set(args.vfio_bind_fails or [])
        self.plugin_pci_ids = args.plugin_pci_ids or (
            os.path.join(self.root, "usr/share/misc/pci.ids") if self.root else "")
        self.delay = args.operator_delay
        self.pods = {}     # operand -> {"name", "since", "restarts", "next"}
        self.logs = {}     # (pod, container, previous) -> text
        self.advertised = {}
        self.validated = False

    # --- seeding and control

    def seed_objects(self, add):
        if not self.args.gpu_operator:
            return
        add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS},
             "status": {"phase": "Active"}})
        add(cluster_policy(self.args.gpu_operator == "sandbox"))

    def control(self, doc):
        if "hostDriver" in doc:
            self.host_driver_flag = bool(doc["hostDriver"])
        if "vfioBindFails" in doc:
            self.bind_fails = set(doc["vfioBindFails"] or [])
        if "pluginPciIds" in doc:
            self.plugin_pci_ids = doc["pluginPciIds"] or ""

    def log(self, pod, container, previous=False):
        return self.logs.get((pod, container, bool(previous)))

    # --- the host as the operands see it

    def host_driver_loaded(self):
        """k8s-driver-manager's isHostDriver: `chroot /host nvidia-smi` prints a
        driver version, i.e. the module is loaded and owns a GPU."""
        if self.host_driver_flag:
            return True
        if not self.root:
            return False
        if not os.path.isdir(os.path.join(self.root, "sys/module/nvidia")):
            return False
        return any(g["driver"] == "nvidia" for g in self.current_gpus())

    def current_gpus(self):
        if self.root:
            now = {g["addr"]: g for g in tree_gpus(self.root)}
            for g in self.gpus:
                if g["addr"] in now:
                    g["driver"] = now[g["addr"]]["driver"]
        return self.gpus

    def set_driver(self, gpu, driver):
        if self.root:
            dev = os.path.realpath(os.path.join(self.root, "sys/bus/pci/devices", gpu["addr"]))
            link = os.path.join(dev, "driver")
            old = os.path.basename(os.readlink(link)) if os.path.islink(link) else ""
            if old:
                os.remove(link)
                try:
                    os.remove(os.path.join(self.root, "sys/bus/pci/drivers", old, gpu["addr"]))
                except OSError:
                    pass
            if driver:
                drv = os.path.join(self.root, "sys/bus/pci/drivers", driver)
                os.makedirs(drv, exist_ok=True)
                for f in ("bind", "unbind", "new_id", "remove_id"):
                    p = os.path.join(drv, f)
                    if not os.path.exists(p):
                        open(p, "w").close()
                os.symlink(os.path.relpath(dev, drv), os.path.join(drv, gpu["addr"]))
                os.symlink(os.path.relpath(drv, dev), link)
            with open(os.path.join(dev, "driver_override"), "w") as f:
                f.write(("vfio-pci" if driver == "vfio-pci" else "(null)") + "\n")
        gpu["driver"] = driver

    # --- the operator's reconcile, one pass per tick (store lock held)

    def tick(self, now):
        s = self.store
        cps = s.items(self.res["cp"])
        node = s.get(self.res["node"], "", self.node_name)
        if not cps or node is None:
            return
        cp = cps[0]
        sandbox = (((cp.get("spec") or {}).get("sandboxWorkloads") or {}).get("enabled")) is True
        mode = ((cp.get("spec") or {}).get("sandboxWorkloads") or {}).get("mode") or "kubevirt"
        labels = dict((node.get("metadata") or {}).get("labels") or {})
        before = dict(labels)
        if self.gpus:
            labels["feature.node.kubernetes.io/pci-10de.present"] = "true"
            labels[GPU_PRESENT] = "true"
        config = "container"
        if sandbox and labels.get(WORKLOAD_LABEL) in STATE_LABELS:
            config = labels[WORKLOAD_LABEL]
        if labels.get(GPU_PRESENT) == "true":
            effective = dict(STATE_LABELS[config])
            if config == "vm-passthrough" and mode == "kata":
                effective.pop(KUBEVIRT_PLUGIN_DEPLOY, None)
                effective[KATA_PLUGIN_DEPLOY] = "true"
            for k in list(labels):
                if k in ALL_STATE_KEYS and k not in effective:
                    del labels[k]
            for k, v in effective.items():
                if not labels.get(k):
                    labels[k] = v
        spec = cp.get("spec") or {}
        want = {
            "vfio-manager": labels.get("nvidia.com/gpu.deploy.vfio-manager") == "true" and
            (spec.get("vfioManager") or {}).get("enabled", True) is not False,
            "sandbox-validator": labels.get("nvidia.com/gpu.deploy.sandbox-validator") == "true",
            "sandbox-device-plugin": labels.get(KUBEVIRT_PLUGIN_DEPLOY) == "true" and
            (spec.get("sandboxDevicePlugin") or {}).get("enabled", True) is not False,
        }
        for operand, on in want.items():
            if on:
                self.run_operand(operand, now, labels)
            elif operand in self.pods:
                self.stop_operand(operand)
        if labels != before:
            node = copy.deepcopy(node)
            node["metadata"]["labels"] = labels
            s.put(self.res["node"], node, "MODIFIED")
        # The sandbox device plugin's resources, for the node's allocatable:
        # of the GPUs it registered, those still on vfio-pci (its healthCheck
        # marks a GPU whose /dev/vfio/<group> went away Unhealthy).
        if getattr(self, "registered_gpus", None):
            healthy = {}
            for g in self.current_gpus():
                res = self.registered_gpus.get(g["addr"])
                if res and g["driver"] in ("vfio-pci", "nvgrace_gpu_vfio_pci"):
                    healthy[res] = healthy.get(res, 0) + 1
            for res in self.advertised:
                self.advertised[res] = healthy.get(res, 0) if self.pods.get(
                    "sandbox-device-plugin") else 0
        s.external_resources = dict(self.advertised)
        if self.gpus:
            # What virt-handler would find on vfio-pci now that vfio-manager ran.
            s.vfio = {}
            for g in self.current_gpus():
                if g["driver"] == "vfio-pci":
                    key = ("10DE:" + g["device"]).upper()
                    s.vfio[key] = s.vfio.get(key, 0) + 1

    # --- operands

    def pod_name(self, operand):
        base = {"vfio-manager": "nvidia-vfio-manager",
                "sandbox-validator": "nvidia-sandbox-validator",
                "sandbox-device-plugin": "nvidia-sandbox-device-plugin-daemonset"}[operand]
        return base + "-" + {"vfio-manager": "8xk2p", "sandbox-validator": "q7wzd",
                             "sandbox-device-plugin": "m4ntc"}[operand]

    def stop_operand(self, operand):
        st = self.pods.pop(operand)
        pod = self.store.get(self.res["pod"], NS, st["name"])
        if pod is not None:
            self.store.drop(self.res["pod"], pod)
        if operand == "vfio-manager" and st.get("bound"):
            # preStop: vfio-manage unbind --all gives the GPUs back to their driver.
            for g in self.current_gpus():
                if g["driver"] == "vfio-pci":
                    self.set_driver(g, g["native"] if g["native"] != "vfio-pci" else "")
        if operand == "sandbox-device-plugin":
            for k in self.advertised:
                self.advertised[k] = 0
        if operand == "sandbox-validator":
            self.validated = False
        self.logs = {k: v for k, v in self.logs.items() if k[0] != st["name"]}

    def run_operand(self, operand, now, labels):
        st = self.pods.get(operand)
        if st is None:
            st = {"name": self.pod_name(operand), "since": now, "restarts": 0,
                  "next": now + self.delay}
            self.pods[operand] = st
        getattr(self, "step_" + operand.replace("-", "_"))(st, now, labels)

    def write_pod(self, st, labels, inits, main, phase, ready):
        pod_labels = {"vfio-manager": {"name": "nvidia-vfio-manager",
                                       "app": "nvidia-vfio-manager"},
                      "sandbox-validator": {"app": "nvidia-sandbox-validator",
                                            "app.kubernetes.io/part-of": "gpu-operator"},
                      "sandbox-device-plugin": {
                          "app": "nvidia-sandbox-device-plugin-daemonset"}}[labels]
        res = self.res["pod"]
        old = self.store.get(res, NS, st["name"])
        status = {"phase": phase, "hostIP": "192.168.122.10",
                  "conditions": [{"type": "Initialized",
                                  "status": "True" if all(
                                      "terminated" in (c.get("state") or {}) and
                                      c["state"]["terminated"].get("exitCode") == 0
                                      for c in inits) else "False"},
                                 {"type": "Ready", "status": "True" if ready else "False"},
                                 {"type": "ContainersReady",
                                  "status": "True" if ready else "False"},
                                 {"type": "PodScheduled", "status": "True"}],
                  "initContainerStatuses": inits, "containerStatuses": [main]}
        if old is None:
            pod = self.store.make(res, {
                "metadata": {"name": st["name"], "labels": pod_labels,
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                  "name": st["name"].rsplit("-", 1)[0],
                                                  "uid": "00000000-0000-4000-8000-%012d" % len(
                                                      st["name"]),
                                                  "controller": True}]},
                "spec": {"nodeName": self.node_name,
                         "initContainers": [{"name": c["name"], "image": c["image"]}
                                            for c in inits],
                         "containers": [{"name": main["name"], "image": main["image"]}]}}, NS)
            pod["status"] = status
            self.store.put(res, pod, "ADDED")
        elif old.get("status") != status:
            pod = copy.deepcopy(old)
            pod["status"] = status
            self.store.put(res, pod, "MODIFIED")

    @staticmethod
    def container(name, image, state, restarts=0, last=None, ready=False):
        c = {"name": name, "image": image, "imageID": "", "ready": ready,
             "restartCount": restarts, "state": state}
        if last:
            c["lastState"] = last
        return c

    def crash_loop(self, st, now, name, image, message_lines, pod, container):
        """One more failed attempt when it is due: exit 1, back-off."""
        if now >= st["next"]:
            st["restarts"] += 1
            st["next"] = now + self.delay
            self.logs[(pod, container, True)] = "\n".join(message_lines) + "\n"
        last = {"terminated": {"exitCode": 1, "reason": "Error"}} if st["restarts"] else None
        state = {"waiting": {"reason": "CrashLoopBackOff",
                             "message": "back-off 10s restarting failed container=%s pod=%s_%s"
                                        % (container, pod, NS)}} if st["restarts"] else \
            {"running": {}}
        return self.container(name, image, state, st["restarts"], last)

    def step_vfio_manager(self, st, now, labels):
        pod = st["name"]
        image = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
        waiting_main = self.container("nvidia-vfio-manager", image,
                                      {"waiting": {"reason": "PodInitializing"}})
        if self.host_driver_loaded():
            # cmd/driver-manager/main.go uninstallDriver -> isHostDriver.
            if now >= st["next"]:
                labels[DRIVER_DEPLOY] = "pre-installed"
            init = self.crash_loop(st, now, "k8s-driver-manager", image, [
                'time="2026-12-01T20:00:00Z" level=info msg="Starting driver uninstallation process"',
                'time="2026-12-01T20:00:00Z" level=info msg="Host driver detected: 580.95.05"',
                'time="2026-12-01T20:00:00Z" level=info msg="NVIDIA GPU driver is already '
                'pre-installed on the node, disabling the containerized driver"',
                'time="2026-12-01T20:00:00Z" level=info msg="Labeling node %s with '
                'nvidia.com/gpu.deploy.driver=pre-installed"' % self.node_name,
                'time="2026-12-01T20:01:00Z" level=fatal msg="failed to uninstall driver: '
                'driver is pre-installed on host"'], pod, "k8s-driver-manager")
            self.write_pod(st, "vfio-manager", [init], waiting_main, "Pending", False)
            return
        if now < st["since"] + self.delay:
            init = self.container("k8s-driver-manager", image, {"running": {}})
            self.write_pod(st, "vfio-manager", [init], waiting_main, "Pending", False)
            return
        init = self.container("k8s-driver-manager", image,
                              {"terminated": {"exitCode": 0, "reason": "Completed"}})
        if not st.get("bound"):
            lines = []
            for g in self.current_gpus():
                lines.append('time="2026-12-01T20:00:01Z" level=info msg="Binding device %s"'
                             % g["addr"])
                if g["addr"] in self.bind_fails:
                    lines.append('time="2026-12-01T20:00:01Z" level=warning msg="Failed to bind '
                                 'device %s: failed to bind device %s to vfio-pci: write '
                                 '/sys/bus/pci/drivers/vfio-pci/bind: no such device"'
                                 % (g["addr"], g["addr"]))
                    continue
                if g["driver"] != "vfio-pci":
                    self.set_driver(g, "vfio-pci")
            self.logs[(pod, "nvidia-vfio-manager", False)] = "\n".join(lines) + "\n"
            st["bound"] = True
        main = self.container("nvidia-vfio-manager", image,
                              {"running": {"startedAt": "2026-12-01T20:00:01Z"}}, ready=True)
        self.write_pod(st, "vfio-manager", [init], main, "Running", True)

    def step_sandbox_validator(self, st, now, labels):
        pod = st["name"]
        image = "nvcr.io/nvidia/gpu-operator:v26.7.0"
        done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        waiting = {"waiting": {"reason": "PodInitializing"}}
        main_waiting = self.container("nvidia-sandbox-validator", image, waiting)
        inits = [self.container("cc-manager-validation", image, done)]
        if now < st["since"] + self.delay:
            inits.append(self.container("vfio-pci-validation", image, {"running": {}}))
            inits += [self.container(n, image, waiting) for n in VALIDATOR_INITS[2:]]
            self.write_pod(st, "sandbox-validator", inits, main_waiting, "Pending", False)
            return
        off = [g for g in self.current_gpus() if g["driver"] not in ("vfio-pci",
                                                                      "nvgrace_gpu_vfio_pci")]
        if off:
            g = off[0]
            inits.append(self.crash_loop(st, now, "vfio-pci-validation", image, [
                'time="2026-12-01T20:00:02Z" level=info msg="GPU workload configuration: '
                'vm-passthrough"',
                'time="2026-12-01T20:00:02Z" level=fatal msg="error validating vfio-pci driver '
                'installation: device not bound to \'vfio-pci\'; device: %s driver: \'%s\'"'
                % (g["addr"], g["driver"])], pod, "vfio-pci-validation"))
            inits += [self.container(n, image, waiting) for n in VALIDATOR_INITS[2:]]
            self.write_pod(st, "sandbox-validator", inits, main_waiting, "Pending", False)
            self.validated = False
            return
        inits += [self.container(n, image, done, st["restarts"] if n == "vfio-pci-validation"
                                 else 0) for n in VALIDATOR_INITS[1:]]
        main = self.container("nvidia-sandbox-validator", image,
                              {"running": {"startedAt": "2026-12-01T20:00:03Z"}}, ready=True)
        self.logs[(pod, "nvidia-sandbox-validator", False)] = "all validations are successful\n"
        self.validated = True
        self.write_pod(st, "sandbox-validator", inits, main, "Running", True)

    def step_sandbox_device_plugin(self, st, now, labels):
        image = "nvcr.io/nvidia/kubevirt-gpu-device-plugin:v1.6.0"
        if not getattr(self, "validated", False):
            init = self.container("vfio-pci-validation", image, {"running": {}})
            main = self.container("nvidia-sandbox-device-plugin-ctr", image,
                                  {"waiting": {"reason": "PodInitializing"}})
            self.write_pod(st, "sandbox-device-plugin", [init], main, "Pending", False)
            return
        init = self.container("vfio-pci-validation", image,
                              {"terminated": {"exitCode": 0, "reason": "Completed"}})
        main = self.container("nvidia-sandbox-device-plugin-ctr", image,
                              {"running": {"startedAt": "2026-12-01T20:00:04Z"}}, ready=True)
        if not st.get("registered"):
            # The plugin discovers the GPUs on vfio-pci once, at start.
            counts = {}
            self.registered_gpus = {}
            for g in self.current_gpus():
                if g["driver"] in ("vfio-pci", "nvgrace_gpu_vfio_pci"):
                    name = plugin_device_name(self.plugin_pci_ids, g["device"]) or g["device"]
                    counts["nvidia.com/" + name] = counts.get("nvidia.com/" + name, 0) + 1
                    self.registered_gpus[g["addr"]] = "nvidia.com/" + name
            self.advertised = counts
            st["registered"] = True
            self.logs[(st["name"], "nvidia-sandbox-device-plugin-ctr", False)] = "".join(
                "DP Name %s\n" % k.split("/", 1)[1] for k in sorted(counts))
        self.write_pod(st, "sandbox-device-plugin", [init], main, "Running", True)
