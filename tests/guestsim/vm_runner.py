#!/usr/bin/python3
"""SIMULATED VMs for the end-to-end run: a test double, not a hypervisor.

Stands in for what happens between "KubeVirt reports the VMI Running" and
"the guest agent runs": virt-launcher booting the guest, cloud-init's first
boot (write_files, runcmd) and systemd supervising factory-agent. For each
VirtualMachineInstance the (fake) Kubernetes API reports Running, it:

  1. reads the VM's cloud-init Secret (cloudInitNoCloud.secretRef, key
     `userdata`), exactly what KubeVirt would hand the guest;
  2. builds a simulated guest root with tests/guestsim/guestsim.sh (the
     runbook's L4 guest by default);
  3. applies the user-data as cloud-init would: write_files under the root
     (with their modes), then each runcmd entry. runcmd runs with the real
     curl (to loopback only: tests/guestsim/curl-loopback) and sha256sum, so
     the agent binary is really downloaded from the coordinator over TLS with
     the CA from the user-data, and its hash really checked; systemctl is the
     simulator's stand-in, and the rest of the PATH is the guest's listed
     host tools and guards (tests/guestsim/guestsim.sh);
  4. stands in for a NodePort Service in front of the VM: a model endpoint's
     Service `<name>-endpoint` (port 443 to the guest's endpoint port) is
     modelled by telling the agent's proxy to listen on 127.0.0.1:<nodePort>,
     where callers on "the node" (this machine's loopback) reach it;
  5. supervises the installed agent as systemd would (Restart=on-failure,
     RestartPreventExitStatus=3), with the guest simulator's PATH and
     --root; a SIGKILL after the `reboot` stand-in counts as the guest's
     reboot, and the agent is started again as after boot.

  6. shuts the guest down as an ACPI power button does when KubeVirt stops
     the VMI gracefully (it is given a deletionTimestamp, runStrategy
     Halted): factory-agent gets SIGTERM as at systemd's shutdown, and the
     time is written to <guest>/power.log ("shutdown <unix time>"); a new
     VMI of the same VM (a start after a drain) boots the same disk again:
     the root is kept (identity, plan journal), /run is emptied (tmpfs),
     cloud-init does not run again (same instance id) and systemd starts
     the installed agent ("boot <unix time>" in power.log).

What it does not do: boot a kernel, run cloud-init itself (only the
write_files, users and runcmd modules Factory's user-data uses), networking,
or anything for a VMI that is not Running. Deleting the VMI stops the guest.

A simulator that fails is never papered over: a guest that cannot be created,
or a command that reached a guard (a program of this machine that no stand-in
answers for: the guest's <root>/.guestsim/log/guarded.log), stops every guest
and exits 1 at once with the reason; the run that started it (scripts/demo.sh,
tests/integration) fails on that. On SIGTERM it stops the guests and exits 0.
"""
import argparse
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request

import yaml


def log(msg):
    print(time.strftime("%H:%M:%S"), "vm-runner:", msg, flush=True)


class SimulatorFailed(Exception):
    """The simulation itself broke: nothing after it would mean anything."""


class Kube:
    def __init__(self, kubeconfig):
        cfg = yaml.safe_load(open(kubeconfig))
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"].rstrip("/")
        self.ctx = ssl.create_default_context()
        base = os.path.dirname(os.path.abspath(kubeconfig))
        if "certificate-authority-data" in cluster:
            self.ctx.load_verify_locations(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif "certificate-authority" in cluster:
            self.ctx.load_verify_locations(os.path.join(base, cluster["certificate-authority"]))
        self.headers = {}
        if "token" in user:
            self.headers["Authorization"] = "Bearer " + user["token"]
        if "client-certificate" in user:
            self.ctx.load_cert_chain(os.path.join(base, user["client-certificate"]),
                                     os.path.join(base, user["client-key"]))
        elif "client-certificate-data" in user:
            # ssl wants files: write them next to the runner's work, private.
            import tempfile
            d = tempfile.mkdtemp(prefix="vm-runner-")
            cert, key = os.path.join(d, "client.crt"), os.path.join(d, "client.key")
            for path, field in ((cert, "client-certificate-data"), (key, "client-key-data")):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                os.write(fd, base64.b64decode(user[field]))
                os.close(fd)
            self.ctx.load_cert_chain(cert, key)

    def get(self, path):
        req = urllib.request.Request(self.server + path, headers=self.headers)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise


class Guest:
    def __init__(self, args, ns, name, userdata):
        self.args, self.ns, self.name = args, ns, name
        self.dir = os.path.join(args.work, name)
        self.root = os.path.join(self.dir, "root")
        self.userdata = userdata
        self.agent = None
        self.agent_log = os.path.join(self.dir, "agent.log")
        self.stopped = False
        self.boots = 0
        self.next_start = 0.0
        self.endpoint_node_port = 0

    def sh(self, *argv, env=None, check=True):
        return subprocess.run(list(argv), env=env, check=check, capture_output=True, text=True)

    def reboot_count(self):
        p = os.path.join(self.root, ".guestsim/state/counters/reboot")
        try:
            return int(open(p).read().strip() or 0)
        except OSError:
            return 0

    def boot(self, tier=""):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        port = free_port()
        # The runbook's guest for the tier: tenant-1 (gpu-vm) or tenant-2 (gpu-k8s).
        self.profile = self.args.profile or TIER_PROFILES.get(tier, "l4")
        made = self.sh(self.args.guestsim, "create", self.root, "--profile", self.profile,
                       "--ollama-port", str(port), check=False)
        if made.returncode != 0:
            raise SimulatorFailed("%s: the guest simulator could not create a '%s' guest (exit %d): %s" % (
                self.name, self.profile, made.returncode, (made.stderr or made.stdout).strip()))
        self.ollama_url = "http://127.0.0.1:%d" % port
        self.path = self.sh(self.args.guestsim, "path", self.root).stdout.strip()
        # Failure knobs asked for on the command line (tests provoke diagnoses).
        for knob in self.args.knob:
            name, _, value = knob.partition("=")
            os.makedirs(os.path.join(self.root, ".guestsim/knobs"), exist_ok=True)
            with open(os.path.join(self.root, ".guestsim/knobs", name), "w") as f:
                f.write(value or "1")
        log("%s/%s: guest booted (simulated %s guest at %s)" % (self.ns, self.name, self.profile, self.root))
        self.cloud_init()

    def cloud_init(self):
        text = self.userdata
        out = open(os.path.join(self.dir, "cloud-init-output.log"), "a")
        if not text.startswith("#cloud-config"):
            out.write("user-data is not #cloud-config; nothing to do\n")
            return
        doc = yaml.safe_load(text) or {}
        # write_files: as cloud-init's write_files module (content, encoding, permissions).
        for f in doc.get("write_files", []):
            dest = self.root + f["path"]
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            data = f.get("content", "")
            if f.get("encoding") in ("b64", "base64"):
                data = base64.b64decode(data)
            else:
                data = data.encode()
            with open(dest, "wb") as w:
                w.write(data)
            os.chmod(dest, int(str(f.get("permissions", "0644")), 8))
        # users / chpasswd: recorded, not applied (the simulator has no /etc/passwd);
        # the password itself is never written anywhere.
        users = [{"name": u.get("name"), "keys": len(u.get("ssh_authorized_keys", []))}
                 for u in doc.get("users", []) if isinstance(u, dict)]
        json.dump(users, open(os.path.join(self.dir, "users.json"), "w"))
        # runcmd: the real curl (to loopback only) and sha256sum, the
        # simulator's systemctl; then the guest's host tools and its guards.
        g = os.path.join(self.root, ".guestsim")
        ci_bin = os.path.join(g, "cloudinit-bin")
        os.makedirs(ci_bin, exist_ok=True)
        os.symlink(os.path.join(self.args.guestsim_home, "bin/systemctl"), os.path.join(ci_bin, "systemctl"))
        os.symlink(os.path.join(self.args.guestsim_home, "curl-loopback"), os.path.join(ci_bin, "curl"))
        env = dict(os.environ)
        env.update({"FACTORY_GUEST_ROOT": self.root, "FACTORY_GUESTSIM_ROOT": self.root,
                    "PATH": ":".join([ci_bin, os.path.join(g, "host-bin"), os.path.join(g, "guard")])})
        for cmd in doc.get("runcmd", []):
            argv = cmd if isinstance(cmd, list) else ["/bin/sh", "-c", cmd]
            # Absolute guest paths that exist in the simulated root point there.
            argv = [self.root + a if isinstance(a, str) and a.startswith("/") and
                    os.path.exists(self.root + a) else a for a in argv]
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            out.write("$ %s\n%s%s(exit %d)\n" % (" ".join(map(str, cmd if isinstance(cmd, list) else [cmd])),
                                               r.stdout, r.stderr, r.returncode))
            out.flush()
            if r.returncode != 0:
                log("%s: runcmd failed (exit %d): %s" % (self.name, r.returncode, (r.stderr or r.stdout).strip()[-300:]))
                return
        log("%s: cloud-init finished (agent installed: %s)" % (self.name, os.path.exists(self.agent_bin())))

    def guarded(self):
        """What reached the guest's guards (one line a call), "" when nothing did."""
        try:
            return open(os.path.join(self.root, ".guestsim/log/guarded.log")).read()
        except OSError:
            return ""

    def agent_bin(self):
        return os.path.join(self.root, "usr/local/bin/factory-agent")

    def agent_enabled(self):
        s = os.path.join(self.root, ".guestsim/state/services")
        return any(os.path.exists(os.path.join(s, n)) for n in ("factory-agent.enabled", "factory-agent.service.enabled"))

    def start_agent(self):
        etc = os.path.join(self.root, "etc/factory")
        argv = [self.agent_bin(), "--config", os.path.join(etc, "agent.yaml"), "--root", self.root,
                "--ca-file", os.path.join(etc, "ca.crt"), "--token-file", os.path.join(etc, "bootstrap-token"),
                "--state-dir", os.path.join(self.root, "var/lib/factory-agent"), "--ollama-url", self.ollama_url]
        if self.endpoint_node_port:
            argv += ["--endpoint-listen", "127.0.0.1:%d" % self.endpoint_node_port]
        argv += self.args.agent_arg
        env = dict(os.environ)
        env["PATH"] = self.path
        logf = open(self.agent_log, "a")
        logf.write("---- agent start %d ----\n" % (self.boots + 1))
        logf.flush()
        self.agent = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT)
        self.boots += 1
        self.reboots_seen = self.reboot_count()

    def supervise(self):
        if self.stopped or not self.agent_enabled() or not os.path.exists(self.agent_bin()):
            return
        if self.agent is None:
            self.start_agent()
            return
        rc = self.agent.poll()
        if rc is None:
            return
        if rc == -signal.SIGKILL and self.reboot_count() > self.reboots_seen:
            log("%s: guest rebooted; systemd starts factory-agent again" % self.name)
            self.start_agent()
        elif rc == 3:
            if self.next_start >= 0:
                log("%s: factory-agent exited 3 (needs an admin); not restarting" % self.name)
            self.next_start = -1
        elif rc == 0:
            pass
        else:
            # Restart=on-failure, RestartSec (shortened for the simulation).
            if self.next_start == 0:
                self.next_start = time.time() + 1
            elif time.time() >= self.next_start:
                log("%s: factory-agent exited %d; restarting" % (self.name, rc))
                self.next_start = 0
                self.start_agent()

    def power_log(self, what):
        with open(os.path.join(self.dir, "power.log"), "a") as f:
            f.write("%s %.6f\n" % (what, time.time()))

    def power_off(self):
        """The ACPI power button: systemd stops factory-agent (SIGTERM) and
        the guest halts. The disk (the root) stays for the next boot."""
        if self.stopped:
            return
        self.power_log("shutdown")
        log("%s/%s: guest shutting down (ACPI)" % (self.ns, self.name))
        self.shutdown()

    def boot_again(self):
        """A new VMI of the same VM: the same disk boots. /run is a tmpfs,
        cloud-init ran for this instance already, systemd starts the agent."""
        shutil.rmtree(os.path.join(self.root, "run"), ignore_errors=True)
        os.makedirs(os.path.join(self.root, "run"), exist_ok=True)
        self.stopped = False
        self.agent = None
        self.next_start = 0.0
        self.power_log("boot")
        log("%s/%s: guest booted again from its disk" % (self.ns, self.name))

    def shutdown(self):
        self.stopped = True
        if self.agent and self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(5)
            except subprocess.TimeoutExpired:
                self.agent.kill()
        subprocess.run([self.args.guestsim, "stop", self.root], capture_output=True)
        log("%s: guest stopped" % self.name)


TIER_PROFILES = {"gpu-vm": "l4", "gpu-k8s": "l4-k8s", "model-endpoint": "l4"}


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--work", required=True, help="where guests' roots and logs go")
    p.add_argument("--profile", default="", help="guest simulator profile (default: by the VM's tier)")
    p.add_argument("--poll", type=float, default=0.3)
    p.add_argument("--agent-arg", action="append", default=[], help="extra factory-agent flag")
    p.add_argument("--knob", action="append", default=[], help="NAME[=VALUE]: a guest simulator failure knob")
    args = p.parse_args()
    args.guestsim_home = os.path.dirname(os.path.abspath(__file__))
    args.guestsim = os.path.join(args.guestsim_home, "guestsim.sh")
    os.makedirs(args.work, exist_ok=True)
    kube = Kube(args.kubeconfig)
    guests = {}
    running = [True]

    def stop(*_):
        running[0] = False
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log("watching VirtualMachineInstances at %s" % kube.server)
    while running[0]:
        try:
            vmis = (kube.get("/apis/kubevirt.io/v1/virtualmachineinstances") or {}).get("items", [])
        except Exception as e:  # the API server may be restarting
            log("cannot list VMIs: %s" % e)
            vmis = []
        seen = set()
        for vmi in vmis:
            ns, name = vmi["metadata"]["namespace"], vmi["metadata"]["name"]
            key = (ns, name)
            seen.add(key)
            uid = vmi["metadata"].get("uid", "")
            g = guests.get(key)
            if g is not None and vmi["metadata"].get("deletionTimestamp"):
                g.power_off()  # KubeVirt's graceful stop: the guest shuts down
                continue
            if g is not None and g.uid != uid and vmi.get("status", {}).get("phase") == "Running":
                if not g.stopped:
                    g.shutdown()  # the old instance went without a word
                g.uid = uid
                g.boot_again()
                continue
            if key in guests or vmi.get("status", {}).get("phase") != "Running":
                continue
            vm = kube.get("/apis/kubevirt.io/v1/namespaces/%s/virtualmachines/%s" % (ns, name)) or {}
            secret_name = None
            for v in vm.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
                if "cloudInitNoCloud" in v:
                    secret_name = v["cloudInitNoCloud"].get("secretRef", {}).get("name")
            userdata = ""
            if secret_name:
                sec = kube.get("/api/v1/namespaces/%s/secrets/%s" % (ns, secret_name)) or {}
                if "userdata" in sec.get("data", {}):
                    userdata = base64.b64decode(sec["data"]["userdata"]).decode()
                else:
                    userdata = sec.get("stringData", {}).get("userdata", "")
            g = Guest(args, ns, name, userdata)
            g.uid = uid
            svc = kube.get("/api/v1/namespaces/%s/services/%s-endpoint" % (ns, name)) or {}
            for port in svc.get("spec", {}).get("ports", []):
                if port.get("name") == "https" and port.get("nodePort"):
                    g.endpoint_node_port = int(port["nodePort"])
            guests[key] = g
            tier = vmi["metadata"].get("labels", {}).get("factory.dev/tier", "")
            try:
                g.boot(tier)
            except SimulatorFailed as e:
                return fail(guests, str(e))
            except Exception as e:
                log("%s: boot failed: %s" % (name, e))
        for key, g in list(guests.items()):
            calls = g.guarded()
            if calls:
                return fail(guests, "%s: commands reached the guard (no stand-in answers them; this "
                                    "machine's own must never run in a test):\n%s" % (g.name, calls.rstrip()))
            if key not in seen and not g.stopped:
                g.power_off()
            else:
                g.supervise()
        time.sleep(args.poll)
    for g in guests.values():
        if not g.stopped:
            g.shutdown()
    return 0


def fail(guests, why):
    log("FATAL: " + why)
    for g in guests.values():
        if not g.stopped:
            g.shutdown()
    return 1


if __name__ == "__main__":
    sys.exit(main())
