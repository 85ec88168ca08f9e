"""Test PKI made with the real `openssl` command: a CA, server and client
certificates, so the test servers speak real TLS with real chains.

Used by the Python test doubles (http_test_server.py, kube_apiserver.py).
Keys are ECDSA P-256, written with mode 0600; everything lives one day.
"""
import os
import subprocess


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def _private(path):
    os.chmod(path, 0o600)


def make_ca(directory, name, cn=None):
    """Writes NAME.crt / NAME.key (a self-signed CA); returns (crt, key) paths."""
    crt = os.path.join(directory, name + ".crt")
    key = os.path.join(directory, name + ".key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", key, "-out", crt, "-days", "1",
             "-subj", "/CN=" + (cn or name),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _private(key)
    return crt, key


def make_cert(directory, name, ca, cn, sans=(), client=False, org=None):
    """Writes NAME.crt / NAME.key signed by ca=(crt, key).

    sans: e.g. ["IP:127.0.0.1", "DNS:localhost"]. client=True makes a TLS
    client certificate (how kubeconfig users authenticate: CN is the user
    name, O the group)."""
    crt = os.path.join(directory, name + ".crt")
    key = os.path.join(directory, name + ".key")
    csr = os.path.join(directory, name + ".csr")
    subj = "/CN=" + cn + ("/O=" + org if org else "")
    args = ["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", key, "-out", csr, "-subj", subj,
            "-addext", "basicConstraints=critical,CA:FALSE",
            "-addext", "extendedKeyUsage=" + ("clientAuth" if client else "serverAuth")]
    if sans:
        args += ["-addext", "subjectAltName=" + ",".join(sans)]
    _openssl(*args)
    _private(key)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1],
             "-CAcreateserial", "-out", crt, "-days", "1", "-copy_extensions", "copy")
    os.remove(csr)
    return crt, key


def main(argv):
    """CLI for tests written in other languages:
      testpki.py ca DIR NAME
      testpki.py cert DIR NAME CA_NAME CN [--client] [--san IP:127.0.0.1,DNS:x]
    Files land in DIR as NAME.crt / NAME.key."""
    import argparse
    p = argparse.ArgumentParser(prog="testpki.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("ca")
    c.add_argument("dir")
    c.add_argument("name")
    s = sub.add_parser("cert")
    s.add_argument("dir")
    s.add_argument("name")
    s.add_argument("ca_name")
    s.add_argument("cn")
    s.add_argument("--client", action="store_true")
    s.add_argument("--org")
    s.add_argument("--san", default="")
    a = p.parse_args(argv)
    if a.cmd == "ca":
        make_ca(a.dir, a.name)
    else:
        ca = (os.path.join(a.dir, a.ca_name + ".crt"), os.path.join(a.dir, a.ca_name + ".key"))
        make_cert(a.dir, a.name, ca, a.cn, [x for x in a.san.split(",") if x],
                  client=a.client, org=a.org)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
