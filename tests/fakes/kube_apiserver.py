"""A fake Kubernetes API server (with a fake KubeVirt behind it) for tests.

STANDS IN FOR: the host cluster's kube-apiserver as Factory's Kubernetes
client sees it, plus the parts of KubeVirt and CDI whose effects Factory
reads back. It speaks the real protocol: HTTPS on loopback with a real CA,
bearer-token and client-certificate authentication, the REST paths
(/api/v1/..., /apis/<group>/<version>/...), Kubernetes `Status` error bodies
(401, 403, 404, 409, 410, 422 with details.causes), resourceVersion on every
write, list with labelSelector / fieldSelector, watch as a chunked stream of
JSON lines (ADDED / MODIFIED / DELETED / BOOKMARK, and ERROR 410 "too old
resource version" after compaction), create, update (PUT, conditional on
resourceVersion), server-side apply (PATCH application/apply-patch+yaml,
fieldManager required), JSON merge patch (conditional when it carries a
resourceVersion), delete with propagationPolicy (owned objects are
garbage-collected unless Orphan), dryRun=All. metadata.finalizers hold a
deleted object (deletionTimestamp set, MODIFIED) until the last is removed;
none may be added to an object being deleted. Factory's Tenant
(factory.dev/v1alpha1, validated by its CRD) has the status subresource:
GET/PUT/PATCH .../status change only the status, writes of the object keep
it, and metadata.generation moves with the spec only. Leases
(coordination.k8s.io/v1) are stored with optimistic concurrency, as the
API server does: their holderIdentity and renewTime mean something only to
the clients that take turns by them.

Every object a client writes is validated by k8s_schema.py against the real
OpenAPI schemas (KubeVirt, CDI) or python3-kubernetes' models (core kinds),
unknown fields rejected; an invalid object gets 422 Invalid like a strict
server. Service node ports are checked for range (30000-32767) and clashes.

PLAYS KUBEVIRT: the main Node (--node-name, default "utho") whose
status.allocatable has, for each entry of the KubeVirt CR's
spec.configuration.permittedHostDevices.pciHostDevices without
externalResourceProvider, the number of host cards with that vendor:device
on vfio-pci (from --vfio-cards 10DE:27B8=2, or from a sysfs tree given by
--host-root), recomputed shortly after the CR changes (--device-plugin-delay),
as virt-handler's device plugins do. With --host-root the tree is read again
at every pass: a card that leaves vfio-pci (`factory host quarantine`) takes
its /dev/vfio/<group> node with it, which the device plugins watch (fsnotify
in KubeVirt's generic plugin and in kubevirt-gpu-device-plugin's healthCheck):
they report it Unhealthy and the kubelet's allocatable goes down by one,
capacity staying; back on vfio-pci it is healthy again.

More Nodes, for moving VMs off a drained host: each --extra-node
NAME=VENDOR:DEVICE=COUNT[,VENDOR:DEVICE=COUNT...] (repeatable, e.g.
--extra-node gpu-2=10DE:27B8=1) is a Node of the same shape (labels
kubernetes.io/hostname and kubevirt.io/schedulable, InternalIP the next one
after --node-ip, its own pod CIDR slice after --pod-cidr's: 10.42.1.0/24,
10.42.2.0/24, ...) whose allocatable and capacity for each allowlisted
pciHostDevices resource (as for the main node) is COUNT of that
vendor:device. Extra nodes have only that: no --host-root tree, no
quarantine, no GPU Operator (which plays on the main node only).

A VirtualMachine with runStrategy Always (or running: true) gets its
DataVolumes (from dataVolumeTemplates, reported Succeeded) and a
VirtualMachineInstance that goes Pending -> Scheduling -> Scheduled ->
Running with status.nodeName and status.interfaces[].ipAddress (from its
node's pod CIDR). Scheduling is kube-scheduler's filter step for
the launcher pod: the VMI goes to the first node, the main one and then the
extra ones in the order given, that is not cordoned (below) and has its GPUs
(gpus[].deviceName, hostDevices[].deviceName) free: allocatable less what the
Scheduled and Running VMIs on that node ask for. If no node fits, the VMI
stays in Scheduling with condition PodScheduled=False, reason Unschedulable,
and the scheduler's message over all nodes (FitError, then DefaultPreemption's
verdict; each part a histogram of "<count> <reason>" sorted as strings):
"0/1 nodes are available: 1 Insufficient <resource>. preemption: 0/1 nodes
are available: 1 No preemption victims found for incoming pod." with one
node, and with more, e.g. "0/2 nodes are available: 1 Insufficient
<resource>, 1 node(s) were unschedulable. preemption: 0/2 nodes are
available: 1 No preemption victims found for incoming pod, 1 Preemption is
not helpful for scheduling."; the VM's printableStatus is
ErrorUnschedulable, as with KubeVirt. Deleting the VM deletes its VMI and
DataVolumes (ownerReferences).
With --cdi-storage network|local each DataVolume also gets CDI's
PersistentVolumeClaim (owned by it, Bound) and the PersistentVolume a
provisioner bound it to: a CSI volume (rbd.csi.ceph.com) any node reaches, or
a `local` volume with node affinity to the main node, as local-path and LVM
provisioners make; deleting the claim deletes the volume (reclaimPolicy
Delete). Without the flag neither exists.

Stopping is graceful, as virt-controller and virt-handler make it: when a
VM's runStrategy becomes Halted (spec.running false), by any write or by the
stop subresource, the next controller pass deletes its VMI: it gets
metadata.deletionTimestamp (MODIFIED), the VM's printableStatus is Stopping
and its ready false, the VMI's Ready condition False (its launcher pod is
going down); the VMI stays phase Running (its GPUs held) while the guest
powers off, --vm-shutdown-seconds (default 1.0) or its
spec.terminationGracePeriodSeconds if that is shorter; then it is phase
Succeeded (MODIFIED), on the next pass the VM's printableStatus
Stopped, and the VMI is removed (DELETED). A VMI deleted before it ran
(Pending, Scheduling, Scheduled) has no guest to shut down: Failed at once,
then removed. Back to runStrategy Always, a new VMI (new uid) is made once the
old one is gone; while it goes, the VM stays Stopping. A client's DELETE of a
VMI still removes it at once (Factory's restart deletes the VMI directly).

virt-api's subresources (subresources.kubevirt.io/v1, and v1alpha3):
PUT .../namespaces/NS/virtualmachines/NAME/stop, /start and /restart, each
authorized as verb "update" on resource "virtualmachines/stop" (/start,
/restart) in API group subresources.kubevirt.io, as KubeVirt's RBAC names
them, and answered as pkg/virt-api/rest/lifecycle.go answers: 202 Accepted
with no body; 404 'virtualmachine.kubevirt.io "NAME" not found'; 409
Conflict 'Operation cannot be fulfilled on virtualmachine.kubevirt.io
"NAME": ...' with "VM is already running" (start while a VMI that is not
Succeeded/Failed exists), "Always does not support manual start requests"
(start of an Always VM with no live VMI), "VM is not running" and "Halted
only supports manual stop requests with a shorter graceperiod" (stop of a
Halted VM), "RunStategy Halted does not support manual restart requests"
(sic) and "VM is not running: Halted" (restart); 400 for a body that is not
StopOptions/StartOptions/RestartOptions or a restart gracePeriodSeconds other
than 0. stop sets runStrategy Halted (spec.running false where the VM uses
running), after setting the VMI's terminationGracePeriodSeconds to the body's
gracePeriod if it has one; start sets Always (running true); under Manual or
RerunOnFailure, and for restart, they write status.stateChangeRequests
(Stop with the VMI's uid, Start), which the controller carries out as
virt-controller does (restart: the VMI shuts down gracefully and a new one
starts; gracePeriodSeconds 0 cuts the shutdown to 1 s, as virt-api deleting
the launcher pod with a 1 s grace period does). dryRun ["All"] in the body
changes nothing. No discovery is served (for any group), so none for this one.

Cordon: a Node (the main one or an extra one) whose spec.unschedulable
becomes true (merge patch, strategic
merge patch as `kubectl cordon` sends it, update or apply) gets the taint
node.kubernetes.io/unschedulable:NoSchedule (with timeAdded) on the next
controller pass, as the node lifecycle controller adds it, and loses it when
uncordoned. No VMI is scheduled onto it (unless its tolerations tolerate that
taint): with one node, a VMI in Scheduling stays there with
PodScheduled=False, reason Unschedulable, message "0/1 nodes are available:
1 node(s) were unschedulable. preemption: 0/1 nodes are available: 1
Preemption is not helpful for scheduling." (the scheduler's
NodeUnschedulable filter runs first, so it is said instead of any
Insufficient), and its VM is ErrorUnschedulable; with extra nodes it goes to
one with a free card if there is one. It schedules once uncordoned. VMIs
already Scheduled or Running are untouched by a cordon.

PLAYS THE HOST CLUSTER'S NETWORK: the Node has spec.podCIDR(s) (--pod-cidr,
default RKE2's first node slice 10.42.0.0/24; extra nodes the next slices)
and an InternalIP (--node-ip; extra nodes the next addresses); the service
range (--service-cidr, default RKE2's 10.43.0.0/16) holds the `kubernetes`
Service at its first address and the cluster DNS Service at its tenth
(--dns-service, default RKE2's kube-system/rke2-coredns-rke2-coredns; kubeadm
and k3s call it kube-system/kube-dns), labelled k8s-app=kube-dns as all
three label it; new Services get ClusterIPs from that range. The
networking.k8s.io ServiceCIDR kind is not served (as on Kubernetes before
1.33 without the beta API): python3-kubernetes has no model to check it by.

PLAYS THE GPU OPERATOR (--gpu-operator sandbox|container; gpu_operator.py
says what it models): the ClusterPolicy CR (nvidia.com/v1, checked against
the real CRD), the node labelling that nvidia.com/gpu.workload.config drives,
the vm-passthrough operands' pods (vfio-manager, sandbox validator, sandbox
device plugin) with their logs (GET .../pods/NAME/log), vfio-manager binding
the node's GPUs (in the --host-root tree), and the kubevirt-gpu-device-plugin
advertising them on the Node under its own resource names. Pods may be
listed with fieldSelector spec.nodeName.

DOES NOT: persist anything, run admission webhooks beyond the schemas,
track managedFields or detect apply conflicts between field managers (apply
merges maps and replaces lists), implement JSON patch or strategic merge
patch beyond what a merge patch means (one with a list or a $ directive is
refused with 415; custom resources refuse it as the API server does), serve
the /status subresources of built-in and KubeVirt kinds (clients' status
writes to them are ignored; a Tenant's /status is served), serve API
discovery (/api, /apis), keep Terminating namespaces (a namespace and its
contents go at once), paginate lists, run pods, or boot anything. Of
KubeVirt it does not model: finalizers on VMIs (a DELETE removes one at
once), evictions or `kubectl drain` (no Eviction API, no
evictionStrategy), live migration, pause/unpause or a paused start,
RerunOnFailure and Once stopping for good after a guest's own poweroff (they
run like Always), guest-initiated shutdowns, or KubeVirt's own finalizers on
VMs (a VM's DELETE removes it and its VMI at once; only a client's finalizer
holds it, printableStatus Terminating).

Usage:
  /usr/bin/python3 kube_apiserver.py --pki-dir DIR [--port-file F] [--port N]
      [--vfio-cards 10DE:27B8=2 | --host-root DIR] [--node-name utho]
      [--extra-node NAME=VENDOR:DEVICE=COUNT[,VENDOR:DEVICE=COUNT...]]...
      [--cdi-storage none|network|local]
      [--token T] [--forbid VERB:RESOURCE[:NAMESPACE]] [--drop-watch-after N]
      [--seed FILE.yaml] [--no-kubevirt-cr] [--no-group cdi.kubevirt.io]
      [--bookmark-interval S] [--device-plugin-delay S]
      [--pod-cidr 10.42.0.0/24] [--service-cidr 10.43.0.0/16] [--node-ip IP]
      [--dns-service kube-system/kube-dns]
      [--gpu-operator sandbox|container] [--node-gpus 10DE:2335=1]
      [--host-nvidia-driver] [--vfio-bind-fails ADDR] [--plugin-pci-ids FILE]
      [--operator-delay S] [--vm-shutdown-seconds S]

It writes into --pki-dir: ca.crt (the cluster CA), admin.crt / admin.key (a
client certificate it accepts), token (a bearer token it accepts) and
kubeconfig (server + CA data + admin client certificate data), and prints
"kube_apiserver: listening on https://127.0.0.1:PORT".

Test-control endpoints (no auth, loopback only), under /_fake/:
  POST /_fake/compact          forget watch history: older versions get 410
  POST /_fake/drop-watches     cut every open watch stream mid-body
  POST /_fake/hold-watches     {"hold": true|false}: new watch requests wait until released
  POST /_fake/forbid           {"verb","resource","namespace"} -> 403 from now on
  DELETE /_fake/forbid         clear those rules
  POST /_fake/vfio             {"10DE:27B8": 1}: the host's cards on vfio-pci now
  POST /_fake/gone             {"style": "event"|"http"}: how a too-old watch is refused
  POST /_fake/gpu-operator     {"hostDriver", "vfioBindFails", "pluginPciIds"}: see gpu_operator.py
  GET  /_fake/requests         the requests seen so far, oldest first: {"requests": [{"time"
                               (time.time() when it came), "method", "path", "user",
                               "contentType"}]} (the last 2000)
  GET  /_fake/vm-log           the VM lifecycle log, oldest first: {"entries": [{"time"
                               (time.time()), "vm" ("NS/NAME", or the node's name),
                               "event"}]} (the last 5000), with event one of:
                               stop_requested   runStrategy became Halted (any write, the stop
                                                subresource), or a stop request under
                                                Manual/RerunOnFailure
                               start_requested  runStrategy went from Halted to Always (or
                                                RerunOnFailure/Once), or a start request
                                                under Manual/RerunOnFailure
                               restart_requested  the restart subresource
                               shutdown_started the VMI got its deletionTimestamp
                               stopped          the VMI was removed (after its shutdown, or
                                                by a DELETE of it, its VM or its namespace)
                               started          a VMI reached Running (the first one too)
                               cordoned, uncordoned  a Node's spec.unschedulable changed
                                                ("vm" is that node's name)
"""
import argparse
import base64
import copy
import datetime
import ipaddress
import json
import os
import re
import secrets
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_operator  # noqa: E402
import k8s_schema  # noqa: E402
import testpki  # noqa: E402

# group, version, kind, plural, namespaced
RESOURCES = [
    ("", "v1", "Namespace", "namespaces", False),
    ("", "v1", "Secret", "secrets", True),
    ("", "v1", "Service", "services", True),
    ("", "v1", "Node", "nodes", False),
    ("", "v1", "ConfigMap", "configmaps", True),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
    ("", "v1", "PersistentVolume", "persistentvolumes", False),
    ("", "v1", "Pod", "pods", True),
    ("coordination.k8s.io", "v1", "Lease", "leases", True),
    ("kubevirt.io", "v1", "KubeVirt", "kubevirts", True),
    ("kubevirt.io", "v1", "VirtualMachine", "virtualmachines", True),
    ("kubevirt.io", "v1", "VirtualMachineInstance", "virtualmachineinstances", True),
    ("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes", True),
    ("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies", False),
    ("factory.dev", "v1alpha1", "Tenant", "tenants", True),
]
# Custom resources whose CRD declares the status subresource: a write of the
# object keeps its status, a write of .../status changes nothing else and
# never bumps metadata.generation (deploy/kubernetes/tenant-crd.yaml).
STATUS_SUBRESOURCE = {"Tenant"}
# Kinds whose status belongs to a controller (the fake), never to clients.
CONTROLLER_STATUS = {"Node", "KubeVirt", "VirtualMachine", "VirtualMachineInstance",
                     "DataVolume", "Namespace", "Service", "PersistentVolumeClaim",
                     "PersistentVolume", "Pod",
                     "ClusterPolicy"}
NODE_PORT_RANGE = (30000, 32767)
# The taint the node lifecycle controller keeps on a cordoned Node
# (k8s.io/api/core/v1 TaintNodeUnschedulable).
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
# What kube-scheduler (1.31) says of each node it refuses (fit_error() makes
# the message): the filter reasons, NodeUnschedulable's ErrReasonUnschedulable
# for a cordoned node (UnschedulableAndUnresolvable, so DefaultPreemption
# finds preemption "not helpful" there) and NodeResourcesFit's
# "Insufficient <resource>" (Unschedulable: preemption is tried, and finds no
# victims, the launcher pods all having the same priority). With one cordoned
# node: "0/1 nodes are available: 1 node(s) were unschedulable. preemption:
# 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
PREEMPTION_NOT_HELPFUL = "Preemption is not helpful for scheduling"
PREEMPTION_NO_VICTIMS = "No preemption victims found for incoming pod"
# runStrategy values under which virt-controller keeps a VMI running.
RUNNING_STRATEGIES = ("Always", "RerunOnFailure", "Once")
FINAL_PHASES = ("Succeeded", "Failed")


class Resource:
    def __init__(self, group, version, kind, plural, namespaced):
        self.group, self.version, self.kind, self.plural, self.namespaced = \
            group, version, kind, plural, namespaced

    @property
    def api_version(self):
        return self.group + "/" + self.version if self.group else self.version

    @property
    def qualified(self):  # "kubevirts.kubevirt.io", "secrets"
        return self.plural + "." + self.group if self.group else self.plural

    @property
    def kind_qualified(self):  # "VirtualMachine.kubevirt.io", "Service"
        return self.kind + "." + self.group if self.group else self.kind


RES_BY_PATH = {(r[0], r[1], r[3]): Resource(*r) for r in RESOURCES}
RES_BY_KIND = {(Resource(*r).api_version, r[2]): Resource(*r) for r in RESOURCES}
# virt-api's aggregated group: no objects of its own, only the VMs' start,
# stop and restart (authorized as "update" on virtualmachines/<action>).
SUBRESOURCE_VMS = Resource("subresources.kubevirt.io", "v1", "VirtualMachine", "virtualmachines", True)


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_doc(code, reason, message, details=None):
    doc = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code}
    if details:
        doc["details"] = details
    return doc


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def not_found(res, name):
    return ApiError(404, "NotFound", '%s "%s" not found' % (res.qualified, name),
                    {"name": name, "group": res.group, "kind": res.plural})


def run_strategy(spec):
    """VirtualMachine.RunStrategy(): runStrategy, else spec.running, else Halted."""
    spec = spec or {}
    return spec.get("runStrategy") or ("Always" if spec.get("running") else "Halted")


# virt-api's answers (pkg/virt-api/rest): k8s errors.NewNotFound / NewConflict
# for v1.Resource("virtualmachine"), i.e. "virtualmachine.kubevirt.io".
def vm_not_found(name):
    return ApiError(404, "NotFound", 'virtualmachine.kubevirt.io "%s" not found' % name,
                    {"name": name, "group": "kubevirt.io", "kind": "virtualmachine"})


def vm_conflict(name, why):
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on virtualmachine.kubevirt.io '
                    '"%s": %s' % (name, why),
                    {"name": name, "group": "kubevirt.io", "kind": "virtualmachine"})


def internal_error(why):
    return ApiError(500, "InternalError", "Internal error occurred: %s" % why,
                    {"causes": [{"message": why}]})


# ---------------------------------------------------------------- selectors

def parse_label_selector(text):
    """[(op, key, values)] for equality, set-based and existence terms."""
    terms = []
    for part in re.split(r",(?![^()]*\))", text or ""):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", part)
        if m:
            terms.append((m.group(2), m.group(1), [v.strip() for v in m.group(3).split(",")]))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            terms.append(("!=", k.strip(), [v.strip()]))
        elif "==" in part or "=" in part:
            k, v = re.split(r"==?", part, 1)
            terms.append(("=", k.strip(), [v.strip()]))
        elif part.startswith("!"):
            terms.append(("!", part[1:].strip(), []))
        else:
            terms.append(("exists", part, []))
    return terms


def labels_match(terms, obj):
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for op, k, vals in terms:
        have = k in labels
        v = labels.get(k)
        if op == "=" and v != vals[0]:
            return False
        if op == "!=" and v == vals[0]:
            return False
        if op == "in" and v not in vals:
            return False
        if op == "notin" and have and v in vals:
            return False
        if op == "exists" and not have:
            return False
        if op == "!" and have:
            return False
    return True


def fields_match(text, obj):
    md = obj.get("metadata") or {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        neg = "!=" in part
        k, v = re.split(r"!=|==?", part, 1)
        k, v = k.strip(), v.strip()
        if k == "metadata.name":
            have = md.get("name")
        elif k == "metadata.namespace":
            have = md.get("namespace")
        elif k == "spec.nodeName" and obj.get("kind", "Pod") == "Pod":
            have = (obj.get("spec") or {}).get("nodeName")
        else:
            raise ApiError(400, "BadRequest", 'field label not supported: %s' % k)
        if (have == v) == neg:
            return False
    return True


# ---------------------------------------------------------------- merging

def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


BUILTIN_GROUPS = ("", "coordination.k8s.io")


def smp_is_merge_patch(patch):
    """A strategic merge patch of maps and scalars only, with no $patch /
    $retainKeys / $setElementOrder directive, is applied as a merge patch."""
    if isinstance(patch, list):
        return False
    if isinstance(patch, dict):
        return all(not k.startswith("$") and smp_is_merge_patch(v) for k, v in patch.items())
    return True


def apply_merge(live, applied):
    """Server-side apply as far as Factory uses it: maps merge, lists and
    scalars from the applied configuration win."""
    if isinstance(live, dict) and isinstance(applied, dict):
        out = copy.deepcopy(live)
        for k, v in applied.items():
            out[k] = apply_merge(live.get(k), v)
        return out
    return copy.deepcopy(applied)


# ---------------------------------------------------------------- the store

class Store:
    def __init__(self, args):
        self.args = args
        self.cond = threading.Condition()
        self.rv = 100
        self.objects = {}       # (plural, ns, name) -> object
        self.history = []       # (rv, type, Resource, object)
        self.compacted = 0      # history at or below this rv is gone
        self.drop_generation = 0
        self.forbidden = []     # (verb, resource, namespace)
        self.gone_style = "event"
        self.hold_watches = False
        self.requests = []
        self.vfio = dict(args.vfio_inventory)
        # Cards the plugins found at start (the kubelet's capacity); with a
        # tree, what is on vfio-pci now is what they report healthy.
        self.vfio_capacity = dict(args.vfio_inventory)
        self.vfio_from_tree = bool(getattr(args, "host_root", None))
        # --extra-node: [{"name", "inventory" (VENDOR:DEVICE -> cards on
        # vfio-pci), "pod_cidr", "ip"}], in the order given.
        self.extra_nodes = list(getattr(args, "extra_nodes", None) or [])
        self.node_ports = {}
        self.next_ip = 98
        self.plugin_due = 0.0   # when the device plugins next look at the CR
        self.external_resources = {}  # resource -> count, from other device plugins
        # GET /_fake/vm-log: {"time", "vm", "event"}, oldest first.
        self.vm_log = []
        # VMI uid -> when its graceful shutdown began (monotonic), and the
        # longest it may take (s) where a forced restart cut it short.
        self.shutdowns = {}
        self.shutdown_cap = {}

    # --- primitives (call with self.cond held)

    def bump(self):
        self.rv += 1
        return str(self.rv)

    def record(self, type_, res, obj):
        self.history.append((int(obj["metadata"]["resourceVersion"]), type_, res, copy.deepcopy(obj)))
        if len(self.history) > 5000:
            cut = self.history[:1000]
            self.history = self.history[1000:]
            self.compacted = max(self.compacted, cut[-1][0])
        self.cond.notify_all()

    def get(self, res, ns, name):
        return self.objects.get((res.plural, ns if res.namespaced else "", name))

    def items(self, res, ns=None):
        out = []
        for (plural, ons, _), obj in sorted(self.objects.items()):
            if plural != res.plural:
                continue
            if res.namespaced and ns and ons != ns:
                continue
            out.append(obj)
        return out

    def put(self, res, obj, type_):
        md = obj["metadata"]
        md["resourceVersion"] = self.bump()
        key = (res.plural, md.get("namespace", "") if res.namespaced else "", md["name"])
        old = self.objects.get(key)
        self.objects[key] = obj
        self.record(type_, res, obj)
        if old is not None:
            self.note_change(res, old, obj)
        return obj

    def vm_event(self, who, event):
        self.vm_log.append({"time": time.time(), "vm": who, "event": event})
        self.vm_log = self.vm_log[-5000:]

    def note_change(self, res, old, new):
        """The lifecycle log's entries that a write makes, whoever wrote it."""
        md = new["metadata"]
        if res.kind == "VirtualMachine":
            was, now = run_strategy(old.get("spec")), run_strategy(new.get("spec"))
            who = md.get("namespace", "") + "/" + md["name"]
            if was != now and now == "Halted":
                self.vm_event(who, "stop_requested")
            elif was == "Halted" and now in RUNNING_STRATEGIES:
                self.vm_event(who, "start_requested")
        elif res.kind == "Node":
            was = bool((old.get("spec") or {}).get("unschedulable"))
            now = bool((new.get("spec") or {}).get("unschedulable"))
            if was != now:
                self.vm_event(md["name"], "cordoned" if now else "uncordoned")

    def drop(self, res, obj, propagation="Background"):
        md = obj["metadata"]
        key = (res.plural, md.get("namespace", "") if res.namespaced else "", md["name"])
        if key not in self.objects:
            return
        del self.objects[key]
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self.bump()
        self.record("DELETED", res, gone)
        if res.kind == "VirtualMachineInstance":
            self.shutdowns.pop(md.get("uid"), None)
            self.shutdown_cap.pop(md.get("uid"), None)
            self.vm_event(md.get("namespace", "") + "/" + md["name"], "stopped")
        if res.kind == "PersistentVolumeClaim":
            # reclaimPolicy Delete: the PV controller deletes the bound volume.
            for o in list(self.objects.values()):
                if o.get("kind") == "PersistentVolume" and \
                        ((o.get("spec") or {}).get("claimRef") or {}).get("uid") == md.get("uid"):
                    self.drop(RES_BY_KIND[("v1", "PersistentVolume")], o)
        if res.kind == "Service":
            for p in (obj.get("spec") or {}).get("ports") or []:
                self.node_ports.pop(p.get("nodePort"), None)
        if res.kind == "Namespace":
            for (plural, ns, name), o in list(self.objects.items()):
                if ns == md["name"]:
                    self.drop(RES_BY_KIND[(o["apiVersion"], o["kind"])], o)
        if propagation != "Orphan":
            uid = md.get("uid")
            for o in list(self.objects.values()):
                owners = (o.get("metadata") or {}).get("ownerReferences") or []
                if any(ref.get("uid") == uid for ref in owners):
                    self.drop(RES_BY_KIND[(o["apiVersion"], o["kind"])], o)

    def make(self, res, obj, ns):
        """Server-set metadata for a new object."""
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        if not md.get("name") and md.get("generateName"):
            md["name"] = md["generateName"] + secrets.token_hex(3)[:5]
        if res.namespaced:
            md["namespace"] = ns
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = now_rfc3339()
        if res.group:
            md["generation"] = 1
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        return obj


# ---------------------------------------------------------------- validation

def validate_or_422(res, obj):
    errors = k8s_schema.validate(obj)
    if not errors:
        return
    name = (obj.get("metadata") or {}).get("name", "")
    causes = []
    for e in errors:
        field, _, msg = e.partition(": ")
        reason = "FieldValueRequired" if msg.startswith("Required value") else \
            "FieldValueNotSupported" if msg.startswith("Unsupported value") else "FieldValueInvalid"
        causes.append({"reason": reason, "message": msg, "field": field})
    joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    raise ApiError(422, "Invalid", '%s "%s" is invalid: %s' % (res.kind_qualified, name, joined),
                   {"name": name, "group": res.group, "kind": res.kind, "causes": causes})


def check_service(store, obj, old):
    """NodePort range and clashes, and allocation of the ones left out."""
    spec = obj.setdefault("spec", {})
    if old is not None and (old.get("spec") or {}).get("clusterIP"):
        spec["clusterIP"] = old["spec"]["clusterIP"]
    if not spec.get("clusterIP"):
        net = ipaddress.ip_network(store.args.service_cidr, strict=False)
        # Above the kubernetes (1st) and DNS (10th) Services' addresses.
        spec["clusterIP"] = str(net[100 + store.rv % (net.num_addresses - 200)])
    if spec.get("type") not in ("NodePort", "LoadBalancer"):
        return
    mine = obj["metadata"]["namespace"] + "/" + obj["metadata"]["name"]
    causes = []
    for i, p in enumerate(spec.get("ports") or []):
        np = p.get("nodePort")
        if np is None:
            # At random among the free ones, as kube-apiserver's allocator
            # does: two doubles of parallel tests (each guest proxy listening
            # on 127.0.0.1:<nodePort>) then do not hand out the same port.
            free = [n for n in range(NODE_PORT_RANGE[0], NODE_PORT_RANGE[1] + 1)
                    if n not in store.node_ports]
            np = secrets.SystemRandom().choice(free)
            p["nodePort"] = np
        elif not NODE_PORT_RANGE[0] <= np <= NODE_PORT_RANGE[1]:
            causes.append(("spec.ports[%d].nodePort" % i,
                           "Invalid value: %d: provided port is not in the valid range. "
                           "The range of valid ports is %d-%d" % (np, *NODE_PORT_RANGE)))
        elif store.node_ports.get(np, mine) != mine:
            causes.append(("spec.ports[%d].nodePort" % i,
                           "Invalid value: %d: provided port is already allocated" % np))
    if causes:
        name = obj["metadata"]["name"]
        raise ApiError(422, "Invalid", 'Service "%s" is invalid: %s' % (
            name, "; ".join(f + ": " + m for f, m in causes)),
            {"name": name, "group": "", "kind": "Service",
             "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes]})


def reserve_node_ports(store, obj):
    mine = obj["metadata"]["namespace"] + "/" + obj["metadata"]["name"]
    for n, owner in list(store.node_ports.items()):
        if owner == mine:
            del store.node_ports[n]
    for p in (obj.get("spec") or {}).get("ports") or []:
        if p.get("nodePort"):
            store.node_ports[p["nodePort"]] = mine


# ---------------------------------------------------------------- KubeVirt

def host_vfio_inventory(root):
    """vendor:device (upper case) -> functions on vfio-pci, from a sysfs tree."""
    inv = {}
    devdir = os.path.join(root, "sys", "bus", "pci", "devices")
    for addr in sorted(os.listdir(devdir)):
        d = os.path.join(devdir, addr)
        try:
            with open(os.path.join(d, "vendor")) as f:
                vendor = f.read().strip().lower().replace("0x", "")
            with open(os.path.join(d, "device")) as f:
                device = f.read().strip().lower().replace("0x", "")
        except OSError:
            continue
        drv = os.path.join(d, "driver")
        if os.path.islink(drv) and os.path.basename(os.readlink(drv)) == "vfio-pci":
            key = (vendor + ":" + device).upper()
            inv[key] = inv.get(key, 0) + 1
    return inv


def gpu_requests(vmi_spec):
    out = {}
    devices = ((vmi_spec or {}).get("domain") or {}).get("devices") or {}
    for d in (devices.get("gpus") or []) + (devices.get("hostDevices") or []):
        name = d.get("deviceName")
        if name:
            out[name] = out.get(name, 0) + 1
    return out


class KubeVirtController:
    """What virt-operator, virt-handler's device plugins, virt-controller and
    CDI would do, reduced to what Factory observes. Runs on a timer thread;
    every change goes through the store, so watches see it."""

    def __init__(self, store, node_name, operator=None):
        self.store, self.node_name, self.operator = store, node_name, operator
        # The Nodes it runs, in the order the scheduler prefers them: the
        # main one, then --extra-node's in the order given.
        self.node_names = [node_name] + [e["name"] for e in store.extra_nodes]
        self.res = {k: RES_BY_KIND[v] for k, v in {
            "node": ("v1", "Node"), "kv": ("kubevirt.io/v1", "KubeVirt"),
            "vm": ("kubevirt.io/v1", "VirtualMachine"),
            "vmi": ("kubevirt.io/v1", "VirtualMachineInstance"),
            "dv": ("cdi.kubevirt.io/v1beta1", "DataVolume")}.items()}

    def update_status(self, res, obj, status):
        if obj.get("status") != status:
            obj = copy.deepcopy(obj)
            obj["status"] = status
            self.store.put(res, obj, "MODIFIED")

    def tick(self):
        s = self.store
        with s.cond:
            if self.operator is not None:
                self.operator.tick(time.monotonic())
            if time.monotonic() >= s.plugin_due or self.operator is not None:
                self.sync_node()
            self.sync_cordon()
            self.sync_vms()
            self.sync_vmis()

    def permitted(self):
        out = []
        for kv in s_items(self.store, self.res["kv"]):
            phd = ((((kv.get("spec") or {}).get("configuration") or {})
                    .get("permittedHostDevices") or {}).get("pciHostDevices")) or []
            out.extend(phd)
        return out

    def sync_node(self):
        self.sync_main_node()
        for extra in self.store.extra_nodes:
            self.sync_extra_node(extra)

    def sync_extra_node(self, extra):
        """An --extra-node's device plugins: KubeVirt's, for the allowlist,
        each resource at the count of its vendor:device's cards (healthy,
        so allocatable is capacity); a resource no longer allowlisted stays
        at 0, as the kubelet leaves it."""
        node = self.store.get(self.res["node"], "", extra["name"])
        if node is None:
            return
        status = copy.deepcopy(node.get("status") or {})
        alloc = dict(status.get("allocatable") or {})
        cap = dict(status.get("capacity") or {})
        advertised = set()
        for d in self.permitted():
            if d.get("externalResourceProvider"):
                continue
            name = d.get("resourceName")
            count = extra["inventory"].get(str(d.get("pciVendorSelector", "")).upper(), 0)
            advertised.add(name)
            alloc[name] = cap[name] = str(count)
        self.write_node_resources(node, status, alloc, cap, advertised)

    def write_node_resources(self, node, status, alloc, cap, advertised):
        """The Node's allocatable and capacity: what was advertised, and a
        device plugin that went away leaves its resource at 0 (kubelet)."""
        for name in list(alloc):
            if name not in advertised and "/" in name and not name.startswith("devices.kubevirt.io/") \
                    and name not in ("hugepages-1Gi", "hugepages-2Mi"):
                alloc[name] = cap[name] = "0"
        status["allocatable"], status["capacity"] = alloc, cap
        self.update_status(self.res["node"], node, status)

    def sync_main_node(self):
        node = self.store.get(self.res["node"], "", self.node_name)
        if node is None:
            return
        status = copy.deepcopy(node.get("status") or {})
        alloc = dict(status.get("allocatable") or {})
        cap = dict(status.get("capacity") or {})
        advertised = set()
        for d in self.permitted():
            if d.get("externalResourceProvider"):
                continue  # an external device plugin's job, not KubeVirt's
            name = d.get("resourceName")
            if self.store.vfio_from_tree and self.operator is None:
                self.store.vfio = host_vfio_inventory(self.store.args.host_root)
            key = str(d.get("pciVendorSelector", "")).upper()
            count = self.store.vfio.get(key, 0)
            advertised.add(name)
            alloc[name] = str(count)
            cap[name] = str(max(count, self.store.vfio_capacity.get(key, 0)))
        # Resources another device plugin registered with the kubelet (the GPU
        # Operator's kubevirt-gpu-device-plugin).
        for name, count in self.store.external_resources.items():
            if name not in advertised:
                advertised.add(name)
                alloc[name] = cap[name] = str(count)
        self.write_node_resources(node, status, alloc, cap, advertised)

    def sync_cordon(self):
        """The node lifecycle controller's NoSchedule tainting pass: a Node
        with spec.unschedulable (`kubectl cordon`) carries the
        node.kubernetes.io/unschedulable:NoSchedule taint, stamped with
        timeAdded as SwapNodeControllerTaint does, and loses it when
        uncordoned."""
        for name in self.node_names:
            self.sync_cordon_of(name)

    def sync_cordon_of(self, name):
        node = self.store.get(self.res["node"], "", name)
        if node is None:
            return
        spec = node.get("spec") or {}
        taints = list(spec.get("taints") or [])
        mine = [t for t in taints if t.get("key") == UNSCHEDULABLE_TAINT
                and t.get("effect") == "NoSchedule"]
        if spec.get("unschedulable") and not mine:
            taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule",
                           "timeAdded": now_rfc3339()})
        elif not spec.get("unschedulable") and mine:
            taints = [t for t in taints if t not in mine]
        else:
            return
        node = copy.deepcopy(node)
        if taints:
            node.setdefault("spec", {})["taints"] = taints
        else:
            node.setdefault("spec", {}).pop("taints", None)
        self.store.put(self.res["node"], node, "MODIFIED")

    def begin_shutdown(self, vmi):
        """virt-controller deletes the VMI: it is marked (deletionTimestamp)
        and virt-handler shuts its guest down (sync_vmis)."""
        s = self.store
        marked = copy.deepcopy(vmi)
        md = marked["metadata"]
        md["deletionTimestamp"] = now_rfc3339()
        md["deletionGracePeriodSeconds"] = 0
        s.put(self.res["vmi"], marked, "MODIFIED")
        s.shutdowns[md["uid"]] = time.monotonic()
        s.vm_event(md["namespace"] + "/" + md["name"], "shutdown_started")
        return marked

    def bind_claim(self, dv, ns, name):
        """--cdi-storage network|local: CDI's PVC for the DataVolume (owned
        by it) and the PersistentVolume a provisioner bound it to: a CSI
        volume any node reaches (network), or a `local` volume with node
        affinity to the main node, as local-path/LVM provisioners make
        (local). Without the flag neither exists, as before."""
        kind = self.store.args.cdi_storage
        if kind == "none":
            return
        s = self.store
        pvc_res, pv_res = RES_BY_KIND[("v1", "PersistentVolumeClaim")], RES_BY_KIND[("v1", "PersistentVolume")]
        owner = [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": name,
                  "uid": dv["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        size = (((dv.get("spec") or {}).get("storage") or {}).get("resources") or {}).get(
            "requests", {}).get("storage", "1Gi")
        pvc = s.make(pvc_res, {"metadata": {"name": name, "ownerReferences": owner},
                               "spec": {"accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": size}}}}, ns)
        pv_name = "pvc-" + pvc["metadata"]["uid"]
        pvc["spec"]["volumeName"] = pv_name
        pvc["status"] = {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}
        s.put(pvc_res, pvc, "ADDED")
        spec = {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": name,
                             "uid": pvc["metadata"]["uid"]}}
        if kind == "local":
            spec["local"] = {"path": "/var/lib/local-volumes/" + pv_name}
            spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [self.node_name]}]}]}}
        else:
            spec["csi"] = {"driver": "rbd.csi.ceph.com", "volumeHandle": pv_name}
        pv = s.make(pv_res, {"metadata": {"name": pv_name}, "spec": spec}, "")
        pv["status"] = {"phase": "Bound"}
        s.put(pv_res, pv, "ADDED")

    def sync_vms(self):
        s = self.store
        for vm in s_items(s, self.res["vm"]):
            md, spec = vm["metadata"], vm.get("spec") or {}
            ns = md["namespace"]
            strategy = run_strategy(spec)
            owner = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": md["name"],
                      "uid": md["uid"], "controller": True, "blockOwnerDeletion": True}]
            for tpl in spec.get("dataVolumeTemplates") or []:
                name = (tpl.get("metadata") or {}).get("name")
                if name and s.get(self.res["dv"], ns, name) is None:
                    dv = s.make(self.res["dv"], {"metadata": {"name": name, "ownerReferences": owner},
                                                 "spec": copy.deepcopy(tpl.get("spec") or {})}, ns)
                    dv["status"] = {"phase": "Succeeded", "progress": "100.0%", "claimName": name}
                    s.put(self.res["dv"], dv, "ADDED")
                    self.bind_claim(dv, ns, name)
            vmi = s.get(self.res["vmi"], ns, md["name"])
            phase = (vmi or {}).get("status", {}).get("phase")
            deleting = bool(vmi and vmi["metadata"].get("deletionTimestamp"))
            # The stop/start requests virt-api put in the status (restart,
            # and stop/start under Manual or RerunOnFailure), trimmed as
            # virt-controller's isTrimFirstChangeRequestNeeded does.
            requests = list((vm.get("status") or {}).get("stateChangeRequests") or [])
            if requests:
                first = requests[0]
                if first.get("action") == "Stop" and \
                        (vmi is None or first.get("uid") != vmi["metadata"]["uid"]):
                    requests.pop(0)
                elif first.get("action") == "Start" and vmi is not None and not deleting \
                        and phase not in FINAL_PHASES:
                    requests.pop(0)
            stop_asked = bool(requests) and requests[0].get("action") == "Stop"
            start_asked = bool(requests) and requests[0].get("action") == "Start"
            want = strategy in RUNNING_STRATEGIES or (strategy == "Manual" and start_asked)
            stop_expected = strategy == "Halted" or stop_asked
            if vmi is not None and deleting and phase in FINAL_PHASES:
                # Shut down: its last state is on the VM (Stopped), then the
                # controller's finalizer comes off and the VMI goes. A new
                # one, if wanted, is made on a later pass.
                s.drop(self.res["vmi"], vmi)
                vmi, want_now = None, False
            elif vmi is not None and not deleting and phase not in FINAL_PHASES and \
                    (stop_asked or (strategy != "Manual" and not want)):
                vmi = self.begin_shutdown(vmi)
                deleting, want_now = True, False
            else:
                want_now = want
            if want_now and vmi is None:
                tmpl = spec.get("template") or {}
                labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
                new = s.make(self.res["vmi"], {
                    "metadata": {"name": md["name"], "labels": labels, "ownerReferences": owner},
                    "spec": copy.deepcopy(tmpl.get("spec") or {})}, ns)
                new["status"] = {"phase": "Pending", "phaseTransitionTimestamps": [
                    {"phase": "Pending", "phaseTransitionTimestamp": now_rfc3339()}]}
                s.put(self.res["vmi"], new, "ADDED")
                vmi = new
            phase = (vmi or {}).get("status", {}).get("phase")
            unschedulable = any(c.get("reason") == "Unschedulable"
                                for c in (vmi or {}).get("status", {}).get("conditions") or [])
            # virt-controller's setPrintableStatus, first match wins.
            if md.get("deletionTimestamp"):
                printable = "Terminating"
            elif vmi is not None and phase not in FINAL_PHASES and (deleting or stop_expected):
                printable = "Stopping"
            elif phase == "Running":
                printable = "Running"
            elif unschedulable:
                printable = "ErrorUnschedulable"
            elif (vmi is not None and phase not in FINAL_PHASES) or (vmi is None and want):
                printable = "Starting"
            else:
                printable = "Stopped"
            status = {"printableStatus": printable, "ready": False, "runStrategy": strategy}
            if vmi is not None:
                status["created"] = True
                status["ready"] = phase == "Running" and not deleting
                if unschedulable:
                    status["conditions"] = [c for c in vmi["status"]["conditions"]
                                            if c.get("reason") == "Unschedulable"]
            if requests:
                status["stateChangeRequests"] = requests
            self.update_status(self.res["vm"], vm, status)

    def shutdown_delay(self, vmi):
        """How long the guest takes to power off: --vm-shutdown-seconds (its
        ACPI shutdown), cut to terminationGracePeriodSeconds (virt-launcher
        kills the domain then) and to a forced restart's 1 s."""
        delay = self.store.args.vm_shutdown_seconds
        grace = (vmi.get("spec") or {}).get("terminationGracePeriodSeconds")
        if isinstance(grace, (int, float)):
            delay = min(delay, grace)
        cap = self.store.shutdown_cap.get(vmi["metadata"]["uid"])
        return delay if cap is None else min(delay, cap)

    def pod_network(self, node_name):
        """The node's pod CIDR, where its VMIs' (launcher pods') IPs come from."""
        for extra in self.store.extra_nodes:
            if extra["name"] == node_name:
                return ipaddress.ip_network(extra["pod_cidr"], strict=False)
        return ipaddress.ip_network(self.store.args.pod_cidr, strict=False)

    def schedule(self, vmi, nodes, in_use):
        """kube-scheduler's filter step for the VMI's launcher pod: the first
        node (main, then --extra-node's in order) that is not cordoned (or
        whose taint the VMI tolerates) and has the free allocatable for each
        GPU it asks for. Returns (node name, None), or (None, the FitError
        message) when none fits. A cordoned node is refused by
        NodeUnschedulable, the first filter, before its resources count."""
        wants = gpu_requests(vmi.get("spec"))
        reasons, preemption = {}, {}
        for name in self.node_names:
            node = nodes[name]
            if bool((node.get("spec") or {}).get("unschedulable")) and \
                    not tolerates_unschedulable(vmi.get("spec")):
                reasons[name] = [REASON_UNSCHEDULABLE]
                preemption[name] = PREEMPTION_NOT_HELPFUL
                continue
            alloc = (node.get("status") or {}).get("allocatable") or {}
            used = in_use.get(name, {})
            short = [k for k, v in wants.items() if int(alloc.get(k, "0")) - used.get(k, 0) < v]
            if short:
                reasons[name] = ["Insufficient " + k for k in short]
                preemption[name] = PREEMPTION_NO_VICTIMS
                continue
            return name, None
        return None, fit_error(reasons, preemption)

    def sync_vmis(self):
        s = self.store
        nodes = {name: s.get(self.res["node"], "", name) or {} for name in self.node_names}
        in_use = {}  # node -> resource -> GPUs held by its Scheduled/Running VMIs
        for vmi in s_items(s, self.res["vmi"]):
            st = vmi.get("status") or {}
            if st.get("phase") in ("Scheduled", "Running"):
                used = in_use.setdefault(st.get("nodeName") or self.node_name, {})
                for k, v in gpu_requests(vmi.get("spec")).items():
                    used[k] = used.get(k, 0) + v
        for vmi in s_items(s, self.res["vmi"]):
            st = copy.deepcopy(vmi.get("status") or {})
            phase = st.get("phase", "Pending")
            if vmi["metadata"].get("deletionTimestamp"):
                if phase in FINAL_PHASES:
                    continue  # sync_vms takes it away
                if phase != "Running":
                    # No guest yet: its launcher pod goes, and virt-controller
                    # fails a VMI whose pod went before it ran.
                    st["phase"] = "Failed"
                    st.pop("conditions", None)
                else:
                    # The launcher pod is going down: not Ready while the
                    # guest shuts down; then virt-handler reports Succeeded.
                    st["conditions"] = [{"type": "Ready", "status": "False"}]
                    began = s.shutdowns.setdefault(vmi["metadata"]["uid"], time.monotonic())
                    if time.monotonic() - began >= self.shutdown_delay(vmi):
                        st["phase"] = "Succeeded"
                note_phase_transition(st, phase)
                self.update_status(self.res["vmi"], vmi, st)
                continue
            if phase == "Pending":
                st["phase"] = "Scheduling"
            elif phase == "Scheduling":
                chosen, msg = self.schedule(vmi, nodes, in_use)
                if chosen is None:
                    st["conditions"] = [{"type": "PodScheduled", "status": "False",
                                         "reason": "Unschedulable", "message": msg}]
                else:
                    used = in_use.setdefault(chosen, {})
                    for k, v in gpu_requests(vmi.get("spec")).items():
                        used[k] = used.get(k, 0) + v
                    st["phase"] = "Scheduled"
                    st["nodeName"] = chosen
                    st.pop("conditions", None)
            elif phase == "Scheduled":
                # The launcher pod's IP, from its node's pod CIDR (the
                # counter runs over all nodes: 10.42.0.98, then .99, ...).
                net = self.pod_network(st.get("nodeName") or self.node_name)
                ip = str(net[1 + (s.next_ip - 1) % (net.num_addresses - 2)]
                         if net.num_addresses > 2 else net[0])
                s.next_ip += 1
                st["phase"] = "Running"
                st["interfaces"] = [{"name": "default", "interfaceName": "eth0",
                                     "ipAddress": ip, "ipAddresses": [ip],
                                     "mac": "02:00:00:%02x:%02x:%02x" % (s.next_ip % 256, 0, 1),
                                     "infoSource": "domain, guest-agent"}]
                st["conditions"] = [{"type": "Ready", "status": "True"}]
                s.vm_event(vmi["metadata"]["namespace"] + "/" + vmi["metadata"]["name"], "started")
            note_phase_transition(st, phase)
            self.update_status(self.res["vmi"], vmi, st)


def note_phase_transition(st, before):
    """virt-controller's updateStatus: each phase the VMI enters is appended
    to status.phaseTransitionTimestamps with the time it entered it
    ({"phase", "phaseTransitionTimestamp"}, metav1.Time at seconds)."""
    if st.get("phase") != before:
        st.setdefault("phaseTransitionTimestamps", []).append(
            {"phase": st.get("phase"), "phaseTransitionTimestamp": now_rfc3339()})


def fit_error(node_reasons, node_preemption):
    """kube-scheduler's FitError text (pkg/scheduler/framework/types.go),
    with DefaultPreemption's PostFilter message after it: "0/N nodes are
    available: " and the histogram of every node's filter reasons, each
    "<count> <reason>", sorted as strings (sort.Strings) and joined by ", ",
    then "." and " preemption: " with the same over the preemption verdicts.
    node_reasons: node -> its filter reasons; node_preemption: node -> the
    preemption verdict."""
    def histogram(per_node):
        counts = {}
        for reasons in per_node:
            for r in reasons:
                counts[r] = counts.get(r, 0) + 1
        return ", ".join(sorted("%d %s" % (n, r) for r, n in counts.items()))
    n = len(node_reasons)
    return "0/%d nodes are available: %s. preemption: 0/%d nodes are available: %s." % (
        n, histogram(node_reasons.values()), n,
        histogram([v] for v in node_preemption.values()))


def tolerates_unschedulable(vmi_spec):
    """Whether the VMI's tolerations (copied to its launcher pod) tolerate
    node.kubernetes.io/unschedulable:NoSchedule, as the NodeUnschedulable
    filter asks (v1helper.TolerationsTolerateTaint)."""
    for t in (vmi_spec or {}).get("tolerations") or []:
        if t.get("effect") not in (None, "", "NoSchedule"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key") and op == "Exists":
            return True
        if t.get("key") == UNSCHEDULABLE_TAINT and (op == "Exists" or not t.get("value")):
            return True
    return False


def s_items(store, res):
    return list(store.items(res))


# ---------------------------------------------------------------- HTTP

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"

    def log_message(self, fmt, *args):
        if self.server.args.verbose:
            sys.stderr.write("kube_apiserver: " + (fmt % args) + "\n")

    # --- plumbing

    @property
    def store(self):
        return self.server.store

    def send_json(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_error_status(self, e):
        self.send_json(e.code, status_doc(e.code, e.reason, e.message, e.details))

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def user(self):
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and auth[7:].strip() in self.server.tokens:
            return "token-user"
        if isinstance(self.connection, ssl.SSLSocket):
            cert = self.connection.getpeercert()
            if cert:
                for rdn in cert.get("subject", ()):
                    for k, v in rdn:
                        if k == "commonName":
                            return v
        if self.server.args.anonymous:
            return "system:anonymous"
        return None

    def handle_any(self):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
        body = self.read_body()
        try:
            if u.path.startswith("/_fake/"):
                return self.control(u.path, body)
            user = self.user()
            with self.store.cond:
                self.store.requests.append({
                    "time": time.time(), "method": self.command, "path": self.path,
                    "user": user, "contentType": self.headers.get("Content-Type", "")})
                self.store.requests = self.store.requests[-2000:]
            if user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if u.path == "/version":
                return self.send_json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake",
                                            "platform": "linux/amd64"})
            if u.path in ("/healthz", "/readyz", "/livez"):
                return self.send_json(200, "ok")
            m = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$", u.path)
            if m and self.command == "GET":
                return self.pod_log(user, m.group(1), m.group(2), q)
            m = re.match(r"^/apis/subresources\.kubevirt\.io/(v1|v1alpha3)/namespaces/([^/]+)/"
                         r"virtualmachines/([^/]+)/(start|stop|restart)$", u.path)
            if m and not {"kubevirt.io", "subresources.kubevirt.io"} & set(self.server.args.no_group):
                return self.vm_subresource(user, m.group(2), m.group(3), m.group(4), body)
            res, ns, name = self.route(u.path)
            verb = self.verb(name, q)
            self.authorize(user, verb, res, ns, name)
            if verb == "watch":
                return self.watch(res, ns, q)
            handler = {"get": self.do_get_one, "list": self.do_list, "create": self.do_create,
                       "update": self.do_update, "patch": self.do_patch, "delete": self.do_delete}
            if verb not in handler:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
            code, doc = handler[verb](res, ns, name, q, body)
            self.send_json(code, doc)
        except ApiError as e:
            self.send_error_status(e)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

    def route(self, path):
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        elif len(rest) == 2 and rest[0] == "namespaces":
            rest = ["namespaces", rest[1]]
        self.subresource = ""
        if len(rest) == 3 and rest[2] == "status":
            self.subresource, rest = "status", rest[:2]
        if not rest or len(rest) > 2:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        res = RES_BY_PATH.get((group, version, rest[0]))
        if res is None or (ns and not res.namespaced) or group in self.server.args.no_group or \
                (self.subresource and res.kind not in STATUS_SUBRESOURCE):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res, ns, rest[1] if len(rest) == 2 else ""

    def verb(self, name, q):
        m = self.command
        if m == "GET":
            if q.get("watch") in ("1", "true"):
                return "watch"
            return "get" if name else "list"
        if m == "POST" and not name:
            return "create"
        if m == "PUT" and name:
            return "update"
        if m == "PATCH" and name:
            return "patch"
        if m == "DELETE" and name:
            return "delete"
        return "unsupported"

    def authorize(self, user, verb, res, ns, name, subresource=""):
        # RBAC names a subresource "<plural>/<subresource>" (virtualmachines/stop).
        resource = res.plural + "/" + subresource if subresource else res.plural
        qualified = resource + "." + res.group if res.group else resource
        for v, r, n in self.store.forbidden:
            if v in (verb, "*") and r in (resource, qualified, "*") and n in (ns, "*", ""):
                where = ' in the namespace "%s"' % ns if ns else ""
                what = ('%s "%s"' % (res.qualified, name)) if name else res.qualified
                group = res.group
                raise ApiError(403, "Forbidden",
                               '%s is forbidden: User "%s" cannot %s resource "%s" in API group "%s"%s'
                               % (what, user, verb, resource, group, where if res.namespaced else " at the cluster scope"),
                               {"name": name, "group": res.group, "kind": res.plural})

    # --- KubeVirt's virt-api (subresources.kubevirt.io), behind the aggregator

    def vm_subresource(self, user, ns, name, action, body):
        """PUT .../virtualmachines/NAME/{start,stop,restart} as virt-api's
        Start/Stop/RestartVMRequestHandler (pkg/virt-api/rest/lifecycle.go)
        answer them: 202 with no body, or a Status. The API server
        authorizes "update" on virtualmachines/<action> first."""
        if self.command != "PUT":
            raise ApiError(405, "MethodNotAllowed",
                           "the server does not allow this method on the requested resource")
        self.authorize(user, "update", SUBRESOURCE_VMS, ns, name, action)
        s = self.store
        vm_res, vmi_res = RES_BY_KIND[("kubevirt.io/v1", "VirtualMachine")], \
            RES_BY_KIND[("kubevirt.io/v1", "VirtualMachineInstance")]

        def options():
            # decodeBody: a YAML-or-JSON StopOptions / StartOptions / RestartOptions.
            try:
                doc = yaml.safe_load(body.decode()) if body.strip() else None
            except (ValueError, yaml.YAMLError) as e:
                raise ApiError(400, "BadRequest",
                               "Can not unmarshal Request body to struct, error: %s" % e)
            if doc is None:
                return {}
            if not isinstance(doc, dict):
                raise ApiError(400, "BadRequest", "Can not unmarshal Request body to struct, "
                               "error: cannot unmarshal %s into a struct" % type(doc).__name__)
            return doc

        def fetch_vm():
            vm = s.get(vm_res, ns, name)
            if vm is None:
                raise vm_not_found(name)
            spec = vm.get("spec") or {}
            if "running" in spec and "runStrategy" in spec:
                raise internal_error("running and runstrategy are mutually exclusive")
            return vm

        def set_running(vm, running, q):
            # getRunningPatch: runStrategy where the VM has one, else spec.running.
            new = copy.deepcopy(vm)
            if "runStrategy" in new["spec"]:
                new["spec"]["runStrategy"] = "Always" if running else "Halted"
            else:
                new["spec"]["running"] = running
            self.subresource = ""
            self.finish_write(vm_res, new, vm, q, "MODIFIED")

        def change_requests(vm, changes, q):
            # getChangeRequestJson: the VM's status.stateChangeRequests, which
            # virt-controller acts on (sync_vms); a lone Stop replaces any.
            have = (vm.get("status") or {}).get("stateChangeRequests") or []
            if have and not (len(changes) == 1 and changes[0]["action"] == "Stop"):
                raise internal_error("unable to complete request: stop/start already underway")
            if q.get("dryRun") == "All":
                return
            new = copy.deepcopy(vm)
            new.setdefault("status", {})["stateChangeRequests"] = changes
            new["status"].pop("startFailure", None)
            s.put(vm_res, new, "MODIFIED")

        def final(vmi):
            return (vmi.get("status") or {}).get("phase") in FINAL_PHASES

        who = ns + "/" + name
        with s.cond:
            if action == "start":
                vm = fetch_vm()
                vmi = s.get(vmi_res, ns, name)
                if vmi is not None and not final(vmi) and \
                        (vmi.get("status") or {}).get("phase") not in ("Unknown", "", None):
                    raise vm_conflict(name, "VM is already running")
                opts = options()
                q = {"dryRun": "All"} if "All" in (opts.get("dryRun") or []) else {}
                strategy = run_strategy(vm.get("spec"))
                if strategy == "Halted":
                    set_running(vm, True, q)
                elif strategy in ("RerunOnFailure", "Manual"):
                    if strategy == "RerunOnFailure" and vmi is not None and \
                            vmi["status"].get("phase") == "Failed":
                        raise vm_conflict(name, "RerunOnFailure does not support starting VM "
                                          "from failed state")
                    changes = [{"action": "Start"}]
                    if vmi is not None and final(vmi):
                        changes.insert(0, {"action": "Stop", "uid": vmi["metadata"]["uid"]})
                    change_requests(vm, changes, q)
                    if not q:
                        s.vm_event(who, "start_requested")
                else:  # Always, Once
                    raise vm_conflict(name, "%s does not support manual start requests" % strategy)
            elif action == "stop":
                opts = options()
                q = {"dryRun": "All"} if "All" in (opts.get("dryRun") or []) else {}
                vm = fetch_vm()
                strategy = run_strategy(vm.get("spec"))
                vmi = s.get(vmi_res, ns, name)
                grace = opts.get("gracePeriod")
                old_grace = None
                if vmi is not None and not final(vmi) and grace is not None:
                    # The VMI's grace period first, as virt-api patches it
                    # (virt-handler then kills the guest that much sooner).
                    old_grace = (vmi.get("spec") or {}).get("terminationGracePeriodSeconds")
                    patched = copy.deepcopy(vmi)
                    patched.setdefault("spec", {})["terminationGracePeriodSeconds"] = grace
                    self.subresource = ""
                    self.finish_write(vmi_res, patched, vmi, q, "MODIFIED")
                if strategy == "Halted":
                    if vmi is None or final(vmi):
                        raise vm_conflict(name, "VM is not running")
                    if grace is None or (old_grace is not None and grace >= old_grace):
                        raise vm_conflict(name, "Halted only supports manual stop requests with "
                                          "a shorter graceperiod")
                    change_requests(vm, [{"action": "Stop", "uid": vmi["metadata"]["uid"]}], q)
                elif strategy in ("RerunOnFailure", "Manual"):
                    if vmi is None or final(vmi):
                        raise vm_conflict(name, "VM is not running")
                    change_requests(vm, [{"action": "Stop", "uid": vmi["metadata"]["uid"]}], q)
                    if not q:
                        s.vm_event(who, "stop_requested")
                else:  # Always, Once: runStrategy Halted (logged by the write)
                    set_running(vm, False, q)
            else:  # restart
                opts = options()
                q = {"dryRun": "All"} if "All" in (opts.get("dryRun") or []) else {}
                force = opts.get("gracePeriodSeconds")
                if force is not None and force > 0:
                    raise ApiError(400, "BadRequest",
                                   "For force restart, only gracePeriod=0 is supported for now")
                if force is not None and force < 0:
                    raise ApiError(400, "BadRequest", "gracePeriod has to be greater or equal to 0")
                vm = fetch_vm()
                strategy = run_strategy(vm.get("spec"))
                if strategy in ("Halted", "Once"):
                    raise vm_conflict(name, "RunStategy %s does not support manual restart "
                                      "requests" % strategy)
                vmi = s.get(vmi_res, ns, name)
                if vmi is None:
                    raise vm_conflict(name, "VM is not running: Halted")
                change_requests(vm, [{"action": "Stop", "uid": vmi["metadata"]["uid"]},
                                     {"action": "Start"}], q)
                if not q:
                    s.vm_event(who, "restart_requested")
                    if force == 0:
                        # virt-api deletes the launcher pod with a 1 s grace period.
                        s.shutdown_cap[vmi["metadata"]["uid"]] = 1.0
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def pod_log(self, user, ns, name, q):
        res = RES_BY_KIND[("v1", "Pod")]
        self.authorize(user, "get", Resource("", "v1", "Pod", "pods/log", True), ns, name)
        op = self.server.operator
        with self.store.cond:
            pod = self.store.get(res, ns, name)
            if pod is None:
                raise not_found(res, name)
            containers = [c["name"] for c in (pod.get("spec") or {}).get("initContainers") or []] + \
                [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
            container = q.get("container") or (containers[-1] if len(containers) == 1 else "")
            if not container:
                raise ApiError(400, "BadRequest", "a container name must be specified for pod %s, "
                               "choose one of: %s" % (name, containers))
            if container not in containers:
                raise ApiError(400, "BadRequest", "container %s is not valid for pod %s"
                               % (container, name))
            previous = q.get("previous") in ("true", "1")
            text = op.log(name, container, previous) if op else None
            if text is None:
                if previous:
                    raise ApiError(400, "BadRequest", 'previous terminated container "%s" in pod '
                                   '"%s" not found' % (container, name))
                text = ""
        lines = text.splitlines(True)
        if q.get("tailLines"):
            lines = lines[-int(q["tailLines"]):]
        body = "".join(lines).encode()
        if q.get("limitBytes"):
            body = body[:int(q["limitBytes"])]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # --- verbs

    def require_namespace(self, res, ns):
        if res.namespaced and ns and self.store.get(RES_BY_KIND[("v1", "Namespace")], "", ns) is None:
            raise ApiError(404, "NotFound", 'namespaces "%s" not found' % ns,
                           {"name": ns, "kind": "namespaces"})

    def do_get_one(self, res, ns, name, q, body):
        with self.store.cond:
            obj = self.store.get(res, ns, name)
            if obj is None:
                raise not_found(res, name)
            return 200, obj

    def _list(self, res, ns, q):
        terms = parse_label_selector(q.get("labelSelector"))
        with self.store.cond:
            items = [copy.deepcopy(o) for o in self.store.items(res, ns)
                     if labels_match(terms, o) and fields_match(q.get("fieldSelector"), o)]
            rv = str(self.store.rv)
        if not res.group:
            # The API server leaves kind/apiVersion off the items of built-in lists.
            for o in items:
                o.pop("kind", None)
                o.pop("apiVersion", None)
        return 200, {"kind": res.kind + "List", "apiVersion": res.api_version,
                     "metadata": {"resourceVersion": rv}, "items": items}

    def do_list(self, res, ns, name, q, body):
        return self._list(res, ns, q)

    def parse_object(self, body, content_type):
        try:
            if "yaml" in content_type:
                obj = yaml.safe_load(body.decode())
            else:
                obj = json.loads(body.decode() or "null")
        except (ValueError, yaml.YAMLError) as e:
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format: %s" % e)
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        return obj

    def check_identity(self, res, ns, name, obj):
        if obj.get("apiVersion") != res.api_version or obj.get("kind") != res.kind:
            raise ApiError(400, "BadRequest", "the API version in the data (%s) does not match the "
                           "expected API version (%s)" % (obj.get("apiVersion"), res.api_version)
                           if obj.get("apiVersion") != res.api_version else
                           "the kind in the data (%s) does not match the expected kind (%s)"
                           % (obj.get("kind"), res.kind))
        md = obj.get("metadata") or {}
        if res.namespaced and md.get("namespace") and md["namespace"] != ns:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                           "the namespace sent on the request")
        if name and md.get("name") and md["name"] != name:
            raise ApiError(400, "BadRequest", "the name of the object (%s) does not match the name "
                           "on the URL (%s)" % (md["name"], name))

    def finish_write(self, res, obj, old, q, type_):
        """Validation, controller-owned fields, storage (unless dryRun)."""
        status_write = getattr(self, "subresource", "") == "status"
        if res.kind in CONTROLLER_STATUS:
            if old is not None and "status" in old:
                obj["status"] = copy.deepcopy(old["status"])
            elif old is None:
                obj.pop("status", None)
        elif res.kind in STATUS_SUBRESOURCE and not status_write:
            if old is not None and "status" in old:
                obj["status"] = copy.deepcopy(old["status"])
            else:
                obj.pop("status", None)
        if status_write:
            if old is None:
                raise not_found(res, obj["metadata"].get("name", ""))
            # Only the status changes: the rest is the live object's.
            status = obj.get("status")
            obj = copy.deepcopy(old)
            if status is None:
                obj.pop("status", None)
            else:
                obj["status"] = status
        if old is not None:
            self.check_finalizers(res, obj, old)
        validate_or_422(res, obj)
        if res.kind == "Secret":
            # stringData is write-only: the API server folds it into data.
            string_data = obj.pop("stringData", None) or {}
            if string_data:
                data = obj.setdefault("data", {})
                for k, v in string_data.items():
                    data[k] = base64.b64encode(v.encode()).decode()
            obj.setdefault("type", "Opaque")
        if res.kind == "Service":
            check_service(self.store, obj, old)
        if old is not None and res.group and old.get("spec") != obj.get("spec"):
            obj["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if q.get("dryRun") == "All":
            obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"] if old else ""
            return obj
        self.store.put(res, obj, type_)
        md = obj["metadata"]
        if md.get("deletionTimestamp") and not md.get("finalizers") and old is not None \
                and old["metadata"].get("finalizers"):
            # The last finalizer is gone: the deletion that waited for it happens now.
            self.store.drop(res, obj)
            return obj
        if res.kind == "Service":
            reserve_node_ports(self.store, obj)
        if res.kind == "KubeVirt":
            self.store.plugin_due = time.monotonic() + self.server.args.device_plugin_delay
        return obj

    def check_finalizers(self, res, obj, old):
        """deletionTimestamp is the server's; an object being deleted may lose
        finalizers but not gain one (the API server's rule)."""
        md, omd = obj["metadata"], old["metadata"]
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if k in omd:
                md[k] = omd[k]
            else:
                md.pop(k, None)
        if omd.get("deletionTimestamp"):
            added = set(md.get("finalizers") or []) - set(omd.get("finalizers") or [])
            if added:
                raise ApiError(422, "Invalid", '%s "%s" is invalid: metadata.finalizers: Forbidden: '
                               'no new finalizers can be added if the object is being deleted, found '
                               'new finalizers %s' % (res.kind_qualified, md["name"], json.dumps(sorted(added))))

    def do_create(self, res, ns, name, q, body):
        obj = self.parse_object(body, self.headers.get("Content-Type", ""))
        self.check_identity(res, ns, "", obj)
        with self.store.cond:
            self.require_namespace(res, ns)
            md = obj.get("metadata") or {}
            if md.get("name") and self.store.get(res, ns, md["name"]) is not None:
                raise ApiError(409, "AlreadyExists", '%s "%s" already exists' % (res.qualified, md["name"]),
                               {"name": md["name"], "group": res.group, "kind": res.plural})
            for k in ("resourceVersion",):
                if md.get(k):
                    raise ApiError(400, "BadRequest", "resourceVersion should not be set on objects to be created")
            new = self.store.make(res, obj, ns)
            if res.kind == "Namespace":
                new["status"] = {"phase": "Active"}
                new.setdefault("spec", {"finalizers": ["kubernetes"]})
            return 201, self.finish_write(res, new, None, q, "ADDED")

    def conflict(self, res, name):
        return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": the object has been '
                        'modified; please apply your changes to the latest version and try again'
                        % (res.qualified, name), {"name": name, "group": res.group, "kind": res.plural})

    def do_update(self, res, ns, name, q, body):
        obj = self.parse_object(body, self.headers.get("Content-Type", ""))
        self.check_identity(res, ns, name, obj)
        with self.store.cond:
            old = self.store.get(res, ns, name)
            if old is None:
                raise not_found(res, name)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if not rv and res.group:
                raise ApiError(422, "Invalid", '%s "%s" is invalid: metadata.resourceVersion: Invalid '
                               'value: 0x0: must be specified for an update' % (res.kind_qualified, name))
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise self.conflict(res, name)
            new = copy.deepcopy(obj)
            new["metadata"] = dict(new.get("metadata") or {})
            for k in ("uid", "creationTimestamp", "generation"):
                if k in old["metadata"]:
                    new["metadata"][k] = old["metadata"][k]
            new["metadata"]["namespace"] = old["metadata"].get("namespace")
            if not res.namespaced:
                new["metadata"].pop("namespace", None)
            return 200, self.finish_write(res, new, old, q, "MODIFIED")

    def do_patch(self, res, ns, name, q, body):
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        with self.store.cond:
            old = self.store.get(res, ns, name)
            if ctype == "application/apply-patch+yaml":
                if not q.get("fieldManager"):
                    raise ApiError(400, "BadRequest", "PATCH, fieldManager is required for apply requests")
                applied = self.parse_object(body, "yaml")
                self.check_identity(res, ns, name, applied)
                if not (applied.get("metadata") or {}).get("name"):
                    raise ApiError(400, "BadRequest", "metadata.name is required for apply requests")
                if old is None:
                    self.require_namespace(res, ns)
                    new = self.store.make(res, applied, ns)
                    return 201, self.finish_write(res, new, None, q, "ADDED")
                new = apply_merge(old, applied)
                new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                return 200, self.finish_write(res, new, old, q, "MODIFIED")
            if ctype == "application/strategic-merge-patch+json" and res.group not in BUILTIN_GROUPS:
                # Custom resources take no strategic merge patch.
                raise ApiError(415, "UnsupportedMediaType",
                               "the body of the request was in an unknown format - accepted media "
                               "types include: application/json-patch+json, "
                               "application/merge-patch+json, application/apply-patch+yaml")
            if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if old is None:
                    raise not_found(res, name)
                patch = self.parse_object(body, "json")
                if ctype.startswith("application/strategic") and not smp_is_merge_patch(patch):
                    # Where a strategic merge patch means what a merge patch
                    # means (maps only: `kubectl cordon`'s {"spec":
                    # {"unschedulable": true}}) the fake takes it.
                    raise ApiError(415, "UnsupportedMediaType",
                                   "the fake API server takes a strategic merge patch only where "
                                   "it is a JSON merge patch (no lists, no $ directives)")
                prv = (patch.get("metadata") or {}).get("resourceVersion")
                if prv and prv != old["metadata"]["resourceVersion"]:
                    raise self.conflict(res, name)
                new = merge_patch(old, patch)
                for k in ("uid", "creationTimestamp", "name", "namespace"):
                    if k in old["metadata"]:
                        new["metadata"][k] = old["metadata"][k]
                self.check_identity(res, ns, name, new)
                return 200, self.finish_write(res, new, old, q, "MODIFIED")
            raise ApiError(415, "UnsupportedMediaType",
                           "the fake API server does not support patch type %s" % ctype)

    def do_delete(self, res, ns, name, q, body):
        opts = {}
        if body:
            try:
                opts = json.loads(body.decode())
            except ValueError:
                raise ApiError(400, "BadRequest", "DeleteOptions are not valid JSON")
        propagation = q.get("propagationPolicy") or opts.get("propagationPolicy") or "Background"
        with self.store.cond:
            old = self.store.get(res, ns, name)
            if old is None:
                raise not_found(res, name)
            if self.subresource:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
            if (old["metadata"].get("finalizers")) and q.get("dryRun") != "All":
                # Finalizers hold the object: it is marked, and goes when the
                # last one is removed (finish_write).
                if not old["metadata"].get("deletionTimestamp"):
                    marked = copy.deepcopy(old)
                    marked["metadata"]["deletionTimestamp"] = now_rfc3339()
                    marked["metadata"]["deletionGracePeriodSeconds"] = 0
                    self.store.put(res, marked, "MODIFIED")
                    return 200, marked
                return 200, old
            if q.get("dryRun") != "All":
                self.store.drop(res, old, propagation)
            return 200, old

    # --- watch

    def watch(self, res, ns, q):
        s = self.store
        terms = parse_label_selector(q.get("labelSelector"))
        fsel = q.get("fieldSelector")
        timeout = float(q.get("timeoutSeconds") or 1800)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        rv = q.get("resourceVersion", "")
        deadline = time.monotonic() + timeout
        drop_after = self.server.args.drop_watch_after
        def start():
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def chunk(doc):
            data = json.dumps(doc).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def matches(o):
            if res.namespaced and ns and o["metadata"].get("namespace") != ns:
                return False
            return labels_match(terms, o) and fields_match(fsel, o)

        with s.cond:
            # A client that reconnects while the test holds watches waits
            # here, as behind a slow API server, so what the test does
            # meanwhile happens while it is away.
            while s.hold_watches:
                s.cond.wait(0.1)
            gen = s.drop_generation
            if rv not in ("", "0") and int(rv) < s.compacted:
                msg = "too old resource version: %s (%d)" % (rv, s.compacted)
                if s.gone_style == "http":
                    # Some servers refuse the request itself instead.
                    return self.send_json(410, status_doc(410, "Expired", msg))
                start()
                chunk({"type": "ERROR", "object": status_doc(410, "Expired", msg)})
                self.wfile.write(b"0\r\n\r\n")
                return
            if rv in ("", "0"):
                initial = [copy.deepcopy(o) for o in s.items(res, ns) if matches(o)]
                pos = s.rv
            else:
                initial, pos = [], int(rv)
        start()
        sent = 0
        try:
            for o in initial:
                chunk({"type": "ADDED", "object": o})
                sent += 1
            last_bookmark = time.monotonic()
            while True:
                with s.cond:
                    events = [(r, t, o) for (r, t, er, o) in s.history
                              if r > pos and er.plural == res.plural and matches(o)]
                    if not events:
                        wait = min(deadline - time.monotonic(), self.server.args.bookmark_interval, 0.25)
                        if wait > 0:
                            s.cond.wait(wait)
                        events = [(r, t, o) for (r, t, er, o) in s.history
                                  if r > pos and er.plural == res.plural and matches(o)]
                    head = s.rv
                    dropped = s.drop_generation != gen
                if dropped:
                    return self.abort()
                for r, t, o in events:
                    chunk({"type": t, "object": o})
                    pos = r
                    sent += 1
                    if drop_after and sent >= drop_after:
                        return self.abort()
                if not events:
                    pos = max(pos, head)
                if bookmarks and time.monotonic() - last_bookmark >= self.server.args.bookmark_interval:
                    chunk({"type": "BOOKMARK", "object": {
                        "kind": res.kind, "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": str(pos)}}})
                    last_bookmark = time.monotonic()
                if time.monotonic() >= deadline:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True

    def abort(self):
        """Cut the stream: no terminating chunk, no TLS close_notify."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # --- test control

    def control(self, path, body):
        s = self.store
        doc = json.loads(body.decode() or "{}") if body else {}
        with s.cond:
            if path == "/_fake/compact":
                s.compacted = s.rv
                s.history = []
            elif path == "/_fake/drop-watches":
                s.drop_generation += 1
                s.cond.notify_all()
            elif path == "/_fake/forbid" and self.command == "POST":
                s.forbidden.append((doc["verb"], doc["resource"], doc.get("namespace", "*")))
            elif path == "/_fake/forbid" and self.command == "DELETE":
                s.forbidden = []
            elif path == "/_fake/vfio":
                s.vfio = {k.upper(): int(v) for k, v in doc.items()}
                s.vfio_capacity = dict(s.vfio)
                s.vfio_from_tree = False
                s.plugin_due = time.monotonic() + self.server.args.device_plugin_delay
            elif path == "/_fake/hold-watches":
                s.hold_watches = bool(doc.get("hold", True))
                s.cond.notify_all()
            elif path == "/_fake/gpu-operator":
                if self.server.operator is None:
                    return self.send_json(404, {"error": "no --gpu-operator"})
                self.server.operator.control(doc)
            elif path == "/_fake/gone":
                s.gone_style = doc.get("style", "event")
            elif path == "/_fake/requests":
                return self.send_json(200, {"requests": list(s.requests)})
            elif path == "/_fake/vm-log":
                return self.send_json(200, {"entries": list(s.vm_log)})
            else:
                return self.send_json(404, {"error": "no such control endpoint"})
            rv = s.rv
        self.send_json(200, {"ok": True, "resourceVersion": str(rv)})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, family, ctx, store, args, tokens):
        self.address_family = family
        self.ssl_context, self.store, self.args, self.tokens = ctx, store, args, tokens
        self.operator = None
        super().__init__(addr, Handler)

    def finish_request(self, request, client_address):
        # The TLS handshake runs in the connection's own thread.
        try:
            request = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            if self.args.verbose:
                sys.stderr.write("kube_apiserver: TLS handshake failed: %s\n" % e)
            return
        super().finish_request(request, client_address)


# ---------------------------------------------------------------- start-up

def seed(store, args, operator=None):
    def add(obj):
        res = RES_BY_KIND[(obj["apiVersion"], obj["kind"])]
        ns = (obj.get("metadata") or {}).get("namespace", "")
        new = store.make(res, obj, ns)
        if "status" in obj:
            new["status"] = obj["status"]
        errors = k8s_schema.validate(new)
        if errors:
            sys.exit("kube_apiserver: seed object %s/%s is invalid: %s" %
                     (obj["kind"], obj["metadata"].get("name"), "; ".join(errors)))
        store.put(res, new, "ADDED")

    for ns in ("default", "kube-system", "kubevirt"):
        add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
             "status": {"phase": "Active"}})
    svc_net = ipaddress.ip_network(args.service_cidr, strict=False)

    def node(name, pod_cidr, ip):
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubevirt.io/schedulable": "true"}},
                "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
                "status": {"addresses": [{"type": "InternalIP", "address": ip},
                                         {"type": "Hostname", "address": name}],
                           "capacity": {"cpu": "64", "memory": "263842456Ki", "pods": "110",
                                        "devices.kubevirt.io/kvm": "1k"},
                           "allocatable": {"cpu": "64", "memory": "263740056Ki", "pods": "110",
                                           "devices.kubevirt.io/kvm": "1k"},
                           "conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status"}]}}
    add(node(args.node_name, args.pod_cidr, args.node_ip))
    for extra in store.extra_nodes:
        add(node(extra["name"], extra["pod_cidr"], extra["ip"]))
    add({"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kubernetes", "namespace": "default",
                      "labels": {"component": "apiserver", "provider": "kubernetes"}},
         "spec": {"type": "ClusterIP", "clusterIP": str(svc_net[1]),
                  "clusterIPs": [str(svc_net[1])],
                  "ports": [{"name": "https", "port": 443, "protocol": "TCP",
                             "targetPort": 6443}]}})
    dns_ns, _, dns_name = args.dns_service.partition("/")
    add({"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": dns_name, "namespace": dns_ns,
                      "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
         "spec": {"type": "ClusterIP", "clusterIP": str(svc_net[10]),
                  "clusterIPs": [str(svc_net[10])],
                  "selector": {"k8s-app": "kube-dns"},
                  "ports": [{"name": "udp-53", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "tcp-53", "port": 53, "protocol": "TCP",
                             "targetPort": 53}]}})
    if not args.no_kubevirt_cr:
        # The runbook's CR before any allowlist (kubevirt/kubevirt-cr.yaml).
        add({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
             "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
             "spec": {"configuration": {"imagePullPolicy": "IfNotPresent"},
                      "imagePullPolicy": "IfNotPresent"},
             "status": {"phase": "Deployed", "observedKubeVirtVersion": "v1.9.0"}})
    if operator is not None:
        operator.seed_objects(add)
    for path in args.seed or []:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if not doc:
                    continue
                res = RES_BY_KIND[(doc["apiVersion"], doc["kind"])]
                ns = (doc.get("metadata") or {}).get("namespace", "")
                old = store.get(res, ns, doc["metadata"]["name"])
                if old is not None:
                    store.drop(res, old, "Orphan")
                add(doc)


def write_pki(directory, port):
    os.makedirs(directory, exist_ok=True)
    ca = testpki.make_ca(directory, "ca", "fake-kubernetes-ca")
    server = testpki.make_cert(directory, "apiserver", ca, "kube-apiserver",
                               ["IP:127.0.0.1", "IP:::1", "DNS:localhost",
                                "DNS:kubernetes.default.svc"])
    testpki.make_cert(directory, "admin", ca, "admin", client=True, org="system:masters")
    token = secrets.token_urlsafe(24)
    token_path = os.path.join(directory, "token")
    with open(os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(token + "\n")
    return ca, server, token


def write_kubeconfig(directory, url):
    def b64(name):
        with open(os.path.join(directory, name), "rb") as f:
            return base64.b64encode(f.read()).decode()
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
           "clusters": [{"name": "fake", "cluster": {"server": url,
                                                     "certificate-authority-data": b64("ca.crt")}}],
           "users": [{"name": "admin", "user": {"client-certificate-data": b64("admin.crt"),
                                                "client-key-data": b64("admin.key")}}],
           "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "admin"}}]}
    path = os.path.join(directory, "kubeconfig")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        yaml.safe_dump(cfg, f)


def parse_vfio(specs):
    inv = {}
    for spec in specs or []:
        for part in spec.split(","):
            k, _, v = part.partition("=")
            inv[k.strip().upper()] = int(v or "1")
    return inv


def parse_extra_nodes(specs, args):
    """--extra-node NAME=VENDOR:DEVICE=COUNT[,VENDOR:DEVICE=COUNT...], in
    order: the i-th gets the i-th pod CIDR slice after --pod-cidr's (of its
    size: 10.42.1.0/24, 10.42.2.0/24 after 10.42.0.0/24, as RKE2's node IPAM
    hands them out) and the i-th InternalIP after --node-ip. Raises
    ValueError for a spec it cannot read."""
    out = []
    main_net = ipaddress.ip_network(args.pod_cidr, strict=False)
    main_ip = ipaddress.ip_address(args.node_ip)
    names = {args.node_name}
    for i, spec in enumerate(specs or [], start=1):
        name, eq, cards = spec.partition("=")
        name = name.strip()
        if not eq or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name):
            raise ValueError("--extra-node %r: want NAME=VENDOR:DEVICE=COUNT[,...]" % spec)
        if name in names:
            raise ValueError("--extra-node %r: there is already a node %s" % (spec, name))
        names.add(name)
        inventory = {}
        for part in cards.split(","):
            key, eq2, count = part.strip().partition("=")
            if not re.match(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}$", key) or not eq2 or \
                    not count.strip().isdigit():
                raise ValueError("--extra-node %r: %r is not VENDOR:DEVICE=COUNT" % (spec, part))
            inventory[key.upper()] = inventory.get(key.upper(), 0) + int(count)
        net = ipaddress.ip_network((int(main_net.network_address) + i * main_net.num_addresses,
                                    main_net.prefixlen))
        out.append({"name": name, "inventory": inventory, "pod_cidr": str(net),
                    "ip": str(main_ip + i)})
    return out


def main():
    p = argparse.ArgumentParser(description="fake Kubernetes API server with a fake KubeVirt")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--pki-dir", required=True)
    p.add_argument("--token", action="append", default=[], help="an extra accepted bearer token")
    p.add_argument("--anonymous", action="store_true", help="accept unauthenticated requests")
    p.add_argument("--forbid", action="append", default=[], help="VERB:RESOURCE[:NAMESPACE] -> 403")
    p.add_argument("--drop-watch-after", type=int, default=0)
    p.add_argument("--bookmark-interval", type=float, default=1.0)
    p.add_argument("--device-plugin-delay", type=float, default=0.3)
    p.add_argument("--node-name", default="utho")
    p.add_argument("--cdi-storage", choices=["none", "network", "local"], default="none",
                   help="a DataVolume's PVC and PV: none (only the DataVolume), a network "
                        "(CSI) volume, or a local one on the main node")
    p.add_argument("--node-ip", default="192.168.122.10", help="the Node's InternalIP")
    p.add_argument("--pod-cidr", default="10.42.0.0/24", help="the Node's spec.podCIDR")
    p.add_argument("--service-cidr", default="10.43.0.0/16",
                   help="ClusterIPs: kubernetes at the 1st address, DNS at the 10th")
    p.add_argument("--dns-service", default="kube-system/rke2-coredns-rke2-coredns",
                   help="NAMESPACE/NAME of the cluster DNS Service")
    p.add_argument("--vfio-cards", action="append", help="VENDOR:DEVICE=COUNT on vfio-pci")
    p.add_argument("--host-root", help="a sysfs tree to count vfio-pci cards in")
    p.add_argument("--extra-node", action="append", default=[],
                   metavar="NAME=VENDOR:DEVICE=COUNT[,VENDOR:DEVICE=COUNT...]",
                   help="another Node with that many cards of each vendor:device on vfio-pci "
                        "(repeatable; scheduled onto after the main node, in order)")
    p.add_argument("--seed", action="append", help="YAML objects to start with")
    p.add_argument("--no-kubevirt-cr", action="store_true")
    p.add_argument("--no-group", action="append", default=[],
                   help="serve no such API group (as if its CRDs were not installed)")
    p.add_argument("--gpu-operator", choices=["sandbox", "container"],
                   help="play the GPU Operator: its ClusterPolicy with sandboxWorkloads on or off")
    p.add_argument("--node-gpus", action="append",
                   help="VENDOR:DEVICE=COUNT: the node's GPUs (no driver) when there is no --host-root")
    p.add_argument("--host-nvidia-driver", action="store_true",
                   help="the node's host loads the NVIDIA driver (k8s-driver-manager sees it)")
    p.add_argument("--vfio-bind-fails", action="append", default=[],
                   help="a GPU address vfio-manage fails to bind")
    p.add_argument("--plugin-pci-ids",
                   help="the pci.ids in the kubevirt-gpu-device-plugin image "
                        "(default: the host tree's /usr/share/misc/pci.ids)")
    p.add_argument("--operator-delay", type=float, default=0.3,
                   help="seconds each operand takes to start (and between crash-loop restarts)")
    p.add_argument("--vm-shutdown-seconds", type=float, default=1.0,
                   help="how long a guest takes to power off once its VMI is deleted (its ACPI "
                        "shutdown), at most the VMI's terminationGracePeriodSeconds")
    p.add_argument("--tick", type=float, default=0.1, help="controller period (s)")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    args.vfio_inventory = host_vfio_inventory(args.host_root) if args.host_root else parse_vfio(args.vfio_cards)
    try:
        args.extra_nodes = parse_extra_nodes(args.extra_node, args)
    except ValueError as e:
        p.error(str(e))
    k8s_schema.load_openapi_documents()

    ca, server_cert, token = write_pki(args.pki_dir, args.port)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*server_cert)
    ctx.load_verify_locations(ca[0])
    ctx.verify_mode = ssl.CERT_OPTIONAL  # token clients send no certificate
    tokens = {token} | set(args.token)

    store = Store(args)
    operator = gpu_operator.GpuOperator(store, RES_BY_KIND, args.node_name, args) \
        if args.gpu_operator else None
    with store.cond:
        seed(store, args, operator)
    family = socket.AF_INET6 if ":" in args.bind else socket.AF_INET
    srv = Server((args.bind, args.port), family, ctx, store, args, tokens)
    srv.operator = operator
    for f in args.forbid:
        parts = f.split(":")
        store.forbidden.append((parts[0], parts[1], parts[2] if len(parts) > 2 else "*"))
    port = srv.server_address[1]
    host = "[%s]" % args.bind if ":" in args.bind else args.bind
    url = "https://%s:%d" % (host, port)
    write_kubeconfig(args.pki_dir, url)

    controller = KubeVirtController(store, args.node_name, operator)

    def loop():
        while True:
            try:
                controller.tick()
            except Exception as e:  # a bug in the fake must be loud, not fatal
                sys.stderr.write("kube_apiserver: controller error: %r\n" % e)
            time.sleep(args.tick)
    threading.Thread(target=loop, daemon=True).start()

    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.rename(tmp, args.port_file)
    print("kube_apiserver: listening on " + url, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
