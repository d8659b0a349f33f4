// Page glue: builds the peer panel inside the one gr.HTML Gradio never re-renders, starts the
// peer, and draws its state (peer list, join requests, live readouts, loss plot).
//   mount(element)   called once through widgets.js mount, the panel's js_on_load (daisy/space/page.py)
// The panel element carries data-modules: the frontend_js files the server has, so the peer
// imports optional parts (train.js, gpu.js) without probing for them with 404s.
import { bus } from './bus.js';
import { Peer } from './peer.js';
import { automationApi } from './automation.js';
import { speedText } from '../run/speed.js';
import { short } from '../hashing.js';

const PLOT_W = 600, PLOT_H = 180;
const PLOT_EVERY_MS = 250;

const esc = (text) => String(text ?? '').replace(/[&<>"']/g, (c) => (
  { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));

function readJson(el, name, fallback) {
  try { return JSON.parse(el.dataset[name] || ''); } catch { return fallback; }
}

export function mount(element) {
  const host = element.querySelector('#daisy-peer') || element;
  if (window.daisy) return window.daisy;     // a second mount (Gradio re-mount): one peer per tab
  const peer = new Peer(bus, { modules: readJson(host, 'modules', []), params: new URLSearchParams(location.search) });
  window.daisy = automationApi(peer, bus);
  host.innerHTML = `
    <div class="daisy-status" data-role="status">Connecting to the server…</div>
    <div class="daisy-error" data-role="error"></div>
    <h3>Peers</h3>
    <table data-role="peers"><thead><tr><th>peer</th><th>path</th><th>state</th><th>link</th><th>weight hash</th><th></th></tr></thead><tbody></tbody></table>
    <div data-role="requests-box" hidden>
      <h3>Join requests</h3>
      <table data-role="requests"><tbody></tbody></table>
    </div>
    <div class="daisy-stored" data-role="stored-box" hidden>
      <button type="button" data-action="resume-stored" data-role="resume-stored"></button>
    </div>
    <div class="daisy-stored" data-role="restore-box" hidden>
      <span data-role="restore-text"></span>
      <button type="button" data-action="restore-load">Load</button>
      <button type="button" data-action="restore-ignore">Ignore</button>
    </div>
    <h3>Run</h3>
    <div class="daisy-readouts">
      <div><b>step</b><span data-role="step">–</span></div>
      <div><b>loss</b><span data-role="loss">–</span></div>
      <div><b>tokens/s</b><span data-role="rate">–</span></div>
      <div><b>vs alone</b><span data-role="speedup">–</span></div>
      <div><b>weight hash</b><span data-role="hash">–</span></div>
      <div><b>replica diff</b><span data-role="replicas">no run yet</span></div>
      <div><b>compute</b><details class="daisy-readout"><summary data-role="path">checking…</summary><div data-role="path-detail"></div></details><a data-role="own-tab" class="daisy-own-tab" target="_blank" rel="noopener" hidden>Open this page in its own tab: every part of a step on every core</a></div>
      <div><b>data</b><details class="daisy-readout"><summary data-role="data">checking…</summary><div data-role="data-detail"></div></details></div>
    </div>
    <svg class="daisy-loss" data-role="plot" viewBox="0 0 ${PLOT_W} ${PLOT_H}" preserveAspectRatio="none"
         role="img" aria-label="loss curve"></svg>`;
  const $ = (role) => host.querySelector(`[data-role="${role}"]`);

  host.addEventListener('click', (ev) => {
    const button = ev.target.closest('button[data-action]');
    if (!button) return;
    try {
      if (button.dataset.action === 'resume-stored') peer.storedRun.resume().catch(() => {});   // the panel shows why
      else if (button.dataset.action === 'restore-load') peer.restore.accept().catch((err) => peer.set({ error: `Checkpoint refused: ${err.message || err}` }));
      else if (button.dataset.action === 'restore-ignore') peer.restore.decline();
      else if (button.dataset.action === 'approve') peer.approve(button.dataset.peer);
      else if (button.dataset.action === 'keep-out') peer.keepOut(button.dataset.peer);
      else peer.reject(button.dataset.peer);
    } catch (err) { $('error').textContent = err.message; }
  });

  let queued = false;
  const render = () => {
    queued = false;
    const s = peer.s;
    $('status').textContent = s.message || (s.peerId ? 'Connected.' : 'Connecting to the server…');
    $('error').textContent = s.error || '';
    $('peers').tBodies[0].innerHTML = s.peers.map((p) => peerRow(p, s)).join('');
    const showRequests = s.role === 'host' && s.requests.length > 0;
    $('requests-box').hidden = !showRequests;
    $('requests').tBodies[0].innerHTML = showRequests ? s.requests.map(requestRow).join('') : '';
    const offer = !s.running && s.storedOffer;
    $('stored-box').hidden = !offer;
    if (offer) {
      const devices = offer.rosterSize ? `vouched by ${offer.vouchedBy} of ${offer.rosterSize} device${offer.rosterSize === 1 ? '' : 's'}` : '';
      const whose = [offer.runId ? `run ${offer.runId}` : '', devices].filter(Boolean).join(', ');
      $('resume-stored').textContent = `Resume step ${offer.step} of the group's run${whose ? ` (${whose})` : ''}`;
    }
    // a group restore offered to a page that holds a model: nothing replaces it without a click
    const restore = !s.running && s.restoreOffer;
    $('restore-box').hidden = !restore;
    if (restore) $('restore-text').textContent = `${restore.name} (${restore.from}) offers step ${restore.step} of ${restore.steps}, hash ${short(restore.hash)}…: `;
    $('step').textContent = s.config ? `${s.step} / ${s.totalSteps}` : '–';
    $('loss').textContent = s.loss === null ? '–' : s.loss.toFixed(4);
    $('rate').textContent = s.tokensPerS === null ? '–' : Math.round(s.tokensPerS).toLocaleString('en-US');
    $('speedup').textContent = speedText(s.speed, s.replicas?.count ?? 1, s.config?.local_steps ?? 1);
    $('hash').textContent = s.hash ? short(s.hash) : '–';
    $('hash').title = s.hash || '';
    $('replicas').textContent = replicaText(s);
    // a short label; the reason and the engine on demand (the <details>, and the label's title)
    $('path').textContent = s.path ? (s.pathLabel || s.path.toUpperCase()) : 'checking…';
    const detail = s.path ? `${s.pathReason}${s.engine ? ` (steps on ${s.engine})` : ''}` : '';
    $('path').title = detail;
    if ($('path-detail').textContent !== detail) $('path-detail').textContent = detail;
    // inside another site's frame (the Space on huggingface.co) the page is not isolated, so it
    // runs one CPU thread: offer the same page in a tab of its own, where it is
    const framed = window.top !== window.self && !globalThis.crossOriginIsolated;
    $('own-tab').hidden = !(framed && s.threads && !s.threads.shared && (navigator.hardwareConcurrency || 1) > 1);
    if (framed) $('own-tab').href = location.href;
    const [dataLabel, dataDetail] = dataText(s.dataSource);
    $('data').textContent = dataLabel;
    $('data').title = dataDetail;
    if ($('data-detail').textContent !== dataDetail) $('data-detail').textContent = dataDetail;
    // the curve is redrawn at most every PLOT_EVERY_MS while a run goes (a default step takes
    // ~40 ms; a redraw ~2 ms), at once otherwise; a skipped redraw comes with a later render
    const plotKey = `${s.curve.length}:${s.curve.at(-1)}:${$('plot').clientWidth}`;
    if (plotKey !== drawnKey) {
      const wait = s.running ? drawnAt + PLOT_EVERY_MS - performance.now() : 0;
      if (wait <= 0) {
        drawPlot($('plot'), s.curve);
        drawnKey = plotKey;
        drawnAt = performance.now();
      } else if (plotTimer === null) plotTimer = setTimeout(() => { plotTimer = null; render(); }, wait);
    }
  };
  let drawnKey = '', drawnAt = -Infinity, plotTimer = null;
  bus.on('state', () => { if (!queued) { queued = true; setTimeout(render, 16); } });
  peer.boot();
  render();
  return window.daisy;
}

function peerRow(p, s) {
  const badges = [];
  if (p.id === s.peerId) badges.push('<span class="daisy-badge me">you</span>');
  if (p.role === 'host') badges.push('<span class="daisy-badge">host</span>');
  if (/\bleader\b/.test(p.state || '')) badges.push('<span class="daisy-badge leader">leader</span>');
  const state = (p.state || 'idle').replace(/\s*\bleader\b/, '');
  const link = p.id === s.peerId ? '—' : (s.links[p.id] || 'not linked');
  const hash = s.peerHashes[p.id] || (p.id === s.peerId ? s.hash : null);
  const inRun = s.run && s.run.roster.includes(p.id);
  return `<tr data-peer="${esc(p.id)}"><td>${esc(p.name)}${badges.join('')}</td>` +
         `<td>${p.path ? esc(p.path.toUpperCase()) : '?'}</td><td>${esc(state)}</td>` +
         `<td class="daisy-link" title="${esc(link)}">${esc(link.split(':')[0])}</td>` +
         `<td class="daisy-hash" title="${esc(hash || '')}">${inRun && hash ? esc(short(hash)) : '–'}</td>` +
         `<td>${keepOutCell(p, s)}</td></tr>`;
}

// "don't train with this device": this page refuses any roster with it (and a room's host removes it)
function keepOutCell(p, s) {
  if (p.id === s.peerId) return '';
  const why = s.keptOut[p.id];
  if (why) return `<span class="daisy-kept-out" title="${esc(why)}">kept out</span>`;
  return `<button type="button" class="keep-out" data-action="keep-out" data-peer="${esc(p.id)}">Don't train with this device</button>`;
}

function requestRow(r) {
  return `<tr data-request="${esc(r.id)}"><td>${esc(r.name)} asks to join</td><td>` +
         `<button class="accept" data-action="approve" data-peer="${esc(r.id)}">Accept</button>` +
         `<button class="reject" data-action="reject" data-peer="${esc(r.id)}">Reject</button></td></tr>`;
}

function replicaText(s) {
  if (!s.replicas) return 'no run yet';
  const { count, agree, agreeing, step } = s.replicas;
  if (count === 1) return `1 replica at step ${step} (no other peer in this run)`;
  const a = s.audits;
  // each contribution (a step's gradient, or a round of `span` local steps) audited with chance
  // `rate`: a liar's forgeries are caught after 1/rate contributions, span/rate steps, on average
  const unit = (a?.span ?? 1) > 1 ? 'rounds' : 'gradients';
  const audited = !a ? '' : a.rate ? `; ${unit} audited through step ${a.through} (one liar is caught within ~${Math.round((a.span ?? 1) / a.rate)} steps)` : `; ${unit} not audited`;
  return (agree ? `${agreeing ?? count} of ${count} replicas agree at step ${step}` : `MISMATCH among ${count} replicas at step ${step}`) + audited;
}

// the data readout -> [short label, detail on demand]: what the source means, then why
function dataText(d) {
  if (!d) return ['checking…', ''];
  if (d.source === 'fineweb-edu') return ['FineWeb-Edu', d.dataId || ''];
  return [d.summary || (d.source === 'builtin' ? 'the built-in corpus' : d.source), d.reason || ''];
}

// The loss curve as an SVG polyline over (step, loss) in a frame whose axes are labelled: "step"
// under the x axis with the first and last step at its ends, "loss" beside the y axis with the
// highest and lowest loss at its ends; each number is its own label.
const PLOT_L = 56, PLOT_R = 12, PLOT_T = 22, PLOT_B = 30;

export function plotMarkup(curve, width = PLOT_W) {
  const frame = `<text class="daisy-plot-title" x="${width / 2}" y="14" text-anchor="middle" font-size="12" fill="currentColor">loss per step</text>`;
  if (curve.length === 0) {
    return frame + `<text x="${width / 2}" y="${PLOT_H / 2}" text-anchor="middle" font-size="12" fill="currentColor" opacity="0.6">loss curve: no run yet</text>`;
  }
  let s0 = curve[0][0], s1 = curve[curve.length - 1][0], lo = Infinity, hi = -Infinity;
  for (const [, loss] of curve) { if (loss < lo) lo = loss; if (loss > hi) hi = loss; }
  if (s1 === s0) s1 = s0 + 1;
  if (hi === lo) hi = lo + 1e-6;
  const x0 = PLOT_L, x1 = width - PLOT_R, y0 = PLOT_T, y1 = PLOT_H - PLOT_B;
  const x = (st) => x0 + ((st - s0) / (s1 - s0)) * (x1 - x0);
  const y = (l) => y1 - ((l - lo) / (hi - lo)) * (y1 - y0);
  const points = curve.map(([st, l]) => `${x(st).toFixed(1)},${y(l).toFixed(1)}`).join(' ');
  const label = (cls, tx, ty, anchor, text) =>
    `<text class="${cls}" x="${tx}" y="${ty}" font-size="11" text-anchor="${anchor}" fill="currentColor">${text}</text>`;
  return frame +
    `<path d="M${x0},${y0} V${y1} H${x1}" fill="none" stroke="currentColor" stroke-opacity="0.4"/>` +
    `<polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="${points}"/>` +
    label('daisy-plot-y-max', x0 - 4, y0 + 4, 'end', hi.toFixed(3)) +
    label('daisy-plot-y-min', x0 - 4, y1, 'end', lo.toFixed(3)) +
    `<text class="daisy-plot-y-axis" x="12" y="${(y0 + y1) / 2}" font-size="11" text-anchor="middle" fill="currentColor" transform="rotate(-90 12 ${(y0 + y1) / 2})">loss</text>` +
    label('daisy-plot-x-min', x0, y1 + 14, 'start', String(s0)) +
    label('daisy-plot-x-max', x1, y1 + 14, 'end', String(s1)) +
    label('daisy-plot-x-axis', (x0 + x1) / 2, y1 + 24, 'middle', 'step');
}

// the viewBox follows the element's width, so the labels are not stretched with it
function drawPlot(svg, curve) {
  const width = Math.max(300, Math.round(svg.clientWidth || PLOT_W));
  if (svg.dataset.width !== String(width)) {
    svg.dataset.width = String(width);
    svg.setAttribute('viewBox', `0 0 ${width} ${PLOT_H}`);
  }
  svg.innerHTML = plotMarkup(curve, width);
}

// The checkpoint loader (its own gr.HTML beside the download buttons, never re-rendered): the
// button opens a native file picker; the picked .pt goes to window.daisy.load, and the result
// (or the server's reason for refusing it) is shown next to the button.
//   mountLoader(element)   called once through widgets.js, that gr.HTML's js_on_load (daisy/space/page.py)
export function mountLoader(element) {
  const $ = (role) => element.querySelector(`[data-role="${role}"]`);
  const button = $('load-button'), input = $('load-file'), status = $('load-status');
  if (!button || !input || !status || button.dataset.wired) return;
  button.dataset.wired = '1';
  button.addEventListener('click', () => input.click());     // a user gesture: the picker opens
  input.addEventListener('change', async () => {
    const file = input.files && input.files[0];
    input.value = '';                                         // picking the same file again fires again
    if (!file) return;
    const show = (text, state) => { status.textContent = text; status.dataset.state = state; };
    if (!window.daisy) { show('The peer has not loaded yet.', 'error'); return; }
    show(`Loading ${file.name}…`, 'busy');
    try {
      const r = await window.daisy.load(file);
      show(`Loaded ${file.name}: step ${r.step}, weights ${short(r.hash)}.`, 'ok');
    } catch (err) {
      show(`Refused ${file.name}: ${err.message || err}`, 'error');
    }
  });
}
