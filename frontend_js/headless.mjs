#!/usr/bin/env node
// The headless peer: one more device of a group, with no browser (docs/ARCHITECTURE.md "Two hosts
// of one peer"). The same modules the page loads — the Peer of peer/peer.js with its run host,
// mesh, run controller, model store, stored run — hosted by Node instead of a page:
//
//   node frontend_js/headless.mjs http://127.0.0.1:7860 [--room CODE] [--name N] [--keep]
//
// What the page's host gives the peer, this one gives too: the server's URL (the page's origin),
// the URL parameters (--param k=v), RTCPeerConnection (@roamhq/wrtc) and WebSocket (ws) as globals
// (package.json's optional dependencies: `npm ci`), the goodbye on SIGINT/SIGTERM (the page's
// pagehide). The peer picks its compute path as in a page (peer.js detectPath: the CPU registry's
// best backend, threads under Node); nothing here chooses a backend.
//
// It trains as any member: it joins a run a peer starts (or starts one: --start), and leaves once
// its first run ended, unless --keep: then it stays, holds the model, answers joins, hands its
// stopped run to a fresh peer (group_state.js) and audits like any member — the group's keeper.
// Status lines on stdout (step, loss, tokens/s, peers, hash); --json: one JSON object per line.
// Commands on stdin, one a line: start [k=v,...] | stop | approve ID | reject ID | state | drops | quit;
// a join request to a room it hosts is asked there (y/n) unless --approve decides.
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { homedir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const PROG = 'node frontend_js/headless.mjs';
const HERE = dirname(fileURLToPath(import.meta.url));
const USAGE = `usage: ${PROG} URL [--room CODE] [--name N] [--approve all|ID,...] [--json] [--keep]
       [--start k=v,...] [--peers N] [--identity FILE] [--param k=v]...`;
const HELP = `${USAGE}

Joins the group of the DaisyChain server at URL as one more device (the page's peer, hosted by Node).
  --room CODE          join this room (its first device hosts it: approves who joins)
  --name N             the name the others see
  --approve all|ID,... as room host: approve everyone, or these peer ids (others are declined;
                       a name is the asker's own claim, never a credential); without it each
                       request is asked on stdin (y/n)
  --json               one JSON object per line on stdout (events: welcome, link, request, run-started,
                       step, run-ended, note, exit)
  --keep               stay after a run: hold the model, answer joins, restore fresh peers, store runs
  --start k=v,...      start a run with these settings (width=32,steps=100,...) once --peers others
                       are linked (default 1)
  --peers N            the linked peers --start waits for
  --identity FILE      where the seat's token is kept, so a restarted process is the same peer
                       (default: ~/.daisychain/headless-<hash of URL and room>.json)
  --param k=v          a URL parameter of the page (gpu, storeEvery, meshProtocol)
Commands on stdin: start [k=v,...] | stop | approve ID | reject ID | state | drops | quit`;

const LINGER_MS = 2000;        // after its run ended, before a peer without --keep leaves

class UsageError extends Error {}

// ---- the command line, pure: argv -> options ---------------------------------------------------
export function parseArgs(argv) {
  const o = { url: null, room: null, name: null, approve: null, json: false, keep: false, start: null, peers: 1,
              identity: null, params: new URLSearchParams(), help: false };
  const value = (i, flag) => {
    if (i + 1 >= argv.length || argv[i + 1].startsWith('--')) throw new UsageError(`argument ${flag}: expected one argument`);
    return argv[i + 1];
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '-h' || a === '--help') o.help = true;
    else if (a === '--json') o.json = true;
    else if (a === '--keep') o.keep = true;
    else if (a === '--room') o.room = value(i++, a);
    else if (a === '--name') o.name = value(i++, a);
    else if (a === '--identity') o.identity = value(i++, a);
    else if (a === '--approve') {
      const v = value(i++, a);
      o.approve = v === 'all' ? 'all' : new Set(v.split(',').map((x) => x.trim()).filter(Boolean));
    } else if (a === '--start') o.start = parseSettings(value(i++, a));
    else if (a === '--peers') {
      o.peers = Number(value(i++, a));
      if (!Number.isInteger(o.peers) || o.peers < 0 || o.peers > 31) throw new UsageError('argument --peers: a whole number 0..31');
    } else if (a === '--param') {
      const [k, ...rest] = value(i++, a).split('=');
      if (!k || !rest.length) throw new UsageError('argument --param: expected k=v');
      o.params.set(k, rest.join('='));
    } else if (a.startsWith('-')) throw new UsageError(`unrecognized argument: ${a}`);
    else if (o.url === null) o.url = a;
    else throw new UsageError(`unrecognized argument: ${a}`);
  }
  if (o.help) return o;
  if (!o.url) throw new UsageError('the following arguments are required: URL');
  let u;
  try { u = new URL(o.url); } catch { throw new UsageError(`URL: not a URL: ${o.url}`); }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new UsageError(`URL: http or https, not ${u.protocol}`);
  o.url = u.origin + u.pathname.replace(/\/+$/, '');
  if (o.room !== null) o.params.set('room', o.room);
  return o;
}

// "width=32,steps=100" -> {width: 32, steps: 100}; numbers stay numbers, the rest strings
// (exchange=int8); the run's own checks (config.js) judge them
export function parseSettings(text) {
  const out = {};
  for (const part of String(text).split(',').map((x) => x.trim()).filter(Boolean)) {
    const [k, v] = part.split('=');
    if (!k || v === undefined) throw new UsageError(`settings: expected k=v, got ${part}`);
    out[k] = /^-?\d+(\.\d+)?$/.test(v) ? Number(v) : v;
  }
  return out;
}

// a join request -> 'approve' | 'reject' | 'ask' under the policy (--approve). By peer id only:
// the server derives it from the seat's secret token, while a name is whatever the asker typed
export function approval(policy, request) {
  if (policy === 'all') return 'approve';
  if (policy instanceof Set) return policy.has(request.id) ? 'approve' : 'reject';
  return 'ask';
}

// one status line of the peer's state (what the page's panel shows)
export function statusLine(s) {
  const peers = s.peers.filter((p) => p.role !== 'pending').length;
  const rate = s.tokensPerS ? ` ${Math.round(s.tokensPerS)} tok/s` : '';
  const loss = s.loss === null || s.loss === undefined ? '' : ` loss ${s.loss.toFixed(4)}`;
  return `step ${s.step}/${s.totalSteps}${loss}${rate} peers ${peers} hash ${(s.hash || '').slice(0, 16)}`;
}

// text for a terminal, pure: a peer's words reach the status lines (a STOP's reason, up to 400
// characters of whatever it sent) and must not move the cursor, recolour or retitle the terminal,
// or start a line of their own (a fake "approve? [y/n]"); control characters are shown escaped
// (keep: the ones left as they are, e.g. '\n' for stack traces on stderr)
export function printable(text, keep = '') {
  return String(text).replace(/[\u0000-\u001f\u007f-\u009f]/g,
    (c) => (keep.includes(c) ? c : `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`));
}

// ---- the host: what a page's browser gives the peer --------------------------------------------
async function installHostGlobals() {
  const missing = [];
  if (!globalThis.WebSocket) {
    try { globalThis.WebSocket = (await import('ws')).WebSocket; } catch { missing.push('ws'); }
  }
  if (!globalThis.RTCPeerConnection) {
    try { globalThis.RTCPeerConnection = (await import('@roamhq/wrtc')).default.RTCPeerConnection; } catch { missing.push('@roamhq/wrtc'); }
  }
  if (missing.length) throw new Error(`${missing.join(' and ')} not installed: run \`npm ci\` at the repository root`);
}

// the frontend_js files this checkout has (the page gets the server's list: daisy/space/page.py)
function moduleList(dir = HERE) {
  const out = [];
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      if (e.isDirectory()) walk(join(d, e.name));
      else if (e.name.endsWith('.js')) out.push(relative(dir, join(d, e.name)).split('\\').join('/'));
    }
  };
  walk(dir);
  return out.sort();
}

// the seat's identity: the server's token (its peer id is derived from it, so a restarted process
// presenting it is the same peer: daisy/space/signaling/hub.py _identity)
function identityFile(o) {
  if (o.identity) return o.identity;
  const key = createHash('sha256').update(`${o.url} ${o.room ?? ''}`).digest('hex').slice(0, 16);
  return join(homedir(), '.daisychain', `headless-${key}.json`);
}

function loadIdentity(file) {
  try {
    const j = JSON.parse(readFileSync(file, 'utf8'));
    return typeof j.token === 'string' && j.token.length <= 200 ? j.token : null;
  } catch { return null; }
}

function saveIdentity(file, welcome) {
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, JSON.stringify({ token: welcome.token, peerId: welcome.peerId, name: welcome.name }) + '\n', { mode: 0o600 });
}

// ---- the peer, hosted ----------------------------------------------------------------------------
async function main(argv) {
  let o;
  try { o = parseArgs(argv); } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`${USAGE}\n${PROG}: error: ${err.message}\n`);
    return 2;
  }
  if (o.help) { process.stdout.write(HELP + '\n'); return 0; }
  await installHostGlobals();
  // stdout carries status lines (or JSON lines) only: the peer's console goes to stderr
  for (const k of ['log', 'info', 'warn', 'debug']) console[k] = (...a) => process.stderr.write(printable(a.map(String).join(' '), '\n\t') + '\n');
  const [{ Bus }, { Peer }, { automationApi }] = await Promise.all([import('./peer/bus.js'), import('./peer/peer.js'), import('./peer/automation.js')]);

  const idFile = identityFile(o);
  const bus = new Bus();
  const peer = new Peer(bus, { modules: moduleList(), params: o.params, server: o.url,
                               connection: { name: o.name, token: loadIdentity(idFile) } });
  const daisy = automationApi(peer, bus);

  const out = (event, fields, text) => {
    if (o.json) process.stdout.write(JSON.stringify({ event, t: Date.now(), ...fields }) + '\n');
    else if (text) process.stdout.write(printable(text) + '\n');
  };
  let exiting = false;
  const exit = (code, why) => {
    if (exiting) return;
    exiting = true;
    out('exit', { code, why }, `exit ${code}: ${why}`);
    peer.goodbye(`the headless peer ended: ${why}`);
    setTimeout(() => process.exit(code), 300).unref?.();     // the goodbye's frames and LEAVE go out first
  };

  // ---- events -> status lines
  bus.on('signal:welcome', (m) => {
    saveIdentity(idFile, m);
    out('welcome', { peerId: m.peerId, name: m.name, role: m.role, group: m.group?.kind ?? null },
      `${m.peerId} (${m.name}) ${m.role} of ${o.room ? `room ${o.room}` : 'the network group'}`);
  });
  let links = {};
  bus.on('state', (s) => {
    for (const [id, st] of Object.entries(s.links)) if (links[id] !== st) out('link', { peer: id, state: st }, `link ${id}: ${st}`);
    links = { ...s.links };
  });
  let lastLine = 0;
  bus.on('step', (e) => {
    const s = peer.state();
    const fields = { step: e.step, loss: e.loss, hash: e.hash, peers: e.peers, tokensPerS: s.tokensPerS, steps: s.totalSteps };
    if (o.json) out('step', fields);
    else if (Date.now() - lastLine >= 1000 || e.step === s.totalSteps) { lastLine = Date.now(); out('step', fields, statusLine(s)); }
  });
  bus.on('step-undone', (e) => out('step-undone', { step: e.step, hash: e.hash }, `back to step ${e.step}`));
  bus.on('run-started', (e) => out('run-started', { runId: e.runId, roster: e.roster, leader: e.leader, config: e.config },
    `run ${e.runId} started: ${e.roster.length} device(s), ${e.config.steps} steps, led by ${e.leader}`));
  bus.on('roster-changed', (e) => out('roster-changed', { epoch: e.epoch, from: e.from, roster: e.roster },
    `roster from step ${e.from + 1}: ${e.roster.join(', ')}`));
  let lastNote = '';
  bus.on('state', (s) => {
    if (s.message && s.message !== lastNote) { lastNote = s.message; out('note', { text: s.message }, s.message); }
  });
  bus.on('signal:close', ({ final, reason }) => { if (final && !exiting) exit(1, `the server closed the connection: ${reason}`); });

  // ---- a run ends: leave, unless this peer keeps the group's model
  bus.on('run-ended', (e) => {
    const drops = peer.mesh.drops;
    out('run-ended', { state: e.state, step: e.step, hash: e.hash, error: e.error, message: e.message, history: e.history,
                       drops: drops.count, stale: drops.stale },
      `run ${e.state} at step ${e.step}, hash ${(e.hash || '').slice(0, 16)}${e.error ? ` (${e.error})` : ''}: ${e.message}`);
    // the last FIN, audits and transcripts this peer owes the others go out before the goodbye
    if (!o.keep) setTimeout(() => exit(e.error || e.state === 'failed' ? 1 : 0, `the run ${e.state}`), LINGER_MS);
  });
  // the keeper hands its stopped run to a fresh peer (announced 'idle': it holds no model) whose
  // link comes up while this one is idle; the peer adopts it (group_state.js). Each peer is
  // considered once, when its link comes up: a member of the run holds the model already, and a
  // state of up to 40 MB must not be on its way when that member starts the next run.
  if (o.keep) {
    const seen = new Set();
    bus.on('state', (s) => {
      for (const [id, st] of Object.entries(s.links)) {
        if (st !== 'linked' || seen.has(id)) continue;
        seen.add(id);
        const q = s.peers.find((p) => p.id === id);
        if (peer.runs.busy || !peer.models.resumePoint() || !q || !['', 'idle'].includes(q.state || '')) continue;
        peer.restore.share([id]).catch((err) => out('note', { text: `restore to ${id}: ${err.message || err}` }));
      }
    });
  }

  // ---- room hosting: the approval policy, else the question on stdin
  const asked = [];
  bus.on('join-request', (req) => {
    const verdict = approval(o.approve, req);
    out('request', { peer: req.id, name: req.name, verdict }, `join request from ${req.name} (${req.id}): ${verdict === 'ask' ? 'approve? [y/n]' : verdict}`);
    try {
      if (verdict === 'approve') daisy.approve(req.id);
      else if (verdict === 'reject') daisy.reject(req.id);
      else asked.push(req.id);
    } catch (err) { out('note', { text: err.message }, err.message); }
  });

  // ---- starting a run: --start once --peers others are linked
  if (o.start) {
    let started = false;
    bus.on('state', (s) => {
      if (started || peer.runs.busy) return;
      const ready = Object.values(s.links).filter((st) => st === 'linked').length;
      if (ready < o.peers) return;
      started = true;
      daisy.start(o.start).catch((err) => exit(1, `the run did not start: ${err.message || err}`));
    });
  }

  // ---- commands on stdin
  const commands = {
    start: (arg) => daisy.start(arg ? parseSettings(arg) : {}),
    stop: () => daisy.stop(),
    approve: (id) => daisy.approve(id),
    reject: (id) => daisy.reject(id),
    state: () => process.stdout.write(JSON.stringify(o.json ? { event: 'state', t: Date.now(), state: peer.state() } : peer.state()) + '\n'),
    drops: () => { const d = daisy.mesh.drops(); out('drops', d, `${d.count} bad frames dropped, ${d.stale} of a run that ended`); },
    quit: () => exit(0, 'quit'),
    y: () => daisy.approve(asked.shift()),
    n: () => daisy.reject(asked.shift()),
  };
  createInterface({ input: process.stdin }).on('line', (line) => {
    const [cmd, ...rest] = line.trim().split(/\s+/);
    if (!cmd) return;
    const fn = commands[cmd.toLowerCase()];
    if (!fn) { out('note', { text: `unknown command: ${cmd}` }, `commands: ${Object.keys(commands).join(', ')}`); return; }
    try {
      const r = fn(rest.join(' '));
      if (r && typeof r.catch === 'function') r.catch((err) => out('note', { text: err.message || String(err) }, err.message || String(err)));
    } catch (err) { out('note', { text: err.message || String(err) }, err.message || String(err)); }
  });

  // ---- leaving: the page's goodbye
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => exit(0, sig));
  // as in a page, an error nobody caught is reported and the peer goes on (Node would end the
  // process: one failed best-effort send must not take a member out of its run)
  process.on('unhandledRejection', (err) => console.warn('daisy: unhandled rejection:', err?.stack || err));
  process.on('uncaughtException', (err) => console.warn('daisy: uncaught exception:', err?.stack || err));

  peer.boot();
  return null;
}

const isMain = process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1];
if (isMain) {
  main(process.argv.slice(2)).then((code) => { if (code !== null) process.exit(code); },
    (err) => { process.stderr.write(`${PROG}: ${err.message || err}\n`); process.exit(1); });
}
