// The fleet benchmark's baseline: what a user's first Node.js server for the
// agent protocol would be. https.createServer with the same kind of
// certificate (from the coordinator's CA), TLS 1.3, client certificates
// required, and `ws` (Debian's node-ws) on /v1/agent. Every message is parsed
// as JSON; durable events are appended to one file and fdatasync'd in batches
// (group commit: whatever arrived while the last sync ran goes in the next),
// then acknowledged and published on GET /v1/events (Server-Sent Events), as
// the coordinator does; health is kept as the latest sample per tenant and
// published on the feed, as the coordinator does.
//
//   node baseline_server.js --port P --cert SERVER.pem --ca CA.pem
//        --events FILE --token ADMIN_TOKEN
// SERVER.pem holds the leaf, the chain and the key. Prints "listening P".
'use strict';
const fs = require('fs');
const https = require('https');

let WebSocket;
try {
  WebSocket = require('ws');
} catch (e) {
  console.error('baseline: the ws module is missing (apt-get install node-ws; NODE_PATH=/usr/share/nodejs)');
  process.exit(2);
}

function arg(name, def) {
  const i = process.argv.indexOf('--' + name);
  if (i < 0 || i + 1 >= process.argv.length) {
    if (def === undefined) {
      console.error(`baseline: --${name} is required`);
      process.exit(2);
    }
    return def;
  }
  return process.argv[i + 1];
}

const port = Number(arg('port'));
const pem = fs.readFileSync(arg('cert'), 'utf8');
const ca = fs.readFileSync(arg('ca'), 'utf8');
const eventsPath = arg('events');
const token = arg('token');
const idleTimeoutMs = Number(arg('idle-timeout', '60')) * 1000;

// The file is the certificate and its key in one PEM bundle (identities.py
// writes it at run time): OpenSSL reads each from it and skips the other.
const server = https.createServer({
  cert: pem,
  key: pem,
  ca,
  requestCert: true,
  rejectUnauthorized: true,
  minVersion: 'TLSv1.3',
});

// --- durable events: append + fdatasync in batches -------------------------
const fd = fs.openSync(eventsPath, 'a');
let pending = [];   // {ws, seq, id, tenant, body}
let syncing = false;
const lastId = new Map();  // tenant -> last stored event id
const health = new Map();  // tenant -> latest sample
const feeds = new Set();   // SSE responses
let feedId = Date.now() * 1000;

function flush() {
  if (syncing || pending.length === 0) return;
  syncing = true;
  const batch = pending;
  pending = [];
  const lines = batch.map((e) => JSON.stringify({tenant: e.tenant, event: e.body}) + '\n').join('');
  fs.write(fd, lines, (err) => {
    if (err) throw err;
    fs.fdatasync(fd, (err2) => {
      if (err2) throw err2;
      for (const e of batch) {
        if (e.id > (lastId.get(e.tenant) || 0)) lastId.set(e.tenant, e.id);
        if (e.ws.readyState === WebSocket.OPEN)
          e.ws.send(JSON.stringify({v: 1, type: 'ack', seq: ++e.ws.outSeq, ack: e.seq,
                                    body: {event_id: e.id}}));
        if (feeds.size && e.body.kind === 'progress') {
          const d = Object.assign({}, e.body);
          delete d.kind;
          delete d.id;
          d.tenant = e.tenant;
          const chunk = `id: ${++feedId}\nevent: progress\ndata: ${JSON.stringify(d)}\n\n`;
          for (const f of feeds) f.write(chunk);
        }
      }
      syncing = false;
      flush();
    });
  });
}

// --- the live feed ------------------------------------------------------------
server.on('request', (req, res) => {
  if (req.url === '/v1/events' && req.headers.authorization === 'Bearer ' + token) {
    res.writeHead(200, {'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache'});
    res.write(': hello\n\n');
    feeds.add(res);
    req.on('close', () => feeds.delete(res));
    return;
  }
  res.writeHead(404, {'Content-Type': 'application/json'});
  res.end('{"error":"not_found"}\n');
});

// --- agents -------------------------------------------------------------------
const wss = new WebSocket.Server({server, path: '/v1/agent', maxPayload: 1 << 20});

function send(ws, type, body, ack) {
  const e = {v: 1, type, seq: ++ws.outSeq, body};
  if (ack !== undefined) e.ack = ack;
  ws.send(JSON.stringify(e));
}

wss.on('connection', (ws, req) => {
  const cert = req.socket.getPeerCertificate();
  ws.tenant = cert && cert.subject ? cert.subject.CN : '';
  ws.outSeq = 0;
  ws.lastRx = Date.now();
  ws.pinged = false;
  ws.on('pong', () => { ws.lastRx = Date.now(); ws.pinged = false; });
  ws.on('message', (data) => {
    ws.lastRx = Date.now();
    let m;
    try {
      m = JSON.parse(data);
    } catch (e) {
      send(ws, 'error', {code: 'bad_frame', message: 'not JSON'});
      return;
    }
    switch (m.type) {
      case 'hello':
        send(ws, 'welcome', {tenant: ws.tenant, server_version: 'baseline',
                             last_event_id: lastId.get(ws.tenant) || 0});
        break;
      case 'event':
        pending.push({ws, seq: m.seq, id: m.body.id, tenant: ws.tenant, body: m.body});
        flush();
        break;
      case 'health':
        // State, as the coordinator keeps it, and on the live feed as it publishes it.
        health.set(ws.tenant, m.body);
        if (feeds.size) {
          const chunk = `id: ${++feedId}\nevent: health\ndata: ${JSON.stringify({tenant: ws.tenant, health: m.body})}\n\n`;
          for (const f of feeds) f.write(chunk);
        }
        break;
      case 'heartbeat':
        send(ws, 'ack', {}, m.seq);
        break;
      default:
        break;
    }
  });
  ws.on('error', () => {});
});

// Ping at half the idle timeout, close when nothing came back (as the coordinator).
setInterval(() => {
  const now = Date.now();
  for (const ws of wss.clients) {
    if (now - ws.lastRx >= idleTimeoutMs) ws.terminate();
    else if (now - ws.lastRx >= idleTimeoutMs / 2 && !ws.pinged) {
      ws.pinged = true;
      ws.ping();
    }
  }
}, 1000).unref();

process.on('SIGTERM', () => {
  for (const ws of wss.clients) ws.close(1001, 'server stopping');
  server.close();
  setTimeout(() => process.exit(0), 200);
});

server.listen(port, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
