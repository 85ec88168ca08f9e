// The Factory dashboard: one card per tenant, from GET /v1/tenants, kept
// live by GET /v1/events. Everything a guest reported (names, models,
// diagnoses) is put on the page as text (textContent), never as HTML.
'use strict';

const tenants = new Map(); // name -> the tenant as GET /v1/tenants gives it
let source = null;
let reloadTimer = null;

// What could act on the reader is shown escaped, as the CLI shows it
// (common/display.hpp): C0 and C1 controls and DEL as \xHH (\n, \r, \t
// by name), bidi controls and line/paragraph separators as \uHHHH. As text
// a guest's markup is harmless; its U+202E would still reorder the line it
// sits on (Trojan Source), so it never reaches the page as itself.
const kActive = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const kNamed = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };
function shown(text) {
  return String(text).replace(kActive, (c) => {
    if (kNamed[c]) return kNamed[c];
    const n = c.charCodeAt(0);
    return n < 0x80 ? '\\x' + n.toString(16).padStart(2, '0')
                    : '\\u' + n.toString(16).padStart(4, '0');
  });
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = shown(text);
  return e;
}

function field(tag, cls, name, text) {
  const e = el(tag, cls, text);
  e.dataset.field = name;
  return e;
}

const num = (v) => typeof v === 'number' && isFinite(v);
const gib = (mib) => (mib / 1024).toFixed(1);

async function api(path, opts) {
  const o = Object.assign({ credentials: 'same-origin', headers: {} }, opts || {});
  o.headers.Accept = 'application/json';
  return fetch(path, o);
}

function setLive(on, text) {
  const l = document.getElementById('live');
  l.className = 'live ' + (on ? 'on' : 'off');
  l.textContent = text;
}

function showSignIn(message) {
  if (source) { source.close(); source = null; }
  document.getElementById('signin').hidden = false;
  document.getElementById('signout').hidden = true;
  document.getElementById('cards').replaceChildren();
  document.getElementById('signin-error').textContent = shown(message || '');
  setLive(false, 'signed out');
}

async function signIn(ev) {
  ev.preventDefault();
  const input = document.getElementById('token');
  const r = await api('/v1/session', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ token: input.value.trim() }),
  });
  input.value = '';
  if (!r.ok) {
    let msg = 'sign-in failed (' + r.status + ')';
    try { msg = (await r.json()).error.message; } catch (e) { /* keep the status */ }
    return showSignIn(msg);
  }
  start();
}

async function signOut() {
  await api('/v1/session', { method: 'DELETE' });
  showSignIn('');
}

async function reload() {
  const r = await api('/v1/tenants');
  if (r.status === 401 || r.status === 403) return showSignIn('the session ended; sign in again');
  if (!r.ok) return;
  const body = await r.json();
  tenants.clear();
  for (const t of body.tenants || []) tenants.set(t.name, t);
  renderAll();
}

function scheduleReload() {
  if (reloadTimer) return;
  reloadTimer = setTimeout(() => { reloadTimer = null; reload(); }, 200);
}

function phaseText(t) {
  const p = t.plan || {};
  if (t.phase === 'provisioning' && num(p.steps_total))
    return 'provisioning ' + (num(p.steps_done) ? p.steps_done : 0) + '/' + p.steps_total;
  return t.phase || '-';
}

function agentText(a) {
  if (!a) return 'agent: -';
  if (a.connected) return 'agent connected' + (a.version ? ' (' + a.version + ')' : '') +
    (a.hostname ? ' on ' + a.hostname : '');
  return 'agent ' + (a.state === 'never_connected' ? 'not connected yet' : 'disconnected: ' + (a.state || '?'));
}

function gpuBlock(g) {
  const b = el('div', 'gpu');
  b.appendChild(field('div', 'name', 'gpu-name', (num(g.index) ? g.index + ': ' : '') + (g.name || 'GPU')));
  const f = el('div', 'figures');
  const add = (k, name, v) => {
    const d = el('div');
    d.appendChild(el('span', 'k', k));
    d.appendChild(field('span', 'v', name, v));
    f.appendChild(d);
  };
  add('util', 'util', num(g.utilization_percent) ? g.utilization_percent + '%' : '-');
  add('memory', 'memory', num(g.memory_used_mib) && num(g.memory_total_mib)
    ? gib(g.memory_used_mib) + ' / ' + gib(g.memory_total_mib) + ' GiB' : '-');
  add('temp', 'temp', num(g.temperature_c) ? g.temperature_c + ' °C' : '-');
  add('power', 'power', num(g.power_draw_w)
    ? Math.round(g.power_draw_w) + (num(g.power_limit_w) ? ' / ' + Math.round(g.power_limit_w) : '') + ' W' : '-');
  // A card in MIG mode: its slices by profile ("7 x 1g.18gb, 16 GiB each").
  if (g.mig_mode === 'Enabled') {
    const by = {};
    for (const m of Array.isArray(g.mig_instances) ? g.mig_instances : []) {
      const p = typeof m.profile === 'string' ? m.profile : '?';
      by[p] = by[p] || { n: 0, gib: m.memory_gib };
      by[p].n++;
    }
    const parts = Object.keys(by).sort().map((p) => by[p].n + ' x ' + p +
      (num(by[p].gib) ? ', ' + by[p].gib + ' GiB each' : ''));
    add('mig', 'mig', parts.length ? parts.join('; ') : 'on, no slices');
  }
  b.appendChild(f);
  return b;
}

function workload(h) {
  const w = el('div', 'workload');
  const models = (h && h.ollama && h.ollama.models) || [];
  if (models.length) {
    w.appendChild(el('div', 'k', 'models'));
    const ul = el('ul');
    for (const m of models)
      ul.appendChild(field('li', '', 'model', (m.name || '?') + ' — ' +
        (num(m.gpu_percent) ? m.gpu_percent + '% on the GPU' : 'share unknown')));
    w.appendChild(ul);
  }
  const k = h && h.k8s;
  if (k && typeof k === 'object') {
    const slices = (num(k.allocatable) ? k.allocatable : 0) + (num(k.capacity) ? ' / ' + k.capacity : '');
    w.appendChild(field('div', '', 'slices', slices + ' ' + (k.resource || 'GPU') + ' allocatable'));
  }
  return w;
}

function diagnoses(list) {
  const d = el('div', 'diagnoses');
  if (!list || !list.length) return d;
  const ul = el('ul');
  for (const x of list) {
    const li = field('li', '', 'diagnosis', '');
    li.appendChild(el('strong', '', x.code || '?'));
    li.appendChild(document.createTextNode(': ' + shown(x.summary || '')));
    if (x.fix) li.appendChild(el('div', 'fix', 'fix: ' + x.fix));
    ul.appendChild(li);
  }
  d.appendChild(ul);
  return d;
}

// A host drain the tenant is in (docs/maintenance.md), in a line; '' when none.
function maintenanceText(m) {
  if (!m || !m.node) return '';
  switch (m.state) {
    case 'noticed': return 'maintenance of ' + m.node + ': stops at ' + (m.deadline || '?');
    case 'stopping': return 'stopping for maintenance of ' + m.node;
    case 'drained': return 'drained for maintenance of ' + m.node;
    case 'starting': return 'starting after maintenance of ' + m.node;
    default: return '';
  }
}

function card(t) {
  const c = el('article', 'card');
  c.dataset.tenant = t.name;
  const h = el('h2');
  h.appendChild(field('span', '', 'name', t.name));
  h.appendChild(field('span', 'tier', 'tier', t.tier || '-'));
  c.appendChild(h);
  c.appendChild(field('span', 'phase ' + (t.phase || ''), 'phase', phaseText(t)));
  const p = t.plan || {};
  if (num(p.steps_total) && p.steps_total > 0) {
    const bar = el('div', 'bar');
    const fill = el('div');
    fill.style.width = Math.min(100, 100 * (num(p.steps_done) ? p.steps_done : 0) / p.steps_total) + '%';
    bar.appendChild(fill);
    c.appendChild(bar);
  }
  c.appendChild(field('div', 'agent', 'agent', agentText(t.agent)));
  const m = maintenanceText(t.maintenance);
  if (m) c.appendChild(field('div', 'maintenance', 'maintenance', m));
  const health = t.health;
  const gpus = (health && health.gpu && health.gpu.gpus) || [];
  for (const g of gpus) c.appendChild(gpuBlock(g));
  if (health && !gpus.length) c.appendChild(field('div', 'gpu', 'gpu-name', 'no GPU reported'));
  c.appendChild(workload(health));
  c.appendChild(diagnoses(t.active_diagnoses));
  if (health && health.received_at)
    c.appendChild(field('div', 'updated', 'updated', 'health at ' + health.received_at));
  return c;
}

function renderAll() {
  const cards = document.getElementById('cards');
  const names = [...tenants.keys()].sort();
  cards.replaceChildren(...names.map((n) => card(tenants.get(n))));
  document.getElementById('empty').hidden = names.length > 0;
}

function renderOne(name) {
  const t = tenants.get(name);
  if (!t) return scheduleReload();
  const old = [...document.querySelectorAll('.card')].find((c) => c.dataset.tenant === name);
  if (old) old.replaceWith(card(t)); else renderAll();
}

function onEvent(type, ev) {
  let d;
  try { d = JSON.parse(ev.data); } catch (e) { return; }
  setLive(true, 'live · ' + type + ' ' + (d.tenant || '') + ' ' + new Date().toLocaleTimeString());
  const t = tenants.get(d.tenant);
  if (!t) return scheduleReload();
  if (type === 'health') {
    t.health = d.health;
    const plan = (t.active_diagnoses || []).filter((x) => x.source === 'plan');
    t.active_diagnoses = plan.concat(d.diagnoses || []);
    return renderOne(d.tenant);
  }
  if (type === 'agent') {
    t.agent = Object.assign({}, t.agent, { connected: d.connected, state: d.state });
    if (d.version) t.agent.version = d.version;
    if (d.hostname) t.agent.hostname = d.hostname;
    return renderOne(d.tenant);
  }
  if (type === 'phase') {
    t.phase = d.phase;
    renderOne(d.tenant);
  }
  // Progress, plans and diagnoses change what the tenant view derives
  // (steps done, active diagnoses): it is read again.
  scheduleReload();
}

function connect() {
  if (source) source.close();
  source = new EventSource('/v1/events');
  source.addEventListener('open', () => { setLive(true, 'live'); reload(); });
  source.addEventListener('error', () => {
    setLive(false, 'reconnecting');
    // EventSource retries by itself unless the answer was an error (the
    // session ended, the coordinator restarted and forgot it): then ask.
    if (source.readyState === EventSource.CLOSED) setTimeout(start, 3000);
  });
  // `action`: a drain's notice, stop and return (and restarts) change the card.
  for (const type of ['health', 'agent', 'phase', 'progress', 'plan', 'diagnosis', 'action'])
    source.addEventListener(type, (ev) => onEvent(type, ev));
  source.addEventListener('reset', () => reload());
  source.addEventListener('dropped', () => setLive(false, 'fell behind; reconnecting'));
}

async function start() {
  let r;
  try {
    r = await api('/v1/session');
  } catch (e) {
    setLive(false, 'coordinator unreachable; retrying');
    return setTimeout(start, 3000);
  }
  if (r.status === 401 || r.status === 403) return showSignIn('');
  document.getElementById('signin').hidden = true;
  document.getElementById('signout').hidden = false;
  connect();
}

document.getElementById('signin').addEventListener('submit', signIn);
document.getElementById('signout').addEventListener('click', signOut);
start();
