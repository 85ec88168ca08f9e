"""The Kubernetes double (tests/fakes/kube_apiserver.py) as the Tenant
controller will meet it: Tenants validated by their CRD, the status
subresource, metadata.generation moving with the spec only, optimistic
concurrency, finalizers holding a deleted Tenant, and Leases. Real HTTPS on
loopback against the double started as a process, as the C++ tests start it.
Run with Debian's /usr/bin/python3 (python3-jsonschema, python3-yaml,
python3-kubernetes)."""
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "..", "fakes", "kube_apiserver.py")
NS = "tenants"
BASE = "/apis/factory.dev/v1alpha1/namespaces/%s/tenants" % NS


def read(path):
    with open(path) as f:
        return f.read().strip()


class Double:
    """The double as a process (vm_drain_double_test.py starts it too, with
    its own arguments)."""

    def __init__(self, args=("--no-kubevirt-cr",)):
        self.dir = tempfile.mkdtemp(prefix="tenant-double-")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", FAKE, "--pki-dir", self.dir, "--port-file", port_file] +
            list(args),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(300):
            if os.path.exists(port_file) and read(port_file):
                break
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode()
                self.proc.stderr.close()
                shutil.rmtree(self.dir, ignore_errors=True)
                raise SystemExit("the double exited: " + err)
            time.sleep(0.05)
        self.port = int(read(port_file))
        self.token = read(os.path.join(self.dir, "token"))
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.dir, "ca.crt"))
        self.ctx.check_hostname = False

    def call(self, method, path, body=None, ctype="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request("https://127.0.0.1:%d%s" % (self.port, path), data=data,
                                     method=method,
                                     headers={"Authorization": "Bearer " + self.token,
                                              "Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def tenant(name, **spec):
    s = {"tier": "gpu-vm"}
    s.update(spec)
    return {"apiVersion": "factory.dev/v1alpha1", "kind": "Tenant",
            "metadata": {"name": name}, "spec": s}


class TenantDouble(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.k = Double()
        code, _ = cls.k.call("POST", "/api/v1/namespaces",
                             {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        assert code == 201, code

    @classmethod
    def tearDownClass(cls):
        cls.k.close()

    def test_create_validates_by_the_crd_and_drops_status(self):
        t = tenant("alice", gpus=1, memory="64Gi")
        t["status"] = {"phase": "ready"}
        code, obj = self.k.call("POST", BASE, t)
        self.assertEqual(code, 201, obj)
        self.assertEqual(obj["metadata"]["generation"], 1)
        self.assertNotIn("status", obj, "a create does not write status")
        code, err = self.k.call("POST", BASE, tenant("bad", memory="64GB"))
        self.assertEqual(code, 422, err)
        self.assertIn("spec.memory", err["message"])
        code, err = self.k.call("POST", BASE, tenant("bad2", replicas=3))
        self.assertEqual(code, 422, err)

    def test_status_subresource_and_generation(self):
        code, obj = self.k.call("POST", BASE, tenant("bob"))
        self.assertEqual(code, 201, obj)
        # Status through /status: the spec in the body is not taken.
        obj["status"] = {"phase": "provisioning", "observedGeneration": 1}
        obj["spec"]["gpus"] = 4
        code, st = self.k.call("PUT", BASE + "/bob/status", obj)
        self.assertEqual(code, 200, st)
        self.assertEqual(st["status"]["phase"], "provisioning")
        self.assertNotIn("gpus", st["spec"])
        self.assertEqual(st["metadata"]["generation"], 1)
        # The object: its spec changes and generation moves; status stays.
        st["spec"]["gpus"] = 2
        st["status"] = {"phase": "hacked"}
        code, up = self.k.call("PUT", BASE + "/bob", st)
        self.assertEqual(code, 200, up)
        self.assertEqual(up["spec"]["gpus"], 2)
        self.assertEqual(up["metadata"]["generation"], 2)
        self.assertEqual(up["status"]["phase"], "provisioning")
        # A stale resourceVersion is a conflict, on either path.
        code, err = self.k.call("PUT", BASE + "/bob/status", st)
        self.assertEqual(code, 409, err)
        # A merge patch of the status.
        code, p = self.k.call("PATCH", BASE + "/bob/status", {"status": {"phase": "ready"}},
                              "application/merge-patch+json")
        self.assertEqual(code, 200, p)
        self.assertEqual(p["status"]["phase"], "ready")
        self.assertEqual(p["metadata"]["generation"], 2)
        # Only Tenants have /status here.
        code, _ = self.k.call("GET", "/api/v1/namespaces/%s/secrets/x/status" % NS)
        self.assertEqual(code, 404)

    def test_a_finalizer_holds_a_deleted_tenant_until_it_is_removed(self):
        t = tenant("carol")
        t["metadata"]["finalizers"] = ["factory.dev/tenant"]
        code, obj = self.k.call("POST", BASE, t)
        self.assertEqual(code, 201, obj)
        code, marked = self.k.call("DELETE", BASE + "/carol")
        self.assertEqual(code, 200, marked)
        self.assertIn("deletionTimestamp", marked["metadata"])
        code, still = self.k.call("GET", BASE + "/carol")
        self.assertEqual(code, 200, "held by its finalizer")
        code, err = self.k.call("PATCH", BASE + "/carol",
                                {"metadata": {"finalizers": ["factory.dev/tenant", "other"]}},
                                "application/merge-patch+json")
        self.assertEqual(code, 422, err)
        self.assertIn("no new finalizers", err["message"])
        code, gone = self.k.call("PATCH", BASE + "/carol", {"metadata": {"finalizers": None}},
                                 "application/merge-patch+json")
        self.assertEqual(code, 200, gone)
        code, _ = self.k.call("GET", BASE + "/carol")
        self.assertEqual(code, 404, "the last finalizer removed, the deletion happens")

    def test_leases_take_turns_by_resource_version(self):
        path = "/apis/coordination.k8s.io/v1/namespaces/%s/leases" % NS
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": "factory-coordinator"},
                 "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15,
                          "acquireTime": "2026-12-04T17:00:00.000000Z",
                          "renewTime": "2026-12-04T17:00:00.000000Z", "leaseTransitions": 0}}
        code, a = self.k.call("POST", path, lease)
        self.assertEqual(code, 201, a)
        code, _ = self.k.call("POST", path, lease)
        self.assertEqual(code, 409, "one Lease of that name")
        b = json.loads(json.dumps(a))
        a["spec"]["renewTime"] = "2026-12-04T17:00:05.000000Z"
        code, renewed = self.k.call("PUT", path + "/factory-coordinator", a)
        self.assertEqual(code, 200, renewed)
        b["spec"]["holderIdentity"] = "replica-b"
        code, err = self.k.call("PUT", path + "/factory-coordinator", b)
        self.assertEqual(code, 409, "a takeover from a stale read loses")
        code, now = self.k.call("GET", path + "/factory-coordinator")
        self.assertEqual(now["spec"]["holderIdentity"], "replica-a")


if __name__ == "__main__":
    unittest.main()
