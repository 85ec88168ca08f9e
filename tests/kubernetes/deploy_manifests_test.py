#!/usr/bin/python3
"""The manifests in deploy/kubernetes, checked as an API server with strict
field validation would take them (tests/fakes/k8s_schema.py: the built-in
kinds' schemas from python3-kubernetes' models, the Tenant CRD's own), and
the HA form's promises held to: three replicas on different nodes, a
PodDisruptionBudget, the RBAC for Tenants and the Lease, readiness on the
store, the PostgreSQL connection in a Secret only, and a config the real
`factory` binary reads.

Usage: deploy_manifests_test.py FACTORY_BINARY
"""
import os
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))
import k8s_schema  # noqa: E402

DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
FACTORY = sys.argv.pop(1) if len(sys.argv) > 1 else ""


def docs(name):
    with open(os.path.join(DEPLOY, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def one(ds, kind, name=None):
    found = [d for d in ds if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, "want one %s %s, have %d" % (kind, name or "", len(found))
    return found[0]


def allowed(rules, group, resource, verb, name=None):
    for r in rules:
        if group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]:
            if name is None or "resourceNames" not in r or name in r["resourceNames"]:
                return True
    return False


class Manifests(unittest.TestCase):
    def test_every_document_validates(self):
        for name in sorted(os.listdir(DEPLOY)):
            if not name.endswith(".yaml"):
                continue
            for i, d in enumerate(docs(name), 1):
                if d["kind"] == "CustomResourceDefinition":
                    # tenant_crd_test.py's: python3-kubernetes' models are
                    # older than CEL rules (x-kubernetes-validations).
                    continue
                errors = k8s_schema.validate(d)
                self.assertEqual(errors, [], "%s doc %d (%s %s)" % (
                    name, i, d.get("kind"), d.get("metadata", {}).get("name")))

    def test_ha_replicas_spread_and_protected(self):
        ds = docs("coordinator-ha.yaml")
        dep = one(ds, "Deployment")
        self.assertEqual(dep["spec"]["replicas"], 3)
        self.assertNotEqual(dep["spec"]["strategy"]["type"], "Recreate")
        pod = dep["spec"]["template"]["spec"]
        anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertTrue(any(t["topologyKey"] == "kubernetes.io/hostname" for t in anti))
        labels = dep["spec"]["template"]["metadata"]["labels"]
        for t in anti:
            for k, v in t["labelSelector"]["matchLabels"].items():
                self.assertEqual(labels.get(k), v, "anti-affinity must select the replicas themselves")
        pdb = one(ds, "PodDisruptionBudget")
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"])
        self.assertEqual(pdb["spec"]["minAvailable"], 2)
        # No volume two replicas would share.
        self.assertFalse(any("persistentVolumeClaim" in v for v in pod["volumes"]))
        self.assertFalse(any(d["kind"] == "PersistentVolumeClaim" for d in ds))

    def test_ha_readiness_is_the_store_and_identity_is_the_pod(self):
        dep = one(docs("coordinator-ha.yaml"), "Deployment")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/readyz")
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        self.assertEqual(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.namespace")

    def test_ha_postgres_connection_is_a_secret_only(self):
        ds = docs("coordinator-ha.yaml")
        secret = one(ds, "Secret", "factory-postgres")
        self.assertIn("PGPASSWORD", secret["stringData"])
        dep = one(ds, "Deployment")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        self.assertIn({"secretRef": {"name": "factory-postgres"}}, c["envFrom"])
        cm = one(ds, "ConfigMap")
        cfg = yaml.safe_load(cm["data"]["coordinator.yaml"])
        self.assertEqual(cfg["store"], "postgres://", "the URI must carry no host, user or password")
        self.assertNotIn(secret["stringData"]["PGPASSWORD"], cm["data"]["coordinator.yaml"])
        self.assertEqual(cfg["tenants"]["source"], "kubernetes")
        self.assertTrue(cfg["leader_election"]["enabled"])

    def test_ha_rbac_covers_tenants_and_the_lease(self):
        ds = docs("coordinator-ha.yaml")
        cluster = one(ds, "ClusterRole")["rules"]
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
            self.assertTrue(allowed(cluster, "factory.dev", "tenants", verb), verb)
        self.assertTrue(allowed(cluster, "factory.dev", "tenants/status", "update"))
        self.assertTrue(allowed(cluster, "factory.dev", "tenants/finalizers", "update"))
        # The Lease: in the coordinator's namespace only, by name.
        self.assertFalse(any("coordination.k8s.io" in r["apiGroups"] for r in cluster))
        role = one(ds, "Role")
        self.assertEqual(role["metadata"]["namespace"], "factory-system")
        for verb in ("get", "update"):
            self.assertTrue(allowed(role["rules"], "coordination.k8s.io", "leases", verb,
                                    "factory-coordinator"))
            self.assertFalse(allowed(role["rules"], "coordination.k8s.io", "leases", verb, "other"),
                             "a replica may touch no other Lease")
        self.assertTrue(allowed(role["rules"], "coordination.k8s.io", "leases", "create"))
        binding = one(ds, "RoleBinding")
        self.assertEqual(binding["roleRef"]["name"], role["metadata"]["name"])
        self.assertEqual(binding["subjects"][0]["name"],
                         one(ds, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"])

    def test_configs_are_read_by_the_real_binary(self):
        self.assertTrue(FACTORY, "usage: deploy_manifests_test.py FACTORY_BINARY")
        for name in ("coordinator.yaml", "coordinator-ha.yaml"):
            cm = one(docs(name), "ConfigMap")
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "coordinator.yaml")
                with open(path, "w") as f:
                    f.write(cm["data"]["coordinator.yaml"])
                # A command that loads the whole config, then calls the API
                # (absent here): any complaint naming the file is the config's.
                r = subprocess.run([FACTORY, "--config", path, "--server", "https://127.0.0.1:9",
                                    "token", "list"], capture_output=True, text=True, timeout=60)
                self.assertNotIn(path, r.stdout + r.stderr, name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
