"""The Tenant CRD (deploy/kubernetes/tenant-crd.yaml, what `factory install
crds` prints) as an API server with strict field validation applies it:
through tests/fakes/k8s_schema.py, i.e. python3-jsonschema over the CRD's
structural openAPIV3Schema, an independent reading of the patterns and
bounds the coordinator's C++ rules hold (tests/coordinator/tenant_resource_test.cpp).
Stands in for kube-apiserver's CRD validation (no CEL: see k8s_schema.py).
Run with Debian's /usr/bin/python3 (python3-jsonschema, python3-yaml)."""
import copy
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
import k8s_schema  # noqa: E402

KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb2cHzNnZDn3MQ2oGpdlw8Bi4aDAZ5pqc3VkxmlH5sb "
       "alice@laptop")

FULL = {
    "apiVersion": "factory.dev/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "alice", "namespace": "tenants"},
    "spec": {
        "tier": "gpu-vm",
        "gpus": 1,
        "gpuResource": "nvidia.com/GH100_H200",
        "cpu": 8,
        "memory": "64Gi",
        "disk": "200Gi",
        "image": "https://cloud-images.ubuntu.com/noble/current/noble.img",
        "models": ["llama3.2:1b"],
        "sshKeys": [{"publicKey": KEY},
                    {"secretKeyRef": {"name": "alice-keys", "key": "authorized_keys"}}],
        "sshNodePort": 30022,
        "project": "team-a",
        "catalogVersion": "2026.12.1",
    },
    "status": {
        "phase": "ready",
        "observedGeneration": 2,
        "step": "ollama-model",
        "gpu": "nvidia.com/GH100_H200",
        "conditions": [{"type": "Ready", "status": "True", "reason": "PlanDone",
                        "message": "every step done",
                        "lastTransitionTime": "2026-12-04T17:00:00Z"}],
    },
}


def with_spec(**changes):
    t = copy.deepcopy(FULL)
    for k, v in changes.items():
        if v is None:
            t["spec"].pop(k, None)
        else:
            t["spec"][k] = v
    return t


class TenantCrd(unittest.TestCase):
    def assert_valid(self, obj):
        self.assertEqual(k8s_schema.validate(obj), [])

    def assert_invalid(self, obj, where):
        errors = k8s_schema.validate(obj)
        self.assertTrue(any(where in e for e in errors), "%s not in %s" % (where, errors))

    def test_a_full_tenant_with_status_is_valid(self):
        self.assert_valid(FULL)

    def test_the_least_tenant_is_a_tier(self):
        self.assert_valid({"apiVersion": "factory.dev/v1alpha1", "kind": "Tenant",
                           "metadata": {"name": "bob"}, "spec": {"tier": "model-endpoint"}})
        self.assert_invalid({"apiVersion": "factory.dev/v1alpha1", "kind": "Tenant",
                             "metadata": {"name": "bob"}, "spec": {}}, "tier")
        self.assert_invalid({"apiVersion": "factory.dev/v1alpha1", "kind": "Tenant",
                             "metadata": {"name": "bob"}}, "spec")

    def test_cpu_is_an_int_or_a_string(self):
        self.assert_valid(with_spec(cpu="500m"))
        self.assert_valid(with_spec(cpu=2))
        self.assert_invalid(with_spec(cpu=1.5), "cpu")

    def test_values_the_coordinator_refuses_are_refused_at_apply(self):
        cases = [
            (with_spec(replicas=3), "replicas"),
            (with_spec(tier="gpu vm"), "spec.tier"),
            (with_spec(tier=""), "spec.tier"),
            (with_spec(gpus=17), "spec.gpus"),
            (with_spec(gpus=-1), "spec.gpus"),
            (with_spec(gpus="1"), "spec.gpus"),
            (with_spec(gpuResource="h200"), "spec.gpuResource"),
            (with_spec(memory="64GB"), "spec.memory"),
            (with_spec(memory="0"), "spec.memory"),
            (with_spec(disk="-1Gi"), "spec.disk"),
            (with_spec(image="ftp://x/y.img"), "spec.image"),
            (with_spec(models=["x;rm -rf /"]), "spec.models"),
            (with_spec(models=["m%d" % i for i in range(9)]), "spec.models"),
            (with_spec(sshNodePort=22), "spec.sshNodePort"),
            (with_spec(sshKeys=[{"secretKeyRef": {"name": "a"}}]), "spec.sshKeys"),
            (with_spec(sshKeys=[{"publicKey": KEY, "comment": "x"}]), "spec.sshKeys"),
            (with_spec(project="Team A"), "spec.project"),
            (with_spec(catalogVersion="v 1"), "spec.catalogVersion"),
        ]
        for obj, where in cases:
            with self.subTest(where=where, spec=obj["spec"]):
                self.assert_invalid(obj, where)

    def test_status_conditions_are_typed(self):
        t = copy.deepcopy(FULL)
        t["status"]["conditions"][0]["status"] = "Yes"
        self.assert_invalid(t, "status.conditions")
        t = copy.deepcopy(FULL)
        del t["status"]["conditions"][0]["type"]
        self.assert_invalid(t, "status.conditions")


if __name__ == "__main__":
    unittest.main()
