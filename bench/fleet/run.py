#!/usr/bin/python3
"""The fleet benchmark (issue 14): a real `factory serve` and a Node.js
baseline on loopback, the same agent load on both, one table.

    /usr/bin/python3 bench/fleet/run.py --build-dir build      (make bench-fleet)

Phases, in one run:
  1. rollout: a fresh coordinator; R bootstrap tokens through the admin API
     (POST /v1/tokens), then R enrollments over the agent port (the enroll
     frame with a CSR), timed in buckets to show how the cost per item grows;
  2. provisioning: N_max agent identities issued in bulk by the coordinator's
     CA and recorded in its store while it is stopped (identities.py), a
     server certificate from the same CA for the baseline;
  3. one real factory-agent (no GPU) on the coordinator: its own footprint;
  4. for each target (factory, node): full (and resumed) TLS handshakes per
     server CPU second; then for N in the series: N mTLS sessions (hello,
     welcome), idle memory, then a steady load (health every T, heartbeat,
     durable progress events) with send-to-feed latency from GET /v1/events;
     a flood of durable events; a restart with every session reconnecting
     with the agent's backoff and jitter;
  5. the table: both figures and their ratios, against the issue's targets.

Needs: /usr/bin/python3 with python3-cryptography, node with node-ws, the
factory and factory-agent binaries. Exits 2 naming what is missing.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import loadgen  # noqa: E402
from loadgen import Fleet, FeedReader, HttpConn, Identity, Target, percentile  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
DEFAULT_FIXTURE = os.path.join(REPO, "tests/fixtures/device/h200-2026-12-01d/h200/agent-health.json")


def log(msg: str) -> None:
    print(msg, flush=True)


def die(msg: str) -> None:
    print(f"bench-fleet: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(2)


# --- /proc ------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def rss_kib(pid: int) -> int:
    return status_kib(pid, "VmRSS")


def write_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def slab_unreclaimable_kib() -> int:
    """The kernel's unreclaimable slab (sockets, their inodes, epoll items):
    /proc/meminfo SUnreclaim. Machine-wide: both ends of a loopback
    connection count, and so does whatever else runs."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("SUnreclaim:"):
                return int(line.split()[1])
    return 0


def loadavg() -> str:
    return open("/proc/loadavg").read().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- the servers ---------------------------------------------------------------------

class Coordinator:
    def __init__(self, binary: str, agent_binary: str, work: str):
        self.binary, self.work = binary, work
        self.state = os.path.join(work, "state")
        self.agents_port, self.api_port = free_port(), free_port()
        while self.api_port == self.agents_port:
            self.api_port = free_port()
        self.config = os.path.join(work, "coordinator.yaml")
        with open(self.config, "w") as f:
            f.write(f"state_dir: {self.state}\n"
                    f"external_url: wss://127.0.0.1:{self.agents_port}\n"
                    f"agents:\n  listen: 127.0.0.1:{self.agents_port}\n"
                    f"  binary: {agent_binary}\n"
                    f"api:\n  listen: 127.0.0.1:{self.api_port}\n"
                    "log_level: info\n")
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    def start(self, timeout: float = 120) -> float:
        self.starts += 1
        logf = open(os.path.join(self.work, f"coordinator.{self.starts}.log"), "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen([self.binary, "serve", "--config", self.config],
                                     stdout=logf, stderr=subprocess.STDOUT)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                die(f"factory serve exited ({self.proc.returncode}); see {logf.name}")
            if port_open(self.api_port) and port_open(self.agents_port):
                return time.monotonic() - t0
            time.sleep(0.05)
        die(f"factory serve did not listen within {timeout} s; see {logf.name}")

    def stop(self, timeout: float = 60) -> float:
        if not self.proc or self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def admin_token(self) -> str:
        return open(os.path.join(self.state, "admin.token")).read().strip()

    def ca_pem(self) -> str:
        return open(os.path.join(self.state, "ca.crt")).read()


class Baseline:
    def __init__(self, node: str, work: str, server_pem: str, ca_file: str, token: str):
        self.node, self.work = node, work
        self.server_pem, self.ca_file, self.token = server_pem, ca_file, token
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    def start(self, timeout: float = 30) -> float:
        self.starts += 1
        logf = open(os.path.join(self.work, f"baseline.{self.starts}.log"), "w")
        env = dict(os.environ, NODE_PATH="/usr/share/nodejs")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [self.node, os.path.join(HERE, "baseline_server.js"), "--port", str(self.port),
             "--cert", self.server_pem, "--ca", self.ca_file,
             "--events", os.path.join(self.work, "baseline-events.jsonl"), "--token", self.token],
            stdout=logf, stderr=subprocess.STDOUT, env=env)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                die(f"the Node baseline exited ({self.proc.returncode}); see {logf.name}")
            if port_open(self.port):
                return time.monotonic() - t0
            time.sleep(0.05)
        die(f"the Node baseline did not listen within {timeout} s; see {logf.name}")

    def stop(self, timeout: float = 60) -> float:
        if not self.proc or self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid


# --- results ---------------------------------------------------------------------------

@dataclass
class Step:
    n: int
    opened: int = 0
    connect_wall_s: float = 0
    connect_per_cpu_s: Optional[float] = None
    rss_idle_kib: float = 0
    rss_load_kib: float = 0
    slab_kib: float = 0
    msgs: int = 0
    msgs_per_s: float = 0
    cpu_s: float = 0
    cpu_per_1000: Optional[float] = None
    msgs_per_cpu_s: Optional[float] = None
    events_sent: int = 0
    events_acked: int = 0
    feed_n: int = 0
    feed_p50: Optional[float] = None
    feed_p99: Optional[float] = None
    ack_p50: Optional[float] = None
    ack_p99: Optional[float] = None
    lag_p50: Optional[float] = None
    lag_p99: Optional[float] = None
    errors: dict = field(default_factory=dict)


@dataclass
class TargetResult:
    name: str
    base_rss_kib: int = 0
    full_hs_per_cpu_s: Optional[float] = None
    resumed_hs_per_cpu_s: Optional[float] = None
    resumed_note: str = ""
    steps: list = field(default_factory=list)
    tls_only_kib: Optional[float] = None
    flood: dict = field(default_factory=dict)
    storm: dict = field(default_factory=dict)


# --- handshakes ------------------------------------------------------------------------

def handshake_loop(port: int, ctx: ssl.SSLContext, count: int, session=None,
                   source: str = "127.0.0.9") -> tuple[int, object]:
    """count sequential TLS handshakes (each followed by a one-line request so
    that TLS 1.3 tickets, if any, arrive). Returns (resumed, last session)."""
    resumed, last = 0, None
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session)
        try:
            s.sendall(b"GET /none HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            try:
                s.recv(65536)  # TLS 1.3 tickets come before the answer
            except (ssl.SSLError, OSError):
                pass
            if s.session_reused:
                resumed += 1
            last = s.session
        finally:
            s.close()
    return resumed, last


async def measure_handshakes(res: TargetResult, port: int, pid: int, ca: str, certfile: str,
                             count: int) -> None:
    ctx = loadgen.client_context(ca, certfile)
    await asyncio.to_thread(handshake_loop, port, ctx, 5)  # warm
    c0 = cpu_s(pid)
    _, sess = await asyncio.to_thread(handshake_loop, port, ctx, count)
    c1 = cpu_s(pid)
    res.full_hs_per_cpu_s = count / (c1 - c0) if c1 > c0 else None
    if sess is None or not getattr(sess, "has_ticket", False):
        res.resumed_note = "not supported (the server issues no session ticket)"
        return
    c0 = cpu_s(pid)
    resumed, _ = await asyncio.to_thread(handshake_loop, port, ctx, count, sess)
    c1 = cpu_s(pid)
    if resumed == 0:
        res.resumed_note = "not supported (0 resumed)"
        return
    res.resumed_hs_per_cpu_s = count / (c1 - c0) if c1 > c0 else None
    res.resumed_note = f"{resumed}/{count} resumed"


# --- a profile of the coordinator under the largest load ----------------------------------

def start_perf(pid: int, data: str, seconds: float) -> subprocess.Popen:
    """perf record over the load window. This machine kind has no hardware
    counters (perf stat -e instructions: not supported), so it samples the
    software cpu-clock, which needs none."""
    log(f"    perf record -e cpu-clock -F 499 -g -p {pid} over {seconds:.0f} s -> {data}")
    return subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "499", "-g", "-p", str(pid),
                             "-o", data, "--", "sleep", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish_perf(p: subprocess.Popen, data: str) -> None:
    p.wait()
    report = data + ".txt"
    views = [("symbol", ["--sort", "symbol", "--percent-limit", "0.4"]),
             ("shared object", ["--sort", "dso"]),
             ("thread", ["--sort", "pid", "--percent-limit", "0.5"])]
    with open(report, "w") as f:
        f.write("# perf record -e cpu-clock -F 499 -g -p <factory serve> -- sleep <window>\n"
                "# (no hardware counters on this machine kind: the software cpu-clock is sampled)\n")
        for title, args in views:
            cmd = ["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none"] + args
            f.write(f"\n# by {title}: {' '.join(cmd[:3])} {os.path.basename(data)} "
                    f"{' '.join(cmd[5:])}\n")
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
            for line in out.splitlines():
                if not line.strip() or line.startswith("# ...") or line.startswith("# Overhead"):
                    continue
                # perf pads every line to the longest symbol, then adds empty IPC columns.
                line = re.sub(r"\s+-\s+-\s*$", "", line).rstrip()
                f.write(re.sub(r" {3,}", "  ", line)[:240] + "\n")
    log(f"    profile: {report}")


async def tls_only_probe(target: Target, identities: list[Identity], pid: int, k: int,
                         settle: float) -> Optional[float]:
    """k more connections that finish their mTLS handshake and send nothing:
    the server's resident memory for each."""
    r0 = rss_kib(pid)
    conns = []
    sem = asyncio.Semaphore(32)

    async def one(i: int):
        async with sem:
            try:
                ctx = identities[i].context(target.ca_pem)
                _, w = await asyncio.open_connection(
                    target.host, target.port, ssl=ctx, server_hostname="127.0.0.1",
                    local_addr=(target.sources[i % len(target.sources)], 0))
                conns.append(w)
            except (OSError, ssl.SSLError, ConnectionError):
                pass
    await asyncio.gather(*(one(i) for i in range(min(k, len(identities)))))
    await asyncio.sleep(settle)
    r1 = rss_kib(pid)
    for w in conns:
        w.close()
    await asyncio.sleep(1)
    return (r1 - r0) / len(conns) if conns else None


# --- one target --------------------------------------------------------------------------

async def bench_target(name: str, pid_of, target: Target, identities: list[Identity],
                       health_body: str, a, feed_port: int, feed_ctx: ssl.SSLContext,
                       bearer: str, restart) -> TargetResult:
    res = TargetResult(name)
    pid = pid_of()
    log(f"\n== {name}: pid {pid}, load {loadavg()}")
    await measure_handshakes(res, target.port, pid, target.ca_pem, identities[-1].certfile,
                             a.handshakes)
    log(f"  full handshakes per CPU s: {fmt(res.full_hs_per_cpu_s)}; resumed: "
        f"{fmt(res.resumed_hs_per_cpu_s)} ({res.resumed_note})")
    feed = FeedReader("127.0.0.1", feed_port, feed_ctx, bearer)
    feed.start()
    try:
        await asyncio.wait_for(feed.connected.wait(), 15)
    except asyncio.TimeoutError:
        die(f"{name}: the live feed did not answer: {feed.error}")
    fleet = Fleet(target, identities, health_body, a.health_interval, a.heartbeat_interval,
                  a.event_interval, a.connect_concurrency)
    lag = loadgen.LoopLag()
    lag.start()
    await asyncio.sleep(1.0)
    res.base_rss_kib = rss_kib(pid)
    log(f"  resident before any agent: {res.base_rss_kib} KiB")
    deadline = time.monotonic() + a.target_budget
    for n in a.series:
        if time.monotonic() > deadline:
            log(f"  N={n}: skipped (this target's time budget of {a.target_budget} s is spent)")
            break
        st = Step(n)
        c0 = cpu_s(pid)
        before = len(fleet.sessions)
        if before == 0:
            slab0 = slab_unreclaimable_kib()
        g = await fleet.grow(n)
        c1 = cpu_s(pid)
        st.opened = len(fleet.sessions)
        st.connect_wall_s = g["wall_s"]
        new = st.opened - before
        st.connect_per_cpu_s = new / (c1 - c0) if c1 > c0 and new else None
        if g["failures"]:
            st.errors.update({"connect " + k: v for k, v in g["failures"].items()})
        await asyncio.sleep(a.settle)
        st.rss_idle_kib = (rss_kib(pid) - res.base_rss_kib) / max(1, st.opened)
        st.slab_kib = (slab_unreclaimable_kib() - slab0) / max(1, st.opened)
        log(f"  N={n}: {st.opened} open ({g['wanted'] - g['opened']} failed) in "
            f"{st.connect_wall_s:.1f} s; {fmt(st.connect_per_cpu_s)} sessions per CPU s; "
            f"idle {st.rss_idle_kib:.1f} KiB/agent; kernel slab {st.slab_kib:.1f} KiB per "
            f"connection (both ends); load {loadavg()}")
        if st.opened < n * 0.99:
            st.errors["fewer sessions than asked"] = n - st.opened
        fleet.stats = loadgen.Stats()
        feed.take()
        perf = None
        if a.perf and name == "factory" and n == a.series[-1]:
            perf = start_perf(pid, a.perf, a.window)
        lag.take()
        c0, t0 = cpu_s(pid), time.monotonic()
        await fleet.load(a.window)
        await asyncio.sleep(a.drain)
        if perf:
            await asyncio.to_thread(finish_perf, perf, a.perf)
        c1, t1 = cpu_s(pid), time.monotonic()
        s = fleet.stats
        st.msgs = sum(s.sent.values())
        st.msgs_per_s = st.msgs / a.window
        st.cpu_s = c1 - c0
        st.cpu_per_1000 = st.cpu_s / st.msgs * 1000 if st.msgs else None
        st.msgs_per_cpu_s = st.msgs / st.cpu_s if st.cpu_s > 0 else None
        st.events_sent, st.events_acked = s.sent["event"], s.acks_event
        lat = feed.take()
        st.feed_n = len(lat)
        st.feed_p50, st.feed_p99 = percentile(lat, 50), percentile(lat, 99)
        st.ack_p50, st.ack_p99 = percentile(s.ack_latencies_ms, 50), percentile(s.ack_latencies_ms, 99)
        st.rss_load_kib = (rss_kib(pid) - res.base_rss_kib) / max(1, st.opened)
        lags = lag.take()
        st.lag_p50, st.lag_p99 = percentile(lags, 50), percentile(lags, 99)
        st.errors.update(s.errors)
        if s.backpressure:
            st.errors["sends skipped (client send buffer full)"] = s.backpressure
        if s.slow_sends:
            # When in the window the slow events were sent: one cluster is one stall.
            rel = sorted(x - t0 for x in s.slow_sends)
            secs = sorted({int(x) for x in rel})
            log(f"    {len(rel)} events acked later than {loadgen.SLOW_MS:.0f} ms, sent at second(s) "
                f"{secs[:20]}{' ...' if len(secs) > 20 else ''} of the window")
        log(f"    load {a.window:.0f} s: {st.msgs} msgs ({s.sent}), {st.msgs_per_s:.0f}/s, "
            f"{fmt(st.cpu_per_1000, 3)} CPU s per 1000, events acked {st.events_acked}/"
            f"{st.events_sent}, feed {st.feed_n} p50 {fmt(st.feed_p50, 1)} p99 "
            f"{fmt(st.feed_p99, 1)} ms, ack p50 {fmt(st.ack_p50, 1)} p99 {fmt(st.ack_p99, 1)} ms, "
            f"{st.rss_load_kib:.1f} KiB/agent after load; load generator's loop late p50 "
            f"{fmt(st.lag_p50, 1)} p99 {fmt(st.lag_p99, 1)} ms; errors {st.errors or 'none'}")
        res.steps.append(st)
    if feed.error:
        log(f"  feed: {feed.error}")
    # How much of a session is the TLS connection alone: k more connections
    # that finish their mTLS handshake and then send nothing.
    if a.tls_only > 0 and fleet.sessions:
        res.tls_only_kib = await tls_only_probe(target, identities, pid, a.tls_only, a.settle)
        log(f"  {a.tls_only} more mTLS connections, handshake only (no request, no websocket): "
            f"{fmt(res.tls_only_kib, 1)} KiB each")
    # Flood: durable events as fast as acks allow.
    if a.flood_seconds > 0 and fleet.sessions:
        fleet.stats = loadgen.Stats()
        feed.take()
        c0, t0 = cpu_s(pid), time.monotonic()
        await fleet.flood(a.flood_sessions, a.flood_window, a.flood_seconds)
        c1, t1 = cpu_s(pid), time.monotonic()
        s = fleet.stats
        acked = len(s.ack_latencies_ms)
        cpu = c1 - c0
        lat = feed.take()
        res.flood = {"sessions": min(a.flood_sessions, len(fleet.sessions)),
                     "window": a.flood_window, "seconds": a.flood_seconds,
                     "sent": s.sent["event"], "acked": acked,
                     "per_s": acked / a.flood_seconds, "cpu_s": cpu,
                     "per_cpu_s": acked / cpu if cpu > 0 else None,
                     "ack_p50": percentile(s.ack_latencies_ms, 50),
                     "ack_p99": percentile(s.ack_latencies_ms, 99),
                     "feed_p50": percentile(lat, 50), "feed_p99": percentile(lat, 99),
                     "errors": dict(s.errors)}
        f = res.flood
        log(f"  flood: {f['sessions']} sessions x {f['window']} in flight, {f['seconds']} s: "
            f"{f['acked']} events stored+acked, {f['per_s']:.0f}/s, {fmt(f['per_cpu_s'])} per CPU s, "
            f"ack p50 {fmt(f['ack_p50'], 1)} p99 {fmt(f['ack_p99'], 1)} ms; errors {f['errors'] or 'none'}")
    feed.stop()
    lag.stop()
    # Restart: every session reconnects with the agent's backoff and jitter.
    if a.storm and fleet.sessions:
        n = len(fleet.sessions)
        fleet.stats = loadgen.Stats()
        back = asyncio.Event()

        def changed(up: int):
            if up >= n:
                back.set()
        fleet.up_changed = changed
        t0 = time.monotonic()
        stop_s, start_s = await asyncio.to_thread(restart)
        t_listen = time.monotonic()
        pid = pid_of()
        c0 = cpu_s(pid)
        try:
            await asyncio.wait_for(back.wait(), a.storm_timeout)
        except asyncio.TimeoutError:
            pass
        t1 = time.monotonic()
        c1 = cpu_s(pid)
        res.storm = {"n": n, "back": fleet.up, "stop_s": stop_s, "start_s": start_s,
                     "all_back_s": t1 - t0 if fleet.up >= n else None,
                     "after_listen_s": t1 - t_listen if fleet.up >= n else None,
                     "cpu_s": c1 - c0, "errors": dict(fleet.stats.errors)}
        s = res.storm
        log(f"  restart: {s['back']}/{n} back; stop {s['stop_s']:.1f} s, start {s['start_s']:.1f} s, "
            f"all back {fmt(s['all_back_s'], 1)} s after the stop began "
            f"({fmt(s['after_listen_s'], 1)} s after listening), server CPU {s['cpu_s']:.1f} s; "
            f"failed attempts {s['errors'] or 'none'}")
    await fleet.close_all()
    await asyncio.sleep(2)
    return res


# --- rollout: tokens and enrollments through the product ------------------------------

async def rollout(coord: Coordinator, count: int, cap_s: float, concurrency: int) -> dict:
    from identities import make_csr
    ca = coord.ca_pem()
    api = HttpConn("127.0.0.1", coord.api_port, loadgen.client_context(ca), coord.admin_token())
    pid = coord.pid
    log(f"\n== rollout: {count} tokens, then their enrollments (cap {cap_s:.0f} s each); "
        f"load {loadavg()}")
    csrs = [make_csr(f"r{i:06d}")[0] for i in range(count)]
    bucket = max(1, count // 5)
    out = {"asked": count}
    # Tokens, one after the other as a provisioning script would.
    w0, c0, t0 = write_bytes(pid), cpu_s(pid), time.monotonic()
    tokens, marks = [], []
    for i in range(count):
        tokens.append((await loadgen.issue_token(api, f"r{i:06d}"))["token"])
        if (i + 1) % bucket == 0:
            marks.append((i + 1, time.monotonic() - t0))
        if time.monotonic() - t0 > cap_s:
            break
    out["tokens"] = len(tokens)
    out["tokens_s"] = time.monotonic() - t0
    out["tokens_cpu_s"] = cpu_s(pid) - c0
    out["tokens_written"] = write_bytes(pid) - w0
    out["tokens_marks"] = marks
    log(f"  {len(tokens)} tokens in {out['tokens_s']:.1f} s (CPU {out['tokens_cpu_s']:.1f} s, "
        f"{out['tokens_written'] / 1e6:.1f} MB written); cumulative: {marks}")
    api.close()
    # Enrollments, `concurrency` at a time.
    ctx = loadgen.client_context(ca)
    sem = asyncio.Semaphore(concurrency)
    done, fails, times = [0], {}, []
    t0 = time.monotonic()
    w0, c0 = write_bytes(pid), cpu_s(pid)

    async def one(i: int):
        async with sem:
            if time.monotonic() - t0 > cap_s:
                return
            s0 = time.monotonic()
            try:
                await loadgen.enroll("127.0.0.1", coord.agents_port, ca, tokens[i], csrs[i],
                                     f"127.0.0.{2 + i % 8}", f"r{i:06d}", ctx)
                done[0] += 1
                times.append((time.monotonic() - t0, time.monotonic() - s0))
            except Exception as e:
                k = f"{type(e).__name__}: {str(e)[:100]}"
                fails[k] = fails.get(k, 0) + 1

    await asyncio.gather(*(one(i) for i in range(len(tokens))))
    out["enrolled"] = done[0]
    out["enroll_s"] = time.monotonic() - t0
    out["enroll_cpu_s"] = cpu_s(pid) - c0
    out["enroll_written"] = write_bytes(pid) - w0
    out["enroll_fail"] = fails
    times.sort()
    out["enroll_marks"] = [(k, round(times[k - 1][0], 1)) for k in range(bucket, len(times) + 1, bucket)]
    lat = [x[1] * 1000 for x in times]
    out["enroll_p50_ms"], out["enroll_p99_ms"] = percentile(lat, 50), percentile(lat, 99)
    log(f"  {done[0]} enrollments in {out['enroll_s']:.1f} s (CPU {out['enroll_cpu_s']:.1f} s, "
        f"{out['enroll_written'] / 1e6:.1f} MB written, p50 {fmt(out['enroll_p50_ms'])} ms, "
        f"p99 {fmt(out['enroll_p99_ms'])} ms); cumulative: {out['enroll_marks']}; "
        f"failures {fails or 'none'}")
    return out


def per_item_ms(marks: list) -> list:
    """ms per item in each bucket, from cumulative (count, seconds) marks."""
    out, pn, pt = [], 0, 0.0
    for n, t in marks:
        if n > pn:
            out.append(round((t - pt) / (n - pn) * 1000, 2))
        pn, pt = n, t
    return out


def project(marks: list, n: int) -> Optional[float]:
    """Seconds for n items if the cost per item keeps growing as it did
    (a straight line through the per-bucket costs: O(n^2) in total)."""
    pts, pn, pt = [], 0, 0.0
    for k, t in marks:
        if k > pn:
            pts.append(((k + pn) / 2, (t - pt) / (k - pn)))
        pn, pt = k, t
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    slope = max(0.0, sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else 0.0)
    c0 = my - slope * mx
    return c0 * n + slope * n * n / 2


# --- the agent's own footprint ----------------------------------------------------------

class RealAgent:
    def __init__(self, binary: str, coord: Coordinator, work: str):
        self.binary, self.coord, self.work = binary, coord, work
        self.proc = None

    async def start(self) -> None:
        ca = self.coord.ca_pem()
        api = HttpConn("127.0.0.1", self.coord.api_port, loadgen.client_context(ca),
                       self.coord.admin_token())
        tok = await loadgen.issue_token(api, "realagent")
        api.close()
        d = os.path.join(self.work, "agent")
        for sub in ("state", "root", "path"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, "token"), "w") as f:
            f.write(tok["token"] + "\n")
        logf = open(os.path.join(d, "agent.log"), "w")
        self.proc = subprocess.Popen(
            [self.binary, "--coordinator-url", tok["coordinator_url"], "--ca-sha256",
             tok["ca_sha256"], "--token-file", os.path.join(d, "token"), "--state-dir",
             os.path.join(d, "state"), "--root", os.path.join(d, "root"), "--log-level", "info"],
            stdout=logf, stderr=subprocess.STDOUT, env={"PATH": os.path.join(d, "path")})
        self.t0 = None

    def mark(self) -> None:
        self.t0, self.c0 = time.monotonic(), cpu_s(self.proc.pid)

    def sample(self) -> dict:
        pid = self.proc.pid
        if self.proc.poll() is not None:
            return {"error": f"factory-agent exited ({self.proc.returncode})"}
        el = time.monotonic() - self.t0
        cpu = cpu_s(pid) - self.c0
        return {"rss_kib": rss_kib(pid), "anon_kib": status_kib(pid, "RssAnon"),
                "file_kib": status_kib(pid, "RssFile"), "seconds": el, "cpu_s": cpu,
                "cpu_per_cycle_ms": cpu / (el / 10.0) * 1000 if el > 0 else None,
                "core_percent": cpu / el * 100 if el > 0 else None}

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --- printing ----------------------------------------------------------------------------

PROJECTED_AGENTS = 100_000


def cores_for(step: Optional["Step"], agents: int = PROJECTED_AGENTS) -> Optional[float]:
    """Cores the target would need for `agents` agents under the same load
    per agent (health every 10 s, heartbeat, events), from the CPU it spent
    per message at this step's N: the messages a second scale with the
    agents, the cost per message is taken as measured (it grew with N in
    every run so far, so this is a floor, not a ceiling)."""
    if step is None or not step.n or step.cpu_per_1000 is None or not step.msgs_per_s:
        return None
    return step.msgs_per_s * agents / step.n * step.cpu_per_1000 / 1000



def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def ratio(a, b, digits: int = 2) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.{digits}f}x"


def print_table(fr: TargetResult, nr: Optional[TargetResult], ro: dict, agent: dict, a) -> None:
    log("\n" + "=" * 100)
    log("FLEET BENCHMARK: factory coordinator vs Node.js baseline (ratio = factory / node)")
    log(f"load: health every {a.health_interval:g} s ({a.health_bytes} B, the H200 fixture), "
        f"heartbeat every {a.heartbeat_interval:g} s, durable progress event every "
        f"{a.event_interval:g} s per agent; {a.window:g} s window per N")
    rows = []

    def row(label, f, n, r=""):
        rows.append((label, f, n, r))
    by_n = {s.n: s for s in (nr.steps if nr else [])}
    for s in fr.steps:
        b = by_n.get(s.n)
        row(f"N={s.n}: sessions open", fmt(s.opened), fmt(b.opened) if b else "-")
        row("  resident KiB per agent, idle", fmt(s.rss_idle_kib, 1),
            fmt(b.rss_idle_kib, 1) if b else "-", ratio(s.rss_idle_kib, b.rss_idle_kib if b else None))
        row("  resident KiB per agent, after load", fmt(s.rss_load_kib, 1),
            fmt(b.rss_load_kib, 1) if b else "-", ratio(s.rss_load_kib, b.rss_load_kib if b else None))
        row("  kernel slab KiB per connection (both ends)", fmt(s.slab_kib, 1),
            fmt(b.slab_kib, 1) if b else "-")
        row("  connect+hello per CPU s", fmt(s.connect_per_cpu_s),
            fmt(b.connect_per_cpu_s) if b else "-",
            ratio(s.connect_per_cpu_s, b.connect_per_cpu_s if b else None))
        row("  msgs/s offered (all sent)", fmt(s.msgs_per_s), fmt(b.msgs_per_s) if b else "-")
        row("  CPU s per 1,000 msgs", fmt(s.cpu_per_1000, 3), fmt(b.cpu_per_1000, 3) if b else "-",
            ratio(s.cpu_per_1000, b.cpu_per_1000 if b else None))
        row("  msgs per CPU s", fmt(s.msgs_per_cpu_s), fmt(b.msgs_per_cpu_s) if b else "-",
            ratio(s.msgs_per_cpu_s, b.msgs_per_cpu_s if b else None))
        row("  events acked / sent", f"{s.events_acked}/{s.events_sent}",
            f"{b.events_acked}/{b.events_sent}" if b else "-")
        row("  send->feed ms p50 / p99", f"{fmt(s.feed_p50, 1)} / {fmt(s.feed_p99, 1)}",
            f"{fmt(b.feed_p50, 1)} / {fmt(b.feed_p99, 1)}" if b else "-")
        row("  send->ack ms p50 / p99", f"{fmt(s.ack_p50, 1)} / {fmt(s.ack_p99, 1)}",
            f"{fmt(b.ack_p50, 1)} / {fmt(b.ack_p99, 1)}" if b else "-")
        row("  (load generator late ms p50 / p99)", f"{fmt(s.lag_p50, 1)} / {fmt(s.lag_p99, 1)}",
            f"{fmt(b.lag_p50, 1)} / {fmt(b.lag_p99, 1)}" if b else "-")
    # Issue 29: the cost per message at the largest N, projected to 100,000
    # agents at the same load each; the target is 2 cores.
    if fr.steps:
        top = fr.steps[-1]
        b = by_n.get(top.n)
        row(f"{PROJECTED_AGENTS:,} agents: cores needed at N={top.n}'s cost per msg (want <= 2)",
            fmt(cores_for(top), 2), fmt(cores_for(b), 2) if b else "-",
            ratio(cores_for(top), cores_for(b) if b else None))
    row("mTLS connection alone (no websocket), KiB each", fmt(fr.tls_only_kib, 1),
        fmt(nr.tls_only_kib, 1) if nr else "-",
        ratio(fr.tls_only_kib, nr.tls_only_kib if nr else None))
    ff, nf = fr.flood, (nr.flood if nr else {})
    if ff:
        row(f"flood ({ff['sessions']} x {ff['window']} in flight): events/s stored",
            fmt(ff["per_s"]), fmt(nf.get("per_s")), ratio(ff["per_s"], nf.get("per_s")))
        row("  durable events per CPU s", fmt(ff["per_cpu_s"]), fmt(nf.get("per_cpu_s")),
            ratio(ff["per_cpu_s"], nf.get("per_cpu_s")))
        row("  send->ack ms p50 / p99", f"{fmt(ff['ack_p50'], 1)} / {fmt(ff['ack_p99'], 1)}",
            f"{fmt(nf.get('ack_p50'), 1)} / {fmt(nf.get('ack_p99'), 1)}" if nf else "-")
    row("full mTLS handshakes per CPU s", fmt(fr.full_hs_per_cpu_s),
        fmt(nr.full_hs_per_cpu_s) if nr else "-",
        ratio(fr.full_hs_per_cpu_s, nr.full_hs_per_cpu_s if nr else None))
    row("resumed handshakes per CPU s", fmt(fr.resumed_hs_per_cpu_s) if fr.resumed_hs_per_cpu_s
        else fr.resumed_note, (fmt(nr.resumed_hs_per_cpu_s) + f" ({nr.resumed_note})")
        if nr and nr.resumed_hs_per_cpu_s else (nr.resumed_note if nr else "-"))
    # Issue 29's target: a resumption costs the coordinator at most 2/3 of a
    # full handshake (its tickets: common/net/tls_tickets.hpp).
    row("  resumed / full, each target's own (want >= 1.5x)",
        ratio(fr.resumed_hs_per_cpu_s, fr.full_hs_per_cpu_s),
        ratio(nr.resumed_hs_per_cpu_s, nr.full_hs_per_cpu_s) if nr else "-")
    fs, ns = fr.storm, (nr.storm if nr else {})
    if fs:
        row(f"restart of {fs['n']}: all back after (s)", fmt(fs["all_back_s"], 1),
            fmt(ns.get("all_back_s"), 1) if ns else "-")
        row("  back / failed attempts", f"{fs['back']} / {sum(fs['errors'].values())}",
            f"{ns['back']} / {sum(ns['errors'].values())}" if ns else "-")
        row("  server CPU s for the storm", fmt(fs["cpu_s"], 1),
            fmt(ns.get("cpu_s"), 1) if ns else "-", ratio(fs["cpu_s"], ns.get("cpu_s")))
        if "server_refusals" in fs:
            row("  refused: stranger pool full (handshakes in flight)", fmt(fs["server_refusals"]),
                "-")
    w = max(len(r[0]) for r in rows) + 2
    log(f"{'':{w}}{'factory':>22}{'node':>22}{'ratio':>10}")
    for label, f, n, r in rows:
        log(f"{label:{w}}{f:>22}{n:>22}{r:>10}")
    print_rollout(ro)
    if agent:
        log(f"\nfactory-agent (no GPU, health every 10 s, heartbeat 15 s): "
            + ", ".join(f"{k} {fmt(v, 2) if isinstance(v, float) else v}" for k, v in agent.items()))


def print_rollout(ro: dict) -> None:
    if ro:
        log(f"\nrollout through the API and the agent port (fresh coordinator):")
        log(f"  tokens: {ro['tokens']} in {ro['tokens_s']:.1f} s, CPU {ro['tokens_cpu_s']:.1f} s, "
            f"{ro['tokens_written'] / 1e6:.1f} MB written; ms per token by fifth: "
            f"{per_item_ms(ro['tokens_marks'])}")
        log(f"  enrollments: {ro['enrolled']} in {ro['enroll_s']:.1f} s, CPU {ro['enroll_cpu_s']:.1f} s, "
            f"{ro['enroll_written'] / 1e6:.1f} MB written, p50 {fmt(ro['enroll_p50_ms'])} ms "
            f"p99 {fmt(ro['enroll_p99_ms'])} ms; ms per enrollment by fifth: "
            f"{per_item_ms(ro['enroll_marks'])}")
        pt, pe = project(ro["tokens_marks"], 10000), project(ro["enroll_marks"], 10000)
        log(f"  projected for 10,000 + 10,000 (cost per item growing as measured): tokens "
            f"{fmt(pt)} s + enrollments {fmt(pe)} s")


# --- main ----------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--build-dir", default="build", help="where factory and factory-agent are (build)")
    ap.add_argument("--factory", help="factory binary (default BUILD_DIR/coordinator/factory, "
                                      "else BUILD_DIR/factory)")
    ap.add_argument("--agent", help="factory-agent binary (default BUILD_DIR/agent/factory-agent, "
                                    "else BUILD_DIR/factory-agent)")
    ap.add_argument("--node", default=shutil.which("node") or "/usr/bin/node", help="node binary")
    ap.add_argument("--work", help="scratch folder (default a new one under BUILD_DIR/bench-fleet)")
    ap.add_argument("--series", default="100,1000,5000,10000",
                    help="N, ascending, comma separated (default 100,1000,5000,10000)")
    ap.add_argument("--window", type=float, default=30, help="load seconds per N (30)")
    ap.add_argument("--drain", type=float, default=2, help="seconds after a window for acks (2)")
    ap.add_argument("--settle", type=float, default=3, help="seconds before the idle memory reading (3)")
    ap.add_argument("--health-interval", type=float, default=10, help="seconds (10, the agent's)")
    ap.add_argument("--heartbeat-interval", type=float, default=15, help="seconds (15, the agent's)")
    ap.add_argument("--event-interval", type=float, default=30,
                    help="seconds between durable progress events per agent (30)")
    ap.add_argument("--health-fixture", default=DEFAULT_FIXTURE, help="a real agent health sample")
    ap.add_argument("--connect-concurrency", type=int, default=64, help="handshakes in flight (64)")
    ap.add_argument("--handshakes", type=int, default=300, help="sequential handshakes measured (300)")
    ap.add_argument("--tls-only", type=int, default=1000,
                    help="extra handshake-only connections measured after the series; 0 skips (1000)")
    ap.add_argument("--flood-sessions", type=int, default=200,
                    help="sessions flooding; each stays under the 250/s per-tenant quota (200)")
    ap.add_argument("--flood-window", type=int, default=8, help="events in flight per session (8)")
    ap.add_argument("--flood-seconds", type=float, default=15, help="0 skips the flood (15)")
    ap.add_argument("--no-storm", dest="storm", action="store_false", help="skip the restart")
    ap.add_argument("--storm-timeout", type=float, default=180, help="seconds (180)")
    ap.add_argument("--rollout", type=int, default=1000, help="tokens + enrollments; 0 skips (1000)")
    ap.add_argument("--rollout-cap", type=float, default=120, help="seconds per half (120)")
    ap.add_argument("--only-rollout", action="store_true", help="the rollout phase alone")
    ap.add_argument("--enroll-concurrency", type=int, default=8, help="(8)")
    ap.add_argument("--target-budget", type=float, default=900,
                    help="seconds per target before larger N are skipped (900)")
    ap.add_argument("--no-node", dest="node_baseline", action="store_false", help="factory only")
    ap.add_argument("--no-agent", dest="real_agent", action="store_false",
                    help="skip the real factory-agent footprint")
    ap.add_argument("--out", help="also write everything printed to this file")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--perf", metavar="FILE",
                    help="perf record the coordinator over the largest N's load window into FILE "
                         "(and FILE.txt, the report)")
    a = ap.parse_args()
    try:
        a.series = [int(x) for x in a.series.split(",") if x.strip()]
    except ValueError:
        ap.error("--series: comma-separated integers")
    if not a.series or a.series != sorted(a.series):
        ap.error("--series must be ascending")
    return a


class Tee:
    def __init__(self, path: str):
        self.f = open(path, "w")
        self.out = sys.stdout

    def write(self, s):
        self.out.write(s)
        self.f.write(s)

    def flush(self):
        self.out.flush()
        self.f.flush()


def check_deps(a) -> None:
    def first(*paths):  # a CMake build tree's layout, else the two binaries side by side
        return next((p for p in paths if os.access(p, os.X_OK)), paths[0])
    a.factory = a.factory or first(os.path.join(a.build_dir, "coordinator", "factory"),
                                   os.path.join(a.build_dir, "factory"))
    a.agent = a.agent or first(os.path.join(a.build_dir, "agent", "factory-agent"),
                               os.path.join(a.build_dir, "factory-agent"))
    for p, what in ((a.factory, "factory (build it: cmake --build BUILD_DIR --target factory)"),
                    (a.agent, "factory-agent (cmake --build BUILD_DIR --target factory-agent)")):
        if not os.access(p, os.X_OK):
            die(f"{p} is missing or not executable: {what}")
    if a.node_baseline:
        if not a.node or not os.access(a.node, os.X_OK):
            die("node is missing (apt-get install nodejs), or pass --no-node")
        if not os.path.exists("/usr/share/nodejs/ws"):
            die("node-ws is missing (apt-get install node-ws), or pass --no-node")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        die("python3-cryptography is missing (apt-get install python3-cryptography; "
            "run with /usr/bin/python3)")
    if not os.path.exists(a.health_fixture):
        die(f"{a.health_fixture} is missing")
    if a.perf and not shutil.which("perf"):
        die("--perf needs perf (apt-get install linux-perf)")


def raise_fd_limit(n_max: int) -> int:
    want = 4 * n_max + 4096
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        nr_open = int(open("/proc/sys/fs/nr_open").read())
    except OSError:
        nr_open = hard
    for lim in ((want, max(hard, want)), (min(want, hard), hard)):
        if lim[0] > nr_open:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, lim)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def amain(a) -> int:
    n_max = a.series[-1]
    fd = raise_fd_limit(n_max)
    # This process holds one target's sessions at a time, plus the handshake-only probe.
    if fd < n_max + a.tls_only + 1000:
        die(f"the file-descriptor limit is {fd}, too low for {n_max} agents (+{a.tls_only} "
            f"probe connections); raise `ulimit -Hn` (as root) or ask for fewer")
    work = a.work or os.path.join(a.build_dir, "bench-fleet", time.strftime("%Y%m%d-%H%M%S"))
    if os.path.exists(os.path.join(work, "state")):
        die(f"{work} is not fresh (it has a state folder); pass another --work")
    os.makedirs(work, exist_ok=True)
    work = os.path.abspath(work)
    health_body = loadgen.load_health_body(a.health_fixture)
    a.health_bytes = len(health_body)
    head = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"], capture_output=True,
                          text=True).stdout.strip()
    log(f"bench-fleet {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} on "
        f"{socket.gethostname()}, {os.cpu_count()} cores, commit {head}")
    log(f"factory {a.factory} (sha256 {hashlib.sha256(open(a.factory, 'rb').read()).hexdigest()[:16]}), "
        f"node {subprocess.run([a.node, '--version'], capture_output=True, text=True).stdout.strip() if a.node_baseline else '-'}, "
        f"{ssl.OPENSSL_VERSION} (client)")
    load_start = loadavg()
    log(f"load average at start: {load_start}; fd limit {fd}; work {work}")
    log(f"series {a.series}; health {a.health_bytes} B every {a.health_interval:g} s, heartbeat "
        f"{a.heartbeat_interval:g} s, event {a.event_interval:g} s; window {a.window:g} s")

    coord = Coordinator(os.path.abspath(a.factory), os.path.abspath(a.agent), work)
    baseline = None
    agent = None
    try:
        t = coord.start()
        log(f"factory serve up in {t:.1f} s (pid {coord.pid})")
        ro = {}
        if a.rollout > 0:
            ro = await rollout(coord, a.rollout, a.rollout_cap, a.enroll_concurrency)
            if a.only_rollout:
                print_rollout(ro)
                log(f"\nload average at end: {loadavg()}")
                return 0
        coord.stop()
        import identities
        t0 = time.monotonic()
        names = [f"f{i:06d}" for i in range(n_max)]
        paths = identities.provision_agents(coord.state, os.path.join(work, "ids"), names)
        server_pem = os.path.join(work, "baseline-server.pem")
        identities.server_identity(coord.state, server_pem)
        log(f"\n{n_max} agent identities issued by the coordinator's CA and recorded in its store "
            f"in {time.monotonic() - t0:.1f} s")
        ids = [Identity(n, p) for n, p in zip(names, paths)]
        t = coord.start()
        log(f"factory serve up again in {t:.1f} s with {n_max + a.rollout} tenants (pid {coord.pid})")
        ca = coord.ca_pem()
        ca_file = os.path.join(coord.state, "ca.crt")
        # Many source addresses: N can pass 64k ports, and no address comes near the
        # coordinator's 256 handshakes in flight per address (a fleet has one per VM).
        sources = [f"127.0.0.{i}" for i in range(2, 102)]
        agent_res = {}
        if a.real_agent:
            agent = RealAgent(os.path.abspath(a.agent), coord, work)
            await agent.start()
            await asyncio.sleep(5)
            agent.mark()

        def restart_coord():
            s = coord.stop()
            return s, coord.start()
        fr = await bench_target(
            "factory", lambda: coord.pid, Target("factory", "127.0.0.1", coord.agents_port, ca, sources),
            ids, health_body, a, coord.api_port, loadgen.client_context(ca), coord.admin_token(),
            restart_coord)
        if fr.storm:
            with open(os.path.join(work, f"coordinator.{coord.starts}.log"), errors="replace") as f:
                fr.storm["server_refusals"] = sum(
                    "too many connections without a certificate" in line for line in f)
            log(f"  the restarted coordinator refused {fr.storm['server_refusals']} connections "
                f"for its stranger pool (handshakes in flight, common/net/server.hpp StrangerLimits)")
        if agent:
            agent_res = agent.sample()
            log(f"\nfactory-agent: {agent_res}")
            agent.stop()
        nr = None
        if a.node_baseline:
            baseline = Baseline(a.node, work, server_pem, ca_file, coord.admin_token())
            coord.stop()  # the baseline has the machine to itself, as the coordinator had
            t = baseline.start()
            log(f"\nNode baseline up in {t:.1f} s (pid {baseline.pid})")

            def restart_node():
                s = baseline.stop()
                return s, baseline.start()
            nr = await bench_target(
                "node", lambda: baseline.pid,
                Target("node", "127.0.0.1", baseline.port, ca, sources), ids, health_body, a,
                baseline.port, loadgen.client_context(ca, ids[0].certfile), coord.admin_token(),
                restart_node)
        print_table(fr, nr, ro, agent_res, a)
        log(f"\nload average at end: {loadavg()}")
        if a.json:
            import dataclasses
            with open(a.json, "w") as f:
                json.dump({"factory": dataclasses.asdict(fr),
                           "node": dataclasses.asdict(nr) if nr else None,
                           "rollout": ro, "agent": agent_res, "series": a.series,
                           "projection_s": {"tokens": project(ro.get("tokens_marks", []), 10000),
                                            "enrollments": project(ro.get("enroll_marks", []), 10000)}
                           if ro else None,
                           "projected_cores_100k": {
                               "factory": cores_for(fr.steps[-1]) if fr.steps else None,
                               "node": cores_for(nr.steps[-1]) if nr and nr.steps else None},
                           "load_start": load_start, "load_end": loadavg()}, f, indent=1)
        return 0
    finally:
        if agent:
            agent.stop()
        coord.stop()
        if baseline:
            baseline.stop()


def main() -> int:
    a = parse_args()
    check_deps(a)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        sys.stdout = Tee(a.out)
    return asyncio.run(amain(a))


if __name__ == "__main__":
    sys.exit(main())
