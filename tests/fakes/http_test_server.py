"""A small HTTP/HTTPS server on loopback for testing factory::net::HttpClient.

Stands in for the peers the client talks to (Kubernetes API, coordinator,
Ollama) at the protocol level only: real TCP, real TLS (Python's ssl module,
i.e. OpenSSL), real chunked encoding, real close-delimited bodies and a peer
that closes without TLS close_notify. It has no application logic.

  /usr/bin/python3 http_test_server.py --port-file F [--bind ::1]
      [--cert C --key K [--client-ca CA --client-auth optional|required]]

Endpoints: /echo, /status/CODE, /stream?lines=N&delay_ms=D, /stream-drop?lines=N,
/close-delimited, /big?bytes=N, /big-chunked?bytes=N, /sleep?ms=N, /whoami.
"""
import argparse
import json
import os
import socket
import ssl
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("http_test_server: " + (fmt % args) + "\n")

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _handle(self):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        body = self._body()
        if u.path == "/echo":
            doc = {"method": self.command, "path": self.path,
                   "headers": {k.lower(): v for k, v in self.headers.items()},
                   "body": body.decode("utf-8", "replace")}
            self._send(200, json.dumps(doc).encode())
        elif u.path.startswith("/status/"):
            code = int(u.path.split("/")[2])
            self._send(code, ("status %d" % code).encode(), "text/plain")
        elif u.path in ("/stream", "/stream-drop"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(int(q.get("lines", "3"))):
                self._chunk(json.dumps({"n": i}).encode() + b"\n")
                time.sleep(int(q.get("delay_ms", "0")) / 1000.0)
            if u.path == "/stream":
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            else:
                self._abort()
        elif u.path == "/close-delimited":
            # HTTP/1.0 style: no length, the close ends the body, and no TLS
            # close_notify before it (what many servers do).
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            self.wfile.write(b"body until close")
            self.wfile.flush()
            self._abort()
        elif u.path == "/big":
            n = int(q["bytes"])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            try:
                while n > 0:
                    k = min(n, 1 << 20)
                    self.wfile.write(b"x" * k)
                    n -= k
            except OSError:
                pass  # the client gave up (the body cap), as expected
            self.close_connection = True
        elif u.path == "/big-chunked":
            n = int(q["bytes"])
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while n > 0:
                    k = min(n, 1 << 20)
                    self._chunk(b"y" * k)
                    n -= k
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass
            self.close_connection = True
        elif u.path == "/sleep":
            time.sleep(int(q.get("ms", "1000")) / 1000.0)
            self._send(200, b"slept", "text/plain")
        elif u.path == "/whoami":
            cn = "anonymous"
            if isinstance(self.connection, ssl.SSLSocket):
                cert = self.connection.getpeercert()
                if cert:
                    for rdn in cert.get("subject", ()):
                        for k, v in rdn:
                            if k == "commonName":
                                cn = v
            self._send(200, cn.encode(), "text/plain")
        else:
            self._send(404, b"no such endpoint", "text/plain")

    def _abort(self):
        # Close the TCP connection under TLS without close_notify.
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class Server(ThreadingHTTPServer):
    daemon_threads = True
    ssl_context = None

    def __init__(self, addr, family):
        self.address_family = family
        super().__init__(addr, Handler)

    def finish_request(self, request, client_address):
        # The TLS handshake happens here, in the connection's own thread, so a
        # slow or broken client never blocks accept().
        if self.ssl_context is not None:
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as e:
                sys.stderr.write("http_test_server: TLS handshake failed: %s\n" % e)
                return
        super().finish_request(request, client_address)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--client-ca")
    p.add_argument("--client-auth", choices=["optional", "required"], default="optional")
    a = p.parse_args()
    family = socket.AF_INET6 if ":" in a.bind else socket.AF_INET
    srv = Server((a.bind, a.port), family)
    if a.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.cert, a.key)
        if a.client_ca:
            ctx.load_verify_locations(a.client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED if a.client_auth == "required" else ssl.CERT_OPTIONAL
        srv.ssl_context = ctx
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
