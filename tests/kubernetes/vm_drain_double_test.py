"""The Kubernetes double (tests/fakes/kube_apiserver.py) as host drain and
undrain will meet it: a cordoned Node (its unschedulable taint, VMIs that
cannot schedule there, running ones untouched), the graceful stop of a VM
(Stopping, the VMI's deletionTimestamp, Succeeded, Stopped), KubeVirt's
start/stop/restart subresources with virt-api's answers, and the timestamped
lifecycle log (GET /_fake/vm-log) that tells the order of things; and with
a second Node (--extra-node), the move of a VM stopped on a cordoned node to
another node with a free card, and the scheduler's message over both nodes
when none has one. Real HTTPS
on loopback against the double started as a process, as the C++ tests start
it. Run with Debian's /usr/bin/python3 (python3-jsonschema, python3-yaml,
python3-kubernetes)."""
import ipaddress
import json
import os
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tenant_double_test import Double  # noqa: E402

NS = "tenants"
NODE = "utho"
GPU = "nvidia.com/GH100_H200_SXM_141GB"
SHUTDOWN_S = 1.5
VMS = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachines" % NS
VMIS = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances" % NS
SUB = "/apis/subresources.kubevirt.io/v1/namespaces/%s/virtualmachines" % NS
NODE_PATH = "/api/v1/nodes/" + NODE
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
CORDONED = ("0/1 nodes are available: 1 node(s) were unschedulable. preemption: 0/1 nodes are "
            "available: 1 Preemption is not helpful for scheduling.")


def virtual_machine(name, gpu=GPU, **template_spec):
    """The shape Factory creates (coordinator/kubevirt/objects.cpp)."""
    labels = {"app.kubernetes.io/managed-by": "factory", "factory.dev/tenant": name}
    spec = {"architecture": "amd64",
            "domain": {"machine": {"type": "q35"},
                       "devices": {"disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}],
                                   "interfaces": [{"name": "default", "masquerade": {}}],
                                   "gpus": [{"name": "gpu1", "deviceName": gpu}]},
                       "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}},
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [{"name": "rootdisk", "dataVolume": {"name": name + "-root"}}]}
    spec.update(template_spec)
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "labels": labels},
            "spec": {"runStrategy": "Always",
                     "dataVolumeTemplates": [{
                         "metadata": {"name": name + "-root", "labels": labels},
                         "spec": {"source": {"http": {"url": "http://images/debian.qcow2"}},
                                  "storage": {"resources": {"requests": {"storage": "20Gi"}}}}}],
                     "template": {"metadata": {"labels": dict(labels, **{
                         "kubevirt.io/domain": name})}, "spec": spec}}}


class Watch:
    """A watch stream, read on the test's thread: the (type, object) events."""

    def __init__(self, k, path, rv):
        self.events = []
        req = urllib.request.Request(
            "https://127.0.0.1:%d%s?watch=1&resourceVersion=%s&timeoutSeconds=30" %
            (k.port, path, rv), headers={"Authorization": "Bearer " + k.token})
        self.resp = urllib.request.urlopen(req, context=k.ctx, timeout=30)

    def until(self, done):
        """Reads events until done(type, object) is true of one."""
        for line in self.resp:
            ev = json.loads(line)
            self.events.append((ev["type"], ev["object"]))
            if done(ev["type"], ev["object"]):
                return
        raise AssertionError("the watch ended first: %s" % self.events)

    def close(self):
        self.resp.close()


class VmHelpers:
    """What the cases below share: self.k is the double."""

    @staticmethod
    def wait_for(cond, timeout=15.0, what="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            time.sleep(0.05)
        raise AssertionError("timed out waiting for " + what)

    def vm(self, name):
        code, vm = self.k.call("GET", VMS + "/" + name)
        self.assertEqual(code, 200, vm)
        return vm

    def vmi(self, name):
        code, vmi = self.k.call("GET", VMIS + "/" + name)
        return vmi if code == 200 else None

    def printable(self, name):
        return (self.vm(name).get("status") or {}).get("printableStatus")

    def create_running(self, name, **template_spec):
        code, vm = self.k.call("POST", VMS, virtual_machine(name, **template_spec))
        self.assertEqual(code, 201, vm)
        self.wait_for(lambda: (self.vmi(name) or {}).get("status", {}).get("phase") == "Running",
                      what=name + " Running")
        self.wait_for(lambda: self.printable(name) == "Running", what=name + " printable Running")
        return self.vmi(name)

    def log(self, who=None):
        code, doc = self.k.call("GET", "/_fake/vm-log")
        self.assertEqual(code, 200, doc)
        return [e for e in doc["entries"] if who is None or e["vm"] == who]

    def first(self, entries, event, after=0.0):
        """The time of the first entry of that event at or after a time."""
        for e in entries:
            if e["event"] == event and e["time"] >= after:
                return e["time"]
        self.fail("no %s after %s in %s" % (event, after, json.dumps(entries, indent=1)))

    def put_sub(self, name, action, body=None):
        return self.k.call("PUT", "%s/%s/%s" % (SUB, name, action), body)

    def stopped_gracefully(self, name, uid, since):
        """From `since`: Stopping with the VMI marked and still Running, then
        the VMI gone and the VM Stopped; the log in order."""
        def stopping():
            vmi = self.vmi(name)
            return vmi and vmi["metadata"].get("deletionTimestamp") and \
                self.printable(name) == "Stopping" and vmi
        vmi = self.wait_for(stopping, what=name + " Stopping")
        self.assertEqual(vmi["metadata"]["uid"], uid)
        self.assertEqual(vmi["status"]["phase"], "Running", "the guest is powering off")
        self.assertFalse(self.vm(name)["status"]["ready"])
        self.wait_for(lambda: self.vmi(name) is None, what=name + "'s VMI gone")
        self.wait_for(lambda: self.printable(name) == "Stopped", what=name + " Stopped")
        who = NS + "/" + name
        entries = self.log(who)
        asked = self.first(entries, "stop_requested", since)
        began = self.first(entries, "shutdown_started", asked)
        gone = self.first(entries, "stopped", began)
        self.assertLess(asked, began)
        self.assertLess(began, gone)
        self.assertGreaterEqual(gone - began, SHUTDOWN_S - 0.05, "the shutdown took its time")
        return entries


class VmDrainDouble(VmHelpers, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.k = Double(["--vfio-cards", "10DE:2335=4", "--node-name", NODE,
                        "--vm-shutdown-seconds", str(SHUTDOWN_S)])
        k = cls.k
        code, _ = k.call("POST", "/api/v1/namespaces",
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        assert code == 201, code
        # The allowlist that makes KubeVirt's device plugin advertise the cards.
        code, kv = k.call("PATCH", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt",
                          {"spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [
                              {"pciVendorSelector": "10DE:2335", "resourceName": GPU}]}}}},
                          MERGE)
        assert code == 200, kv
        cls.wait_for(lambda: k.call("GET", NODE_PATH)[1]["status"]["allocatable"].get(GPU) == "4")

    @classmethod
    def tearDownClass(cls):
        cls.k.close()

    def tearDown(self):
        # Each case's VMs go (their VMIs and DataVolumes with them): the
        # node's four cards are for the next case.
        for vm in self.k.call("GET", VMS)[1]["items"]:
            self.k.call("DELETE", VMS + "/" + vm["metadata"]["name"])
        self.wait_for(lambda: not self.k.call("GET", VMIS)[1]["items"], what="no VMIs")

    # --- the cases

    def test_a_drain_cycle_cordon_stop_start_uncordon(self):
        name = "drain"
        uid1 = self.create_running(name)["metadata"]["uid"]
        mark = time.time()

        # Cordon as kubectl does: a strategic merge patch of spec.unschedulable.
        code, node = self.k.call("PATCH", NODE_PATH, {"spec": {"unschedulable": True}}, SMP)
        self.assertEqual(code, 200, node)
        taints = self.wait_for(lambda: self.k.call("GET", NODE_PATH)[1]["spec"].get("taints"),
                               what="the unschedulable taint")
        self.assertEqual([(t["key"], t["effect"]) for t in taints],
                         [("node.kubernetes.io/unschedulable", "NoSchedule")])
        self.assertIn("timeAdded", taints[0])
        time.sleep(0.5)  # a few controller passes: the running VMI stays as it is
        vmi = self.vmi(name)
        self.assertEqual(vmi["metadata"]["uid"], uid1)
        self.assertEqual(vmi["status"]["phase"], "Running")
        self.assertNotIn("deletionTimestamp", vmi["metadata"])
        self.assertEqual(self.printable(name), "Running")

        # Stop by the subresource, with an empty body.
        code, body = self.put_sub(name, "stop", {})
        self.assertEqual(code, 202, body)
        self.assertIsNone(body, "virt-api answers 202 with no body")
        self.assertEqual(self.vm(name)["spec"]["runStrategy"], "Halted")
        self.stopped_gracefully(name, uid1, mark)
        code, err = self.put_sub(name, "stop", {})
        self.assertEqual(code, 409, err)
        self.assertEqual(err["message"], 'Operation cannot be fulfilled on '
                         'virtualmachine.kubevirt.io "drain": VM is not running')

        # Start while cordoned: the new VMI cannot be scheduled.
        code, body = self.put_sub(name, "start")
        self.assertEqual(code, 202, body)
        self.assertEqual(self.vm(name)["spec"]["runStrategy"], "Always")
        self.wait_for(lambda: self.printable(name) == "ErrorUnschedulable",
                      what="ErrorUnschedulable")
        vmi = self.vmi(name)
        self.assertEqual(vmi["status"]["phase"], "Scheduling")
        self.assertNotEqual(vmi["metadata"]["uid"], uid1)
        self.assertEqual(vmi["status"]["conditions"],
                         [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": CORDONED}])
        self.assertEqual(self.vm(name)["status"]["conditions"][0]["message"], CORDONED)
        code, err = self.put_sub(name, "start")
        self.assertEqual(code, 409, err)
        self.assertEqual(err["reason"], "Conflict")
        self.assertEqual(err["message"], 'Operation cannot be fulfilled on '
                         'virtualmachine.kubevirt.io "drain": VM is already running')
        self.assertEqual(err["details"], {"name": "drain", "group": "kubevirt.io",
                                          "kind": "virtualmachine"})
        time.sleep(0.3)
        self.assertEqual(self.vmi(name)["status"]["phase"], "Scheduling")

        # Uncordon (kubectl's patch sets it to null): it schedules and runs.
        code, node = self.k.call("PATCH", NODE_PATH, {"spec": {"unschedulable": None}}, SMP)
        self.assertEqual(code, 200, node)
        self.wait_for(lambda: "taints" not in self.k.call("GET", NODE_PATH)[1]["spec"],
                      what="the taint gone")
        self.wait_for(lambda: self.printable(name) == "Running", what="Running again")
        vmi2 = self.vmi(name)
        self.assertEqual(vmi2["status"]["phase"], "Running")
        self.assertNotEqual(vmi2["metadata"]["uid"], uid1)
        self.assertNotIn("conditions", self.vm(name)["status"])

        # The whole story, in order.
        entries = [e for e in self.log() if e["time"] >= mark and e["vm"] in (NODE, NS + "/drain")]
        t = {}
        for e in entries:
            t.setdefault(e["event"], e["time"])
        order = ["cordoned", "stop_requested", "shutdown_started", "stopped", "start_requested",
                 "uncordoned", "started"]
        self.assertEqual(sorted(order, key=lambda ev: t[ev]), order, json.dumps(entries, indent=1))
        self.assertEqual([e["vm"] for e in entries if e["event"] in ("cordoned", "uncordoned")],
                         [NODE, NODE])

    def test_b_stop_by_merge_patch_and_start_again(self):
        name = "patched"
        uid1 = self.create_running(name)["metadata"]["uid"]
        mark = time.time()
        code, vm = self.k.call("PATCH", VMS + "/" + name, {"spec": {"runStrategy": "Halted"}},
                               MERGE)
        self.assertEqual(code, 200, vm)
        self.stopped_gracefully(name, uid1, mark)
        self.assertFalse(self.vm(name)["status"]["ready"])
        code, vm = self.k.call("PATCH", VMS + "/" + name, {"spec": {"runStrategy": "Always"}},
                               MERGE)
        self.assertEqual(code, 200, vm)
        self.wait_for(lambda: self.printable(name) == "Running", what="Running again")
        self.assertNotEqual(self.vmi(name)["metadata"]["uid"], uid1)
        events = [e["event"] for e in self.log(NS + "/" + name) if e["time"] >= mark]
        self.assertEqual(events, ["stop_requested", "shutdown_started", "stopped",
                                  "start_requested", "started"])

    def test_c_a_stop_undone_while_stopping_waits_for_the_old_vmi(self):
        name = "undone"
        uid1 = self.create_running(name)["metadata"]["uid"]
        self.k.call("PATCH", VMS + "/" + name, {"spec": {"runStrategy": "Halted"}}, MERGE)
        self.wait_for(lambda: (self.vmi(name) or {}).get("metadata", {}).get("deletionTimestamp"),
                      what="marked")
        self.k.call("PATCH", VMS + "/" + name, {"spec": {"runStrategy": "Always"}}, MERGE)
        time.sleep(0.3)
        self.assertEqual(self.vmi(name)["metadata"]["uid"], uid1, "the old one is still going")
        self.assertEqual(self.printable(name), "Stopping")
        self.wait_for(lambda: (self.vmi(name) or {}).get("metadata", {}).get("uid") not in
                      (None, uid1), what="a new VMI")
        self.wait_for(lambda: self.printable(name) == "Running", what="Running again")

    def test_d_watchers_see_the_shutdown(self):
        name = "watched"
        self.create_running(name)
        code, lst = self.k.call("GET", VMIS)
        w = Watch(self.k, VMIS, lst["metadata"]["resourceVersion"])
        try:
            code, _ = self.put_sub(name, "stop")
            self.assertEqual(code, 202)
            w.until(lambda t, o: t == "DELETED" and o["metadata"]["name"] == name)
        finally:
            w.close()
        mine = [(t, o["metadata"].get("deletionTimestamp") is not None, o["status"].get("phase"))
                for t, o in w.events if o["metadata"]["name"] == name]
        self.assertEqual(mine[0], ("MODIFIED", True, "Running"), mine)
        self.assertIn(("MODIFIED", True, "Succeeded"), mine)
        self.assertEqual(mine[-1][0], "DELETED")
        self.assertEqual(mine[-1][2], "Succeeded")
        # virt-controller's phaseTransitionTimestamps (what GPU usage counts
        # from): each phase entered, in order, with its time.
        last = [o for t, o in w.events if o["metadata"]["name"] == name][-1]
        stamps = last["status"]["phaseTransitionTimestamps"]
        self.assertEqual([p["phase"] for p in stamps],
                         ["Pending", "Scheduling", "Scheduled", "Running", "Succeeded"], stamps)
        times = [p["phaseTransitionTimestamp"] for p in stamps]
        self.assertEqual(times, sorted(times))
        self.assertRegex(times[-1], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

    def test_e_grace_period_cuts_the_shutdown(self):
        # A template's terminationGracePeriodSeconds caps it...
        name = "quick"
        uid = self.create_running(name, terminationGracePeriodSeconds=0)["metadata"]["uid"]
        self.put_sub(name, "stop")
        self.wait_for(lambda: self.vmi(name) is None, what="gone")
        e = self.log(NS + "/" + name)
        self.assertLess(self.first(e, "stopped") - self.first(e, "shutdown_started"), 0.6, uid)
        # ...and so does the stop's gracePeriod, written into the VMI first.
        name = "graced"
        self.create_running(name)
        code, body = self.put_sub(name, "stop", {"gracePeriod": 0})
        self.assertEqual(code, 202, body)
        self.wait_for(lambda: self.vmi(name) is None, what="gone")
        e = self.log(NS + "/" + name)
        self.assertLess(self.first(e, "stopped") - self.first(e, "shutdown_started"), 0.6)

    def test_f_restart_makes_a_new_vmi_after_a_graceful_shutdown(self):
        name = "restarted"
        uid1 = self.create_running(name)["metadata"]["uid"]
        mark = time.time()
        code, body = self.put_sub(name, "restart", {})
        self.assertEqual(code, 202, body)
        self.wait_for(lambda: (self.vmi(name) or {}).get("metadata", {}).get("uid") not in
                      (None, uid1) and self.printable(name) == "Running", what="a new VMI")
        self.assertEqual(self.vm(name)["spec"]["runStrategy"], "Always")
        self.wait_for(lambda: "stateChangeRequests" not in self.vm(name)["status"],
                      what="the requests done")
        events = [e["event"] for e in self.log(NS + "/" + name) if e["time"] >= mark]
        self.assertEqual(events, ["restart_requested", "shutdown_started", "stopped", "started"])
        code, err = self.put_sub(name, "restart", {"gracePeriodSeconds": 5})
        self.assertEqual(code, 400, err)
        self.assertEqual(err["message"],
                         "For force restart, only gracePeriod=0 is supported for now")

    def test_g_subresource_errors_and_rights(self):
        code, err = self.put_sub("nobody", "stop", {})
        self.assertEqual(code, 404, err)
        self.assertEqual(err["message"], 'virtualmachine.kubevirt.io "nobody" not found')
        self.assertEqual(err["details"]["kind"], "virtualmachine")
        code, err = self.put_sub("nobody", "start")
        self.assertEqual(code, 404, err)

        name = "running"
        self.create_running(name)
        code, err = self.put_sub(name, "start")
        self.assertEqual(code, 409, err)
        self.assertIn("VM is already running", err["message"])
        code, err = self.k.call("GET", "%s/%s/stop" % (SUB, name))
        self.assertEqual(code, 405, err)
        code, err = self.put_sub(name, "stop", "not an object")
        self.assertEqual(code, 400, err)
        self.assertTrue(err["message"].startswith("Can not unmarshal Request body to struct"), err)

        # dryRun changes nothing.
        code, _ = self.put_sub(name, "stop", {"dryRun": ["All"]})
        self.assertEqual(code, 202)
        self.assertEqual(self.vm(name)["spec"]["runStrategy"], "Always")

        # RBAC names it virtualmachines/stop in subresources.kubevirt.io.
        code, _ = self.k.call("POST", "/_fake/forbid",
                              {"verb": "update", "resource": "virtualmachines/stop"})
        self.assertEqual(code, 200)
        try:
            code, err = self.put_sub(name, "stop", {})
            self.assertEqual(code, 403, err)
            self.assertEqual(err["message"],
                             'virtualmachines.subresources.kubevirt.io "running" is forbidden: '
                             'User "token-user" cannot update resource "virtualmachines/stop" in '
                             'API group "subresources.kubevirt.io" in the namespace "tenants"')
            code, _ = self.put_sub(name, "restart", {})
            self.assertEqual(code, 202, "restart is a right of its own")
        finally:
            self.k.call("DELETE", "/_fake/forbid")
        self.wait_for(lambda: self.printable(name) == "Running", what="Running after restart")

        # A VM started with running: true is stopped by spec.running.
        legacy = virtual_machine("legacy")
        del legacy["spec"]["runStrategy"]
        legacy["spec"]["running"] = True
        code, vm = self.k.call("POST", VMS, legacy)
        self.assertEqual(code, 201, vm)
        self.wait_for(lambda: self.printable("legacy") == "Running", what="legacy Running")
        code, _ = self.put_sub("legacy", "stop")
        self.assertEqual(code, 202)
        spec = self.vm("legacy")["spec"]
        self.assertIs(spec["running"], False)
        self.assertNotIn("runStrategy", spec)
        self.wait_for(lambda: self.printable("legacy") == "Stopped", what="legacy Stopped")
        code, err = self.put_sub("legacy", "stop")
        self.assertEqual(code, 409, err)

    def test_h_requests_are_timestamped_and_lists_are_no_strategic_patch(self):
        before = time.time()
        self.k.call("GET", VMS)
        code, doc = self.k.call("GET", "/_fake/requests")
        self.assertEqual(code, 200)
        last = [r for r in doc["requests"] if r["path"] == VMS][-1]
        self.assertIsInstance(last["time"], float)
        self.assertGreaterEqual(last["time"], before - 1)
        # A strategic merge patch with a list is not a merge patch: refused,
        # not applied wrongly; custom resources refuse it as the server does.
        code, err = self.k.call("PATCH", NODE_PATH, {"spec": {"taints": []}}, SMP)
        self.assertEqual(code, 415, err)
        code, err = self.k.call("PATCH", VMS + "/x", {"spec": {}}, SMP)
        self.assertEqual(code, 415, err)
        # An update (PUT) cordons too.
        node = self.k.call("GET", NODE_PATH)[1]
        node["spec"]["unschedulable"] = True
        code, up = self.k.call("PUT", NODE_PATH, node)
        self.assertEqual(code, 200, up)
        self.wait_for(lambda: self.k.call("GET", NODE_PATH)[1]["spec"].get("taints"), what="taint")
        node = self.k.call("GET", NODE_PATH)[1]
        del node["spec"]["unschedulable"]
        code, up = self.k.call("PUT", NODE_PATH, node)
        self.assertEqual(code, 200, up)
        self.wait_for(lambda: "taints" not in self.k.call("GET", NODE_PATH)[1]["spec"],
                      what="untainted")
        events = [e["event"] for e in self.log(NODE) if e["time"] >= before]
        self.assertEqual(events, ["cordoned", "uncordoned"])


L4 = "nvidia.com/AD104GL_L4"
NODE2 = "gpu-2"
NODE2_PATH = "/api/v1/nodes/" + NODE2


def two_nodes(message_filter, message_preemption):
    return "0/2 nodes are available: %s. preemption: 0/2 nodes are available: %s." % (
        message_filter, message_preemption)


# kube-scheduler's FitError over two nodes, then DefaultPreemption's verdict:
# each a histogram of "<count> <reason>", sorted as strings, joined by ", ".
BOTH_FULL = two_nodes("2 Insufficient " + L4, "2 No preemption victims found for incoming pod")
FULL_AND_CORDONED = two_nodes(
    "1 Insufficient %s, 1 node(s) were unschedulable" % L4,
    "1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling")


class TwoNodesDouble(VmHelpers, unittest.TestCase):
    """The double with a second Node (--extra-node): where a drain's --move
    takes a VM."""

    @classmethod
    def setUpClass(cls):
        cls.k = Double(["--vfio-cards", "10DE:27B8=1", "--node-name", NODE,
                        "--extra-node", NODE2 + "=10DE:27B8=1",
                        "--vm-shutdown-seconds", str(SHUTDOWN_S)])
        k = cls.k
        code, _ = k.call("POST", "/api/v1/namespaces",
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        assert code == 201, code
        code, kv = k.call("PATCH", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt",
                          {"spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [
                              {"pciVendorSelector": "10DE:27B8", "resourceName": L4}]}}}},
                          MERGE)
        assert code == 200, kv
        for path in (NODE_PATH, NODE2_PATH):
            cls.wait_for(lambda: k.call("GET", path)[1]["status"]["allocatable"].get(L4) == "1",
                         what=path + " advertising its L4")

    @classmethod
    def tearDownClass(cls):
        cls.k.close()

    def tearDown(self):
        for vm in self.k.call("GET", VMS)[1]["items"]:
            self.k.call("DELETE", VMS + "/" + vm["metadata"]["name"])
        for path in (NODE_PATH, NODE2_PATH):
            self.k.call("PATCH", path, {"spec": {"unschedulable": None}}, MERGE)
        self.wait_for(lambda: not self.k.call("GET", VMIS)[1]["items"], what="no VMIs")

    def running_on(self, name, node, cidr):
        vmi = self.vmi(name)
        self.assertEqual(vmi["status"]["phase"], "Running")
        self.assertEqual(vmi["status"]["nodeName"], node)
        ip = vmi["status"]["interfaces"][0]["ipAddress"]
        self.assertIn(ipaddress.ip_address(ip), ipaddress.ip_network(cidr), name + "'s IP")
        return vmi

    def unschedulable_with(self, name, message):
        def said():
            vm_status = self.vm(name).get("status") or {}
            return vm_status.get("printableStatus") == "ErrorUnschedulable" and \
                [c.get("message") for c in vm_status.get("conditions") or []] == [message]
        # The VM's condition is the VMI's, copied on the controller's next pass.
        self.wait_for(said, what=name + " unschedulable: " + message)
        vmi = self.vmi(name)
        self.assertEqual(vmi["status"]["phase"], "Scheduling")
        self.assertNotIn("nodeName", vmi["status"])
        self.assertEqual(vmi["status"]["conditions"],
                         [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": message}])
        self.assertEqual(self.vm(name)["status"]["conditions"][0]["message"], message)

    def test_a_the_second_node_is_a_node_like_the_first(self):
        code, nodes = self.k.call("GET", "/api/v1/nodes")
        self.assertEqual(code, 200, nodes)
        self.assertEqual([n["metadata"]["name"] for n in nodes["items"]], [NODE2, NODE])
        main, extra = self.k.call("GET", NODE_PATH)[1], self.k.call("GET", NODE2_PATH)[1]
        self.assertEqual(extra["metadata"]["labels"], {"kubernetes.io/hostname": NODE2,
                                                       "kubevirt.io/schedulable": "true"})
        self.assertEqual(extra["spec"], {"podCIDR": "10.42.1.0/24", "podCIDRs": ["10.42.1.0/24"]})
        self.assertEqual(main["spec"], {"podCIDR": "10.42.0.0/24", "podCIDRs": ["10.42.0.0/24"]})
        self.assertEqual(extra["status"]["addresses"],
                         [{"type": "InternalIP", "address": "192.168.122.11"},
                          {"type": "Hostname", "address": NODE2}])
        self.assertEqual(extra["status"]["capacity"][L4], "1")
        self.assertEqual(set(extra["status"]["allocatable"]), set(main["status"]["allocatable"]))

        # A node name taken twice, or a count that is not one, is refused.
        for bad in (NODE + "=10DE:27B8=1", "gpu-3=10DE:27B8", "gpu-3", "Gpu=10DE:27B8=1"):
            with self.assertRaises(SystemExit, msg=bad) as e:
                Double(["--node-name", NODE, "--extra-node", bad])
            self.assertIn("--extra-node", str(e.exception))

    def test_b_a_vm_moves_off_a_cordoned_node_to_a_free_card(self):
        # One card on each node: a on the main node, b on the other, c on none.
        uid_a = self.create_running("a", gpu=L4)["metadata"]["uid"]
        self.running_on("a", NODE, "10.42.0.0/24")
        self.create_running("b", gpu=L4)
        self.running_on("b", NODE2, "10.42.1.0/24")
        code, vm = self.k.call("POST", VMS, virtual_machine("c", gpu=L4))
        self.assertEqual(code, 201, vm)
        self.unschedulable_with("c", BOTH_FULL)

        # Cordon the main node: c's message says so, a and b run on.
        mark = time.time()
        code, node = self.k.call("PATCH", NODE_PATH, {"spec": {"unschedulable": True}}, SMP)
        self.assertEqual(code, 200, node)
        self.unschedulable_with("c", FULL_AND_CORDONED)
        self.assertEqual(self.vmi("a")["metadata"]["uid"], uid_a)
        self.running_on("a", NODE, "10.42.0.0/24")
        self.running_on("b", NODE2, "10.42.1.0/24")

        # Stop a on the cordoned node; c goes (so that it takes no card).
        code, vm = self.k.call("PATCH", VMS + "/a", {"spec": {"runStrategy": "Halted"}}, MERGE)
        self.assertEqual(code, 200, vm)
        self.stopped_gracefully("a", uid_a, mark)
        code, _ = self.k.call("DELETE", VMS + "/c")
        self.assertEqual(code, 200)
        self.wait_for(lambda: self.vmi("c") is None, what="c's VMI gone")
        time.sleep(0.3)
        self.assertIsNone(self.vmi("a"), "a stays stopped")

        # b goes, freeing the other node's card; a started again lands there.
        code, _ = self.k.call("DELETE", VMS + "/b")
        self.assertEqual(code, 200)
        self.wait_for(lambda: self.vmi("b") is None, what="b's VMI gone")
        code, vm = self.k.call("PATCH", VMS + "/a", {"spec": {"runStrategy": "Always"}}, MERGE)
        self.assertEqual(code, 200, vm)
        self.wait_for(lambda: self.printable("a") == "Running", what="a Running again")
        vmi = self.running_on("a", NODE2, "10.42.1.0/24")
        self.assertNotEqual(vmi["metadata"]["uid"], uid_a)
        events = [e["event"] for e in self.log(NS + "/a") if e["time"] >= mark]
        self.assertEqual(events, ["stop_requested", "shutdown_started", "stopped",
                                  "start_requested", "started"])
        self.assertEqual([e["event"] for e in self.log(NODE) if e["time"] >= mark], ["cordoned"])

        # Nothing free anywhere now: the main node is cordoned, gpu-2 full.
        code, vm = self.k.call("POST", VMS, virtual_machine("d", gpu=L4))
        self.assertEqual(code, 201, vm)
        self.unschedulable_with("d", FULL_AND_CORDONED)
        # Uncordoned, the main node's card is d's.
        code, node = self.k.call("PATCH", NODE_PATH, {"spec": {"unschedulable": None}}, SMP)
        self.assertEqual(code, 200, node)
        self.wait_for(lambda: self.printable("d") == "Running", what="d Running")
        self.running_on("d", NODE, "10.42.0.0/24")
        self.assertNotIn("conditions", self.vm("d")["status"])

    def test_c_the_second_node_cordons_too(self):
        mark = time.time()
        code, node = self.k.call("PATCH", NODE2_PATH, {"spec": {"unschedulable": True}}, SMP)
        self.assertEqual(code, 200, node)
        taints = self.wait_for(lambda: self.k.call("GET", NODE2_PATH)[1]["spec"].get("taints"),
                               what="gpu-2's unschedulable taint")
        self.assertEqual([(t["key"], t["effect"]) for t in taints],
                         [("node.kubernetes.io/unschedulable", "NoSchedule")])
        self.assertNotIn("taints", self.k.call("GET", NODE_PATH)[1]["spec"])
        # The main node takes one VM; the next finds one node full, one cordoned.
        self.create_running("e", gpu=L4)
        self.running_on("e", NODE, "10.42.0.0/24")
        code, vm = self.k.call("POST", VMS, virtual_machine("f", gpu=L4))
        self.assertEqual(code, 201, vm)
        self.unschedulable_with("f", FULL_AND_CORDONED)
        # Both cordoned: each node refused by NodeUnschedulable alone.
        code, node = self.k.call("PATCH", NODE_PATH, {"spec": {"unschedulable": True}}, SMP)
        self.assertEqual(code, 200, node)
        self.unschedulable_with("f", two_nodes("2 node(s) were unschedulable",
                                               "2 Preemption is not helpful for scheduling"))
        self.k.call("PATCH", NODE_PATH, {"spec": {"unschedulable": None}}, SMP)
        code, node = self.k.call("PATCH", NODE2_PATH, {"spec": {"unschedulable": None}}, SMP)
        self.assertEqual(code, 200, node)
        self.wait_for(lambda: "taints" not in self.k.call("GET", NODE2_PATH)[1]["spec"],
                      what="gpu-2 untainted")
        self.wait_for(lambda: self.printable("f") == "Running", what="f Running")
        self.running_on("f", NODE2, "10.42.1.0/24")
        self.assertEqual([(e["vm"], e["event"]) for e in self.log() if e["time"] >= mark and
                          e["vm"] in (NODE, NODE2)],
                         [(NODE2, "cordoned"), (NODE, "cordoned"), (NODE, "uncordoned"),
                          (NODE2, "uncordoned")])


if __name__ == "__main__":
    unittest.main()
