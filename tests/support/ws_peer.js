// A websocket peer for the tests, on the `ws` library that wscat is built on
// (Debian's node-ws): the same TLS and framing as wscat, but it sends its
// frames only once the connection is open (wscat reads stdin from the start
// and drops the lines that come before the handshake has finished, which on
// a loaded machine is seconds).
//   node ws_peer.js URL CA [CERT KEY] -- WAIT_SECONDS FRAME...
// Prints "< frame" for each frame received and "Disconnected (code: N,
// reason: "...")" when the connection ends, like wscat.
'use strict';
const fs = require('fs');
const WebSocket = require('ws');

const sep = process.argv.indexOf('--');
const [url, ca, cert, key] = process.argv.slice(2, sep);
const wait = Number(process.argv[sep + 1]);
const frames = process.argv.slice(sep + 2);
const opts = { ca: fs.readFileSync(ca) };
if (cert) {
  opts.cert = fs.readFileSync(cert);
  opts.key = fs.readFileSync(key);
}
const ws = new WebSocket(url, opts);
ws.on('open', () => {
  console.log('Connected');
  let i = 0;
  const next = () => {
    if (i < frames.length) {
      ws.send(frames[i++]);
      setTimeout(next, 200);
    } else {
      setTimeout(() => ws.close(1000), wait * 1000);
    }
  };
  next();
});
ws.on('message', (data) => console.log('< ' + data));
ws.on('close', (code, reason) => {
  console.log(`Disconnected (code: ${code}, reason: "${reason}")`);
  process.exit(0);
});
ws.on('error', (err) => {
  console.log('error: ' + err.message);
  process.exit(1);
});
