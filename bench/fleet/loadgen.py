#!/usr/bin/python3
"""Agent sessions against a coordinator (or the Node baseline), as agents open them.

A library for run.py and a small command of its own. Standard library only
(asyncio + ssl); the PKI parts live in identities.py.

What a session does, as factory-agent does (agent/link/link.cpp):
  * connects over TLS 1.3 with its client certificate (mTLS) from one of
    several loopback source addresses, upgrades to a websocket on /v1/agent;
  * sends `hello` and waits for `welcome` (which names the last stored event id);
  * while a load is on: a `health` frame (the real H200 sample) every
    health_interval, a `heartbeat` every heartbeat interval, a durable
    `event` (progress) every event_interval with increasing ids;
  * answers pings, reads acks, and after a drop reconnects with the agent's
    shipped backoff (common/backoff.cpp: full jitter, 500 ms base, 2 min cap).

Enrollment (`enroll` frame with a bootstrap token and a CSR over a connection
without a certificate) and token issue (POST /v1/tokens) are here too.
"""
from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import base64
import heapq
import json
import os
import random
import ssl
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

# asyncio's TLS transport reads into a buffer of this size per connection
# (256 KiB by default in 3.11): 2.5 GiB of the load generator's own memory at
# 10,000 sessions. A TLS record carries at most 16 KiB.
asyncio.sslproto.SSLProtocol.max_size = 32 * 1024

AGENT_PATH = "/v1/agent"
SLOW_MS = 250.0  # an ack later than this is listed by when its event was sent
AGENT_VERSION = "0.1.0-bench"

# The agent's shipped reconnect policy (agent/link/link.hpp, common/backoff.cpp).
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 120.0


def backoff_delay(attempt: int) -> float:
    """Full jitter: uniform(0, min(cap, base * 2^attempt)), as Backoff::next()."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * (1 << min(attempt, 30)))
    return random.uniform(0.0, ceiling)


def rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- websocket framing (RFC 6455, client side: frames masked) ---------------

OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10


def ws_frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    mask = os.urandom(4)
    if n:
        m = (mask * (n // 4 + 1))[:n]
        payload = (int.from_bytes(payload, "little") ^ int.from_bytes(m, "little")).to_bytes(n, "little")
    return head + mask + payload


async def ws_read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One whole message (continuations joined); server frames are unmasked."""
    opcode, data = None, b""
    while True:
        h = await reader.readexactly(2)
        fin, op, n = h[0] & 0x80, h[0] & 0x0F, h[1] & 0x7F
        if n == 126:
            n = int.from_bytes(await reader.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await reader.readexactly(8), "big")
        mask = await reader.readexactly(4) if h[1] & 0x80 else None
        p = await reader.readexactly(n) if n else b""
        if mask:
            m = (mask * (n // 4 + 1))[:n]
            p = (int.from_bytes(p, "little") ^ int.from_bytes(m, "little")).to_bytes(n, "little")
        if op >= 8:  # control frames may come between fragments
            return op, p
        if opcode is None:
            opcode = op
        data += p
        if fin:
            return opcode, data


async def read_http_head(reader: asyncio.StreamReader) -> tuple[int, dict, str]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers, lines[0]


async def ws_open(host: str, port: int, ctx: ssl.SSLContext, source: Optional[str],
                  path: str = AGENT_PATH, timeout: float = 30.0):
    """TLS connect + websocket upgrade. Returns (reader, writer)."""
    local = (source, 0) if source else None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=ctx, local_addr=local,
                                server_hostname="127.0.0.1", limit=1 << 20),
        timeout)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      f"Sec-WebSocket-Version: 13\r\nUser-Agent: factory-agent/{AGENT_VERSION}\r\n\r\n")
                     .encode())
        status, _, line = await asyncio.wait_for(read_http_head(reader), timeout)
        if status != 101:
            raise ConnectionError(f"websocket upgrade refused: {line}")
        return reader, writer
    except BaseException:
        writer.close()
        raise


def envelope(type_: str, seq: int, body_json: str) -> bytes:
    return ('{"v":1,"type":"%s","seq":%d,"body":%s}' % (type_, seq, body_json)).encode()


# --- a tiny HTTP/1.1 client (keep-alive) for the admin API -------------------

class HttpConn:
    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, bearer: str = ""):
        self.host, self.port, self.ctx, self.bearer = host, port, ctx, bearer
        self.reader = self.writer = None

    async def _ensure(self):
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.ctx, server_hostname="127.0.0.1", limit=1 << 22)

    async def request(self, method: str, path: str, body: Optional[dict] = None,
                      timeout: float = 60.0) -> tuple[int, bytes]:
        await self._ensure()
        data = json.dumps(body).encode() if body is not None else b""
        h = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if self.bearer:
            h += f"Authorization: Bearer {self.bearer}\r\n"
        if body is not None:
            h += "Content-Type: application/json\r\n"
        h += f"Content-Length: {len(data)}\r\n\r\n"
        self.writer.write(h.encode() + data)
        status, headers, _ = await asyncio.wait_for(read_http_head(self.reader), timeout)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                out += chunk[:-2]
        else:
            out = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, out

    def close(self):
        if self.writer:
            self.writer.close()
        self.writer = None


def client_context(ca_pem: str, certfile: Optional[str] = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(cadata=ca_pem)
    if certfile:
        ctx.load_cert_chain(certfile)
    return ctx


# --- the live feed (SSE) -------------------------------------------------------

class FeedReader:
    """GET /v1/events (Server-Sent Events); on each progress event whose
    message carries "bench <monotonic_ns>", records send-to-feed latency."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, bearer: str):
        self.host, self.port, self.ctx, self.bearer = host, port, ctx, bearer
        self.latencies_ms: list[float] = []
        self.events = 0
        self.task: Optional[asyncio.Task] = None
        self.error = ""
        self.connected = asyncio.Event()

    def start(self):
        self.task = asyncio.create_task(self._run())

    async def _lines(self, reader, chunked):
        buf = b""
        while True:
            if chunked:
                size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    return
                buf += data[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    return
                buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line

    async def _run(self):
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.ctx, server_hostname="127.0.0.1", limit=1 << 22)
            writer.write((f"GET /v1/events HTTP/1.1\r\nHost: {self.host}\r\n"
                          f"Authorization: Bearer {self.bearer}\r\nAccept: text/event-stream\r\n\r\n")
                         .encode())
            status, headers, line = await read_http_head(reader)
            if status != 200:
                self.error = f"GET /v1/events: {line}"
                return
            self.connected.set()
            chunked = headers.get("transfer-encoding", "").lower() == "chunked"
            async for raw in self._lines(reader, chunked):
                if not raw.startswith(b"data:"):
                    continue
                i = raw.find(b'"message":"bench ')
                self.events += 1
                if i < 0:
                    continue
                j = i + len(b'"message":"bench ')
                k = raw.find(b'"', j)
                try:
                    sent = int(raw[j:k])
                except ValueError:
                    continue
                self.latencies_ms.append((time.monotonic_ns() - sent) / 1e6)
            self.error = "the feed ended"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # reported by the runner
            self.error = f"feed: {type(e).__name__}: {e}"

    def take(self) -> list[float]:
        out, self.latencies_ms = self.latencies_ms, []
        return out

    def stop(self):
        if self.task:
            self.task.cancel()


# --- the load generator's own lateness ---------------------------------------------------

class LoopLag:
    """How late this process's event loop runs what it scheduled: a latency
    figure includes it (the load generator shares the machine's cores), so
    the runner prints it beside the latencies."""

    def __init__(self, period: float = 0.05):
        self.period = period
        self.lags_ms: list[float] = []
        self.task: Optional[asyncio.Task] = None

    def start(self):
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        while True:
            t = time.monotonic()
            await asyncio.sleep(self.period)
            self.lags_ms.append(max(0.0, (time.monotonic() - t - self.period) * 1000))

    def take(self) -> list[float]:
        out, self.lags_ms = self.lags_ms, []
        return out

    def stop(self):
        if self.task:
            self.task.cancel()


# --- sessions ---------------------------------------------------------------------

@dataclass
class Identity:
    tenant: str
    certfile: str  # PEM: leaf certificate, CA, private key
    _ctx: Optional[ssl.SSLContext] = None

    def context(self, ca_pem: str) -> ssl.SSLContext:
        if self._ctx is None:
            self._ctx = client_context(ca_pem, self.certfile)
        return self._ctx


@dataclass
class Target:
    name: str
    host: str
    port: int
    ca_pem: str
    sources: list[str]


@dataclass
class Stats:
    sent: dict = field(default_factory=lambda: {"health": 0, "heartbeat": 0, "event": 0})
    acks_event: int = 0
    acks_other: int = 0
    errors: dict = field(default_factory=dict)
    ack_latencies_ms: list = field(default_factory=list)
    backpressure: int = 0
    slow_sends: list = field(default_factory=list)  # monotonic send times of acks slower than SLOW_MS

    def error(self, what: str):
        self.errors[what] = self.errors.get(what, 0) + 1


class Session:
    def __init__(self, fleet: "Fleet", ident: Identity, index: int):
        self.fleet, self.ident, self.index = fleet, ident, index
        self.reader = self.writer = None
        self.seq = 0
        self.next_event_id = 1
        self.in_flight: dict[int, int] = {}  # event id -> monotonic_ns sent
        self.welcomed = False
        self.task: Optional[asyncio.Task] = None
        self.flood_window = 0

    @property
    def source(self) -> str:
        s = self.fleet.target.sources
        return s[self.index % len(s)]

    async def connect(self) -> None:
        t = self.fleet.target
        ctx = self.ident.context(t.ca_pem)
        self.reader, self.writer = await ws_open(t.host, t.port, ctx, self.source)
        self.seq = 0
        hello = json.dumps({"agent_version": AGENT_VERSION, "hostname": self.ident.tenant})
        self.send("hello", hello)
        while True:
            op, data = await asyncio.wait_for(ws_read_frame(self.reader), 30)
            if op == OP_PING:
                self.writer.write(ws_frame(OP_PONG, data))
                continue
            if op == OP_CLOSE:
                raise ConnectionError(f"closed before welcome: {data[2:].decode(errors='replace')}")
            if op != OP_TEXT:
                continue
            j = json.loads(data)
            if j.get("type") == "error":
                raise ConnectionError(f"error before welcome: {j.get('body')}")
            if j.get("type") == "welcome":
                last = int(j.get("body", {}).get("last_event_id", 0) or 0)
                self.next_event_id = max(self.next_event_id, last + 1)
                self.in_flight.clear()
                self.welcomed = True
                return

    def send(self, type_: str, body_json: str) -> bool:
        if self.writer is None or self.writer.is_closing():
            return False
        if self.writer.transport.get_write_buffer_size() > (1 << 20):
            self.fleet.stats.backpressure += 1
            return False
        self.seq += 1
        self.writer.write(ws_frame(OP_TEXT, envelope(type_, self.seq, body_json)))
        return True

    def send_event(self) -> None:
        now = time.monotonic_ns()
        eid = self.next_event_id
        body = ('{"id":%d,"kind":"progress","time":"%s","step":"bench","state":"progress",'
                '"message":"bench %d","percent":%d}' % (eid, rfc3339_now(), now, eid % 100))
        if self.send("event", body):
            self.next_event_id += 1
            self.in_flight[eid] = now
            self.fleet.stats.sent["event"] += 1

    async def read_loop(self) -> None:
        """Reads until the connection ends, then (if the fleet says so)
        reconnects with the agent's backoff."""
        while True:
            try:
                while True:
                    op, data = await ws_read_frame(self.reader)
                    if op == OP_PING:
                        self.writer.write(ws_frame(OP_PONG, data))
                    elif op == OP_CLOSE:
                        break
                    elif op == OP_TEXT:
                        self.on_text(data)
            except (asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError):
                pass
            self.welcomed = False
            if self.writer:
                self.writer.close()
            self.writer = None
            self.fleet.on_down(self)
            if not self.fleet.reconnect:
                return
            attempt = 0
            while self.fleet.reconnect:
                await asyncio.sleep(backoff_delay(attempt))
                attempt += 1
                if not self.fleet.reconnect:
                    return
                try:
                    await self.connect()
                    break
                except (asyncio.TimeoutError, ConnectionError, OSError, ssl.SSLError,
                        asyncio.IncompleteReadError) as e:
                    self.fleet.stats.error(f"reconnect: {type(e).__name__}")  # the current window's
                    if self.writer:
                        self.writer.close()
                    self.writer = None
            else:
                return
            self.fleet.on_up(self)

    def on_text(self, data: bytes) -> None:
        st = self.fleet.stats
        # The acks are the hot path: no JSON parse unless it is something else.
        # (The coordinator's keys come sorted: {"ack":..,"body":..,"seq":..,"type":"ack","v":1}.)
        if len(data) < 256 and b'"type":"ack"' in data:
            i = data.find(b'"event_id":')
            if i < 0:
                st.acks_other += 1
                return
            j = i + 11
            k = j
            while k < len(data) and 48 <= data[k] <= 57:
                k += 1
            eid = int(data[j:k])
            st.acks_event += 1
            # Acks are cumulative: everything up to eid is stored.
            now = time.monotonic_ns()
            for e in [e for e in self.in_flight if e <= eid]:
                sent = self.in_flight.pop(e)
                ms = (now - sent) / 1e6
                st.ack_latencies_ms.append(ms)
                if ms > SLOW_MS:
                    st.slow_sends.append(sent / 1e9)
            if self.flood_window and self.fleet.flooding:
                while len(self.in_flight) < self.flood_window:
                    self.send_event()
            return
        try:
            j = json.loads(data)
        except ValueError:
            st.error("bad json from server")
            return
        t = j.get("type")
        if t == "error":
            st.error("error frame: " + str(j.get("body", {}).get("code")))


class Fleet:
    """N sessions against one target, and the load they put on it."""

    def __init__(self, target: Target, identities: list[Identity], health_body: str,
                 health_interval: float = 10.0, heartbeat_interval: float = 15.0,
                 event_interval: float = 30.0, connect_concurrency: int = 64):
        self.target = target
        self.identities = identities
        self.health_body = health_body
        self.health_interval = health_interval
        self.heartbeat_interval = heartbeat_interval
        self.event_interval = event_interval
        self.connect_concurrency = connect_concurrency
        self.sessions: list[Session] = []
        self.stats = Stats()
        self.reconnect = True
        self.flooding = False
        self.up = 0
        self.up_changed: Optional[Callable[[int], None]] = None

    def on_down(self, s: Session):
        self.up -= 1

    def on_up(self, s: Session):
        self.up += 1
        if self.up_changed:
            self.up_changed(self.up)

    async def grow(self, n: int) -> dict:
        """Connects sessions until n are open. Returns counts and wall time."""
        sem = asyncio.Semaphore(self.connect_concurrency)
        failures: dict[str, int] = {}

        async def one(s: Session):
            async with sem:
                for attempt in range(5):
                    try:
                        await s.connect()
                        self.up += 1
                        s.task = asyncio.create_task(s.read_loop())
                        return True
                    except (asyncio.TimeoutError, ConnectionError, OSError, ssl.SSLError,
                            asyncio.IncompleteReadError) as e:
                        key = f"{type(e).__name__}: {str(e)[:80]}"
                        failures[key] = failures.get(key, 0) + 1
                        if s.writer:
                            s.writer.close()
                        s.writer = None
                        await asyncio.sleep(backoff_delay(attempt))
                return False

        start = len(self.sessions)
        if n > len(self.identities):
            raise ValueError(f"{n} sessions wanted, only {len(self.identities)} identities")
        new = [Session(self, self.identities[i], i) for i in range(start, n)]
        t0 = time.monotonic()
        ok = await asyncio.gather(*(one(s) for s in new))
        wall = time.monotonic() - t0
        self.sessions.extend(s for s, good in zip(new, ok) if good)
        return {"opened": sum(ok), "wanted": len(new), "wall_s": wall, "failures": failures}

    def health_frame_body(self, s: Session) -> str:
        return self.health_body.replace("@TIME@", rfc3339_now()).replace("@HOST@", s.ident.tenant)

    async def load(self, seconds: float) -> None:
        """The steady load: every session on its own phase of each period."""
        heap = []
        now = time.monotonic()
        periods = {"health": self.health_interval, "heartbeat": self.heartbeat_interval,
                   "event": self.event_interval}
        for i, s in enumerate(self.sessions):
            for kind, p in periods.items():
                if p > 0:
                    heap.append((now + random.uniform(0, p), i, kind))
        heapq.heapify(heap)
        end = now + seconds
        st = self.stats
        while heap:
            now = time.monotonic()
            if now >= end:
                break
            while heap and heap[0][0] <= now:
                due, i, kind = heapq.heappop(heap)
                s = self.sessions[i]
                if s.welcomed:
                    if kind == "event":
                        s.send_event()
                    elif kind == "health":
                        if s.send("health", self.health_frame_body(s)):
                            st.sent["health"] += 1
                    else:
                        if s.send("heartbeat", '{"pending_events":0,"dropped_events":0}'):
                            st.sent["heartbeat"] += 1
                heapq.heappush(heap, (due + periods[kind], i, kind))
            wait = min(heap[0][0], end) - time.monotonic() if heap else 0
            await asyncio.sleep(max(0.0, wait))

    async def flood(self, sessions: int, window: int, seconds: float) -> None:
        """Durable events as fast as acks come back: `window` in flight per session."""
        chosen = [s for s in self.sessions if s.welcomed][:sessions]
        self.flooding = True
        for s in chosen:
            s.flood_window = window
            while len(s.in_flight) < window:
                s.send_event()
        await asyncio.sleep(seconds)
        self.flooding = False
        for s in chosen:
            s.flood_window = 0
        await asyncio.sleep(1.0)  # the last acks

    async def close_all(self) -> None:
        self.reconnect = False
        for s in self.sessions:
            if s.writer:
                try:
                    s.writer.write(ws_frame(OP_CLOSE, (1000).to_bytes(2, "big") + b"stopping"))
                except Exception:
                    pass
                s.writer.close()
        for s in self.sessions:
            if s.task:
                s.task.cancel()
        await asyncio.sleep(0.5)
        self.sessions = []
        self.up = 0


# --- enrollment and tokens --------------------------------------------------------

async def issue_token(api: HttpConn, tenant: str, ttl: str = "2h") -> dict:
    status, body = await api.request("POST", "/v1/tokens", {"tenant": tenant, "ttl": ttl})
    if status != 201:
        raise RuntimeError(f"POST /v1/tokens for {tenant}: HTTP {status}: {body[:200]!r}")
    return json.loads(body)


async def enroll(host: str, port: int, ca_pem: str, token: str, csr_pem: str, source: str,
                 hostname: str, ctx: Optional[ssl.SSLContext] = None) -> dict:
    """An agent's first connection: no certificate, one enroll frame."""
    ctx = ctx or client_context(ca_pem)
    reader, writer = await ws_open(host, port, ctx, source)
    try:
        body = json.dumps({"token": token, "csr": csr_pem, "agent_version": AGENT_VERSION,
                           "hostname": hostname})
        writer.write(ws_frame(OP_TEXT, envelope("enroll", 1, body)))
        while True:
            op, data = await asyncio.wait_for(ws_read_frame(reader), 60)
            if op == OP_CLOSE:
                raise ConnectionError(f"closed: {data[2:].decode(errors='replace')}")
            if op != OP_TEXT:
                continue
            j = json.loads(data)
            if j.get("type") == "enrolled":
                return j["body"]
            if j.get("type") == "error":
                raise ConnectionError(f"enrollment refused: {j.get('body')}")
    finally:
        writer.close()


def load_health_body(path: str) -> str:
    """The fixture's sample as a health frame's body, with @TIME@ and @HOST@
    placeholders. nvml_raw is the capture's own debugging dump, not part of
    what the agent sends (contract/health_sample.hpp lists the keys)."""
    with open(path) as f:
        sample = json.load(f)
    sample.pop("nvml_raw", None)
    sample["time"] = "@TIME@"
    sample["hostname"] = "@HOST@"
    return json.dumps(sample, separators=(",", ":"))


def percentile(values: list[float], p: float) -> Optional[float]:
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


# --- command line: N sessions against a running server ----------------------------

def main() -> int:
    ap = argparse.ArgumentParser(
        description="Open N agent sessions (identities from identities.py) against a running "
                    "coordinator or baseline, put the steady load on them, print what came back. "
                    "run.py drives this for the benchmark; this command is for trying one target.")
    ap.add_argument("--port", type=int, required=True, help="agent port on 127.0.0.1")
    ap.add_argument("--ca", required=True, help="CA certificate (PEM) the server's chain ends in")
    ap.add_argument("--ids", required=True, help="identity folder (identities.py provision)")
    ap.add_argument("-n", type=int, default=10, help="sessions (default 10)")
    ap.add_argument("--seconds", type=float, default=20, help="load duration (default 20)")
    ap.add_argument("--health", required=True, help="health sample JSON (the H200 fixture)")
    ap.add_argument("--sources", type=int, default=8, help="source addresses 127.0.0.2.. (8)")
    a = ap.parse_args()
    for p in (a.ca, a.ids, a.health):
        if not os.path.exists(p):
            print(f"loadgen: {p} does not exist", file=sys.stderr)
            return 2
    ca = open(a.ca).read()
    names = sorted(f for f in os.listdir(a.ids) if f.endswith(".pem"))[: a.n]
    if len(names) < a.n:
        print(f"loadgen: only {len(names)} identities in {a.ids}", file=sys.stderr)
        return 2
    ids = [Identity(f[:-4], os.path.join(a.ids, f)) for f in names]
    target = Target("cli", "127.0.0.1", a.port, ca,
                    [f"127.0.0.{2 + i}" for i in range(a.sources)])

    async def run():
        fleet = Fleet(target, ids, load_health_body(a.health))
        g = await fleet.grow(a.n)
        print("connect:", g)
        await fleet.load(a.seconds)
        await asyncio.sleep(1)
        print("sent:", fleet.stats.sent, "event acks:", fleet.stats.acks_event,
              "other acks:", fleet.stats.acks_other, "errors:", fleet.stats.errors)
        lat = fleet.stats.ack_latencies_ms
        print("ack latency ms p50/p99:", percentile(lat, 50), percentile(lat, 99))
        await fleet.close_all()
        return 0 if g["opened"] == a.n else 1

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
