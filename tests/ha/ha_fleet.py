#!/usr/bin/python3
"""Agents spread over several coordinator replicas, for the HA test
(tests/integration/ha_test.cpp).

Each agent here does what factory-agent's link does where it matters to a
failover (agent/link/link.cpp, agent/link/spool.cpp):
  * enrolls once through the protocol (a token issued by one replica, the
    enrollment sent to another: the token book and the CA are shared);
  * keeps a durable spool: every event it sends stays until an ack covers it
    (acks are cumulative), and after a reconnection it resends what the
    welcome's last_event_id says is not stored, in order;
  * reconnects after a drop with the agent's shipped backoff (full jitter,
    500 ms base), each attempt to the next replica in its list: the list
    stands in for the Kubernetes Service in front of the replicas, which
    sends a new connection to a live pod.

The bench's load generator (bench/fleet/loadgen.py) supplies the TLS,
websocket and enrollment code; identities.py makes the CSRs.

It writes a status file (--status) as it goes, so the test knows when every
agent is up and when they are back, and a result file (--out) at the end:
per tenant the ids it sent and had acknowledged, and per drop how long the
agent was away.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "fleet"))
import identities  # noqa: E402
import loadgen  # noqa: E402


class Agent:
    def __init__(self, run: "Run", tenant: str, index: int):
        self.run, self.tenant, self.index = run, tenant, index
        self.certfile = ""
        self.ctx: ssl.SSLContext | None = None
        self.replica = index % len(run.agents)  # where it connects first
        self.next_id = 1
        self.unacked: dict[int, str] = {}  # id -> body, oldest first (dicts keep order)
        self.acked = 0  # the highest id an ack covered
        self.writer = None
        self.seq = 0
        self.up = False
        self.down_since: float | None = None
        self.outages: list[float] = []  # seconds each drop lasted
        self.connects = 0

    def send(self, type_: str, body: str) -> bool:
        if self.writer is None or self.writer.is_closing():
            return False
        self.seq += 1
        self.writer.write(loadgen.ws_frame(loadgen.OP_TEXT, loadgen.envelope(type_, self.seq, body)))
        return True

    def new_event(self) -> None:
        eid = self.next_id
        self.next_id += 1
        body = ('{"id":%d,"kind":"progress","time":"%s","step":"ha","state":"progress",'
                '"message":"ha %d","percent":%d}' % (eid, loadgen.rfc3339_now(), eid, eid % 100))
        self.unacked[eid] = body
        if self.up:
            self.send("event", body)

    async def enroll(self, ca_pem: str, token: str) -> None:
        csr, key = identities.make_csr(self.tenant)
        host, port = self.run.agents[(self.index + 1) % len(self.run.agents)]
        body = await loadgen.enroll(host, port, ca_pem, token, csr, "127.0.0.1", self.tenant)
        fd, path = tempfile.mkstemp(prefix=self.tenant + "-", suffix=".pem", dir=self.run.workdir)
        with os.fdopen(fd, "w") as f:
            f.write(body["certificate"] + ca_pem + key)
        self.certfile = path
        self.ctx = loadgen.client_context(ca_pem, path)

    async def connect_once(self) -> None:
        host, port = self.run.agents[self.replica]
        reader, writer = await loadgen.ws_open(host, port, self.ctx, "127.0.0.1", timeout=10)
        self.writer, self.seq = writer, 0
        self.send("hello", json.dumps({"agent_version": loadgen.AGENT_VERSION,
                                       "hostname": self.tenant}))
        while True:
            op, data = await asyncio.wait_for(loadgen.ws_read_frame(reader), 15)
            if op == loadgen.OP_PING:
                writer.write(loadgen.ws_frame(loadgen.OP_PONG, data))
                continue
            if op == loadgen.OP_CLOSE:
                raise ConnectionError("closed before welcome")
            if op != loadgen.OP_TEXT:
                continue
            j = json.loads(data)
            if j.get("type") == "error":
                raise ConnectionError(f"error before welcome: {j.get('body')}")
            if j.get("type") == "welcome":
                stored = int(j.get("body", {}).get("last_event_id", 0) or 0)
                self.on_stored(stored)
                break
        self.up = True
        self.connects += 1
        if self.down_since is not None:
            self.outages.append(time.monotonic() - self.down_since)
            self.down_since = None
        for body in list(self.unacked.values()):  # the spool's replay, in order
            self.send("event", body)
        await self.read_loop(reader)

    def on_stored(self, upto: int) -> None:
        if upto > self.acked:
            self.acked = upto
        for eid in [e for e in self.unacked if e <= upto]:
            del self.unacked[eid]

    async def read_loop(self, reader) -> None:
        try:
            while True:
                op, data = await loadgen.ws_read_frame(reader)
                if op == loadgen.OP_PING:
                    self.writer.write(loadgen.ws_frame(loadgen.OP_PONG, data))
                elif op == loadgen.OP_CLOSE:
                    return
                elif op == loadgen.OP_TEXT and b'"type":"ack"' in data:
                    j = json.loads(data)
                    eid = j.get("body", {}).get("event_id")
                    if isinstance(eid, int):
                        self.on_stored(eid)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError):
            return

    async def life(self) -> None:
        attempt = 0
        while not self.run.stopping:
            try:
                await self.connect_once()
                attempt = 0
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError,
                    ssl.SSLError) as e:
                self.run.errors[type(e).__name__] = self.run.errors.get(type(e).__name__, 0) + 1
            if self.writer:
                self.writer.close()
                self.writer = None
            if self.up or self.down_since is None:
                self.down_since = time.monotonic()
            self.up = False
            if self.run.stopping:
                return
            # The next replica (what the Service would pick for a new
            # connection while this one's pod is gone), after the backoff.
            self.replica = (self.replica + 1) % len(self.run.agents)
            await asyncio.sleep(loadgen.backoff_delay(attempt))
            attempt += 1


class Run:
    def __init__(self, args):
        self.agents = [hp(x) for x in args.agents.split(",")]
        self.apis = [hp(x) for x in args.apis.split(",")]
        self.workdir = args.workdir
        self.stopping = False
        self.errors: dict[str, int] = {}


def hp(s: str) -> tuple[str, int]:
    h, p = s.rsplit(":", 1)
    return h, int(p)


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


async def main_async(args) -> int:
    run = Run(args)
    ca_pem = open(args.ca).read()
    token = open(args.admin_token_file).read().strip()
    ctx = loadgen.client_context(ca_pem)
    agents = [Agent(run, "%s%03d" % (args.prefix, i), i) for i in range(args.count)]

    # Enrollment: tokens from the replicas in turn, each enrollment sent to
    # the next replica, a few at a time.
    apis = [loadgen.HttpConn(h, p, ctx, token) for h, p in run.apis]
    sem = asyncio.Semaphore(16)
    t0 = time.monotonic()

    # HttpConn is one connection: serialize per API by issuing tokens first.
    tokens = []
    for a in agents:
        tokens.append(await loadgen.issue_token(apis[a.index % len(apis)], a.tenant))

    async def enroll_with(a: Agent, tok: dict):
        async with sem:
            await a.enroll(ca_pem, tok["token"])

    await asyncio.gather(*(enroll_with(a, t) for a, t in zip(agents, tokens)))
    for api in apis:
        api.close()
    enrolled_s = time.monotonic() - t0

    tasks = [asyncio.create_task(a.life()) for a in agents]
    started = time.monotonic()
    stop_at = started + args.seconds

    def status(phase: str) -> dict:
        up = sum(1 for a in agents if a.up)
        return {"phase": phase, "up": up, "count": len(agents),
                "down_now": [a.tenant for a in agents if not a.up][:10],
                "sent": sum(a.next_id - 1 for a in agents),
                "unacked": sum(len(a.unacked) for a in agents),
                "by_replica": [sum(1 for a in agents if a.up and a.replica == r)
                               for r in range(len(run.agents))],
                "elapsed_s": round(time.monotonic() - started, 3)}

    # The load: each agent an event every interval, spread over the interval.
    next_tick = {a.tenant: started + random.uniform(0, args.event_interval) for a in agents}
    last_status = 0.0
    while time.monotonic() < stop_at and not os.path.exists(args.stop_file):
        now = time.monotonic()
        for a in agents:
            if now >= next_tick[a.tenant]:
                a.new_event()
                next_tick[a.tenant] += args.event_interval
        if now - last_status >= 0.2:
            write_json(args.status, status("load"))
            last_status = now
        await asyncio.sleep(0.02)

    # Drain: no new events; every agent reconnected and every event acked.
    drain_until = time.monotonic() + args.drain_seconds
    while time.monotonic() < drain_until:
        if all(a.up and not a.unacked for a in agents):
            break
        write_json(args.status, status("drain"))
        await asyncio.sleep(0.1)
    write_json(args.status, status("done"))
    run.stopping = True
    for a in agents:
        if a.writer:
            a.writer.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    outages = sorted(o for a in agents for o in a.outages)
    result = {
        "agents": len(agents),
        "enrolled_s": round(enrolled_s, 3),
        "tenants": {a.tenant: {"sent": a.next_id - 1, "acked": a.acked,
                               "unacked": len(a.unacked), "connects": a.connects,
                               "outages_s": [round(o, 3) for o in a.outages]}
                    for a in agents},
        "events_sent": sum(a.next_id - 1 for a in agents),
        "events_acked": sum(a.acked for a in agents),
        "drops": len(outages),
        "outage_max_s": round(outages[-1], 3) if outages else 0.0,
        "outage_p50_s": round(outages[len(outages) // 2], 3) if outages else 0.0,
        "still_down": [a.tenant for a in agents if a.down_since is not None],
        "errors": run.errors,
    }
    write_json(args.out, result)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", required=True, help="agents endpoints, host:port,host:port,...")
    p.add_argument("--apis", required=True, help="admin API endpoints, host:port,...")
    p.add_argument("--ca", required=True, help="the coordinators' CA certificate (PEM)")
    p.add_argument("--admin-token-file", required=True)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--prefix", default="ha-")
    p.add_argument("--event-interval", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=60.0, help="how long the load runs at most")
    p.add_argument("--stop-file", required=True, help="the load ends early once this file exists")
    p.add_argument("--drain-seconds", type=float, default=60.0)
    p.add_argument("--status", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
