// Loads the coordinator's dashboard in headless Chromium (Debian's
// `chromium`), driven over the DevTools protocol with the `ws` library
// (Debian's node-ws): signs in with a token as a person would, waits for the
// cards, optionally for a live update, and takes a screenshot.
//   NODE_PATH=/usr/share/nodejs node dashboard_probe.js URL TOKEN_FILE PNG CARDS [WAIT_TEXT]
// Prints "READY <json>" once CARDS cards show, then (with WAIT_TEXT)
// "UPDATED <json>" once some card shows that text without the page being
// reloaded; <json> is what the cards show, field by field (textContent).
// Exits 0 when done, 1 with "FAILED <why>" otherwise.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { spawn } = require('child_process');
const WebSocket = require('ws');

const [url, tokenFile, png, cardsWanted, waitText] = process.argv.slice(2);
const token = fs.readFileSync(tokenFile, 'utf8').trim();
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'factory-chromium-'));
let browser = null;

function fail(why) {
  console.log('FAILED ' + why);
  finish(1);
}
function finish(code) {
  if (browser) browser.kill('SIGKILL');
  try { fs.rmSync(profile, { recursive: true, force: true }); } catch (e) { /* best effort */ }
  process.exit(code);
}
setTimeout(() => fail('timed out'), 90000);

// The test's coordinator has a certificate from its own fresh CA: loopback
// only, so certificate errors are ignored rather than a CA installed.
browser = spawn('chromium', ['--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run',
  '--disable-extensions', '--disable-background-networking', '--ignore-certificate-errors',
  '--hide-scrollbars', '--window-size=1280,860', '--remote-debugging-port=0',
  '--user-data-dir=' + profile, 'about:blank'], { stdio: ['ignore', 'ignore', 'pipe'] });
browser.on('exit', (c) => fail('chromium exited (' + c + ')'));
let err = '';
let started = false;
browser.stderr.on('data', (d) => {
  err += d;
  const m = err.match(/DevTools listening on (ws:\/\/[^\s]+)/);
  if (m && !started) {
    started = true;
    drive(m[1]).catch((e) => fail(String((e && e.stack) || e)));
  }
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function drive(browserWs) {
  const port = new URL(browserWs).port;
  let page = null;
  for (let i = 0; i < 50 && !page; i++) {
    const list = await (await fetch('http://127.0.0.1:' + port + '/json/list')).json();
    page = list.find((t) => t.type === 'page');
    if (!page) await sleep(100);
  }
  if (!page) return fail('no page target');
  const ws = new WebSocket(page.webSocketDebuggerUrl, { perMessageDeflate: false });
  await new Promise((res, rej) => { ws.on('open', res); ws.on('error', rej); });
  let id = 0;
  const pending = new Map();
  const logs = [];
  ws.on('message', (m) => {
    const j = JSON.parse(m);
    if (j.id && pending.has(j.id)) { pending.get(j.id)(j); pending.delete(j.id); }
    if (j.method === 'Runtime.consoleAPICalled') logs.push(j.params.args.map((a) => a.value).join(' '));
    if (j.method === 'Runtime.exceptionThrown') logs.push('exception: ' + JSON.stringify(j.params.exceptionDetails));
  });
  const call = (method, params) => new Promise((res) => {
    const n = ++id;
    pending.set(n, res);
    ws.send(JSON.stringify({ id: n, method, params: params || {} }));
  });
  const evaluate = async (expr) => {
    const r = await call('Runtime.evaluate', { expression: expr, returnByValue: true, awaitPromise: true });
    if (r.result && r.result.exceptionDetails) throw new Error(JSON.stringify(r.result.exceptionDetails));
    return r.result && r.result.result ? r.result.result.value : undefined;
  };
  await call('Runtime.enable');
  await call('Page.enable');
  await call('Page.navigate', { url });
  const until = async (what, expr, ms) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (await evaluate(expr)) return;
      await sleep(100);
    }
    throw new Error('waited ' + ms + ' ms for ' + what + '; page: ' +
      (await evaluate('document.body ? document.body.innerText : ""')) + '; console: ' + logs.join(' | '));
  };
  await until('the sign-in form', "document.getElementById('signin') && !document.getElementById('signin').hidden", 20000);
  await evaluate("document.getElementById('token').value = " + JSON.stringify(token) +
    "; document.getElementById('signin').requestSubmit(); true");
  await until(cardsWanted + ' cards', "document.querySelectorAll('.card').length >= " + Number(cardsWanted), 20000);
  await until('the live stream', "document.getElementById('live').className.includes('on')", 20000);
  // What the page shows, and whether a guest's text ever became markup.
  const snapshot = `(() => ({
    live: document.getElementById('live').textContent,
    cookie_visible: document.cookie,
    injected: window.__factory_xss === 1 || document.querySelectorAll('#cards img, #cards script, #cards b').length > 0,
    cards: [...document.querySelectorAll('.card')].map((c) => {
      const f = {};
      for (const e of c.querySelectorAll('[data-field]')) (f[e.dataset.field] = f[e.dataset.field] || []).push(e.textContent);
      return { tenant: c.dataset.tenant, text: c.innerText, fields: f };
    }),
  }))()`;
  await evaluate('window.__probe_marker = 1; true');
  console.log('READY ' + JSON.stringify(await evaluate(snapshot)));
  if (waitText) {
    await until('"' + waitText + '" on a card',
      "[...document.querySelectorAll('.card')].some((c) => c.innerText.includes(" + JSON.stringify(waitText) + "))", 30000);
    const s = await evaluate(snapshot);
    s.same_page = (await evaluate('window.__probe_marker === 1')) === true;
    console.log('UPDATED ' + JSON.stringify(s));
  }
  const shot = await call('Page.captureScreenshot', { format: 'png' });
  fs.writeFileSync(png, Buffer.from(shot.result.data, 'base64'));
  browser.removeAllListeners('exit');
  finish(0);
}
