#!/usr/bin/python3
"""The benchmark's PKI and provisioning, with the coordinator's own CA.

* agent identities issued in bulk by the coordinator's CA (state_dir/ca.key),
  exactly as CertificateAuthority::issue() makes them for an enrolled agent
  (coordinator/enroll/ca.cpp: CN=tenant, O=factory-agent, clientAuth, P-256
  key, 24 h), and recorded on each tenant's record in the coordinator's
  SQLite store the way Enrollment::enroll() records them (agent.cert_serials),
  while the coordinator is stopped. Enrolling 10,000 agents through the
  protocol is measured separately (run.py's rollout phase); this is how the
  connection series gets beyond what enrollment reaches in the time.
* a server certificate for the Node baseline from the same CA, so that both
  servers present the same kind of chain and verify the same client
  certificates.
* CSRs for the real enrollment path.

Needs python3-cryptography (Debian; /usr/bin/python3).
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import sqlite3
import sys
import time

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - reported to the user
    print("identities: python3-cryptography is missing (apt-get install python3-cryptography; "
          "run with /usr/bin/python3)", file=sys.stderr)
    raise SystemExit(2)

AGENT_ORG = "factory-agent"


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Ca:
    def __init__(self, state_dir: str):
        crt, key = os.path.join(state_dir, "ca.crt"), os.path.join(state_dir, "ca.key")
        for p in (crt, key):
            if not os.path.exists(p):
                raise FileNotFoundError(f"{p} is missing: start the coordinator once first")
        self.pem = open(crt, "rb").read()
        self.cert = x509.load_pem_x509_certificate(self.pem)
        self.key = serialization.load_pem_private_key(open(key, "rb").read(), None)
        self.ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value

    def issue(self, public_key, cn: str, org: str | None, eku, hosts=(), ttl_h: float = 24):
        now = datetime.datetime.now(datetime.timezone.utc)
        names = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            names.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name(names))
             .issuer_name(self.cert.subject)
             .public_key(public_key)
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(min(now + datetime.timedelta(hours=ttl_h),
                                  self.cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False,
                                          False), critical=True)
             .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self.ski),
                            critical=False))
        if hosts:
            alt = []
            for h in hosts:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    alt.append(x509.DNSName(h))
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return b.sign(self.key, hashes.SHA256())


def provision_agents(state_dir: str, out_dir: str, names: list[str]) -> list[str]:
    """Issues one identity per tenant name into out_dir/<name>.pem (leaf, CA,
    key) and records the tenants in the (stopped) coordinator's store.
    Returns the paths."""
    ca = Ca(state_dir)
    os.makedirs(out_dir, exist_ok=True)
    db_path = os.path.join(state_dir, "store", "factory.db")
    if not os.path.exists(db_path):
        raise FileNotFoundError(f"{db_path} is missing: start the coordinator once first")
    db = sqlite3.connect(db_path, timeout=30)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows, paths = [], []
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = ca.issue(key.public_key(), name, AGENT_ORG, ExtendedKeyUsageOID.CLIENT_AUTH)
        path = os.path.join(out_dir, name + ".pem")
        with open(path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM) + ca.pem + _pem_key(key))
        paths.append(path)
        serial = format(cert.serial_number, "x")
        expires = cert.not_valid_after.strftime("%Y-%m-%dT%H:%M:%SZ")
        record = {"name": name, "tier": "", "phase": "enrolled", "created_at": now, "spec": {},
                  "agent": {"agent_id": os.urandom(8).hex(), "cert_serials": [serial],
                            "certificate_expires_at": expires, "enrolled_at": now,
                            "hostname": name, "version": "0.1.0-bench"},
                  "status": {}}
        rows.append((name, json.dumps(record)))
    with db:
        db.executemany("INSERT OR REPLACE INTO tenants (name, record) VALUES (?, ?)", rows)
    db.close()
    return paths


def server_identity(state_dir: str, out_path: str) -> None:
    """A serving certificate for 127.0.0.1 from the coordinator's CA (the
    Node baseline's): leaf + CA chain, then the key, in one PEM."""
    ca = Ca(state_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = ca.issue(key.public_key(), "baseline", None, ExtendedKeyUsageOID.SERVER_AUTH,
                    hosts=["127.0.0.1", "localhost"])
    with open(out_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM) + ca.pem + _pem_key(key))


def make_csr(cn: str) -> tuple[str, str]:
    """A fresh P-256 key and a CSR for it (what the agent sends to enroll)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key).decode()


def main() -> int:
    ap = argparse.ArgumentParser(description="Bulk agent identities from a coordinator's CA "
                                             "(run while that coordinator is stopped).")
    ap.add_argument("--state-dir", required=True, help="the coordinator's state_dir")
    ap.add_argument("--out", required=True, help="folder for <tenant>.pem files")
    ap.add_argument("-n", type=int, required=True, help="how many")
    ap.add_argument("--prefix", default="f", help="tenant name prefix (default f)")
    a = ap.parse_args()
    try:
        t0 = time.monotonic()
        provision_agents(a.state_dir, a.out, [f"{a.prefix}{i:06d}" for i in range(a.n)])
        server_identity(a.state_dir, os.path.join(a.out, "..", "baseline-server.pem"))
        print(f"{a.n} identities in {time.monotonic() - t0:.1f} s")
    except (FileNotFoundError, sqlite3.Error) as e:
        print(f"identities: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
