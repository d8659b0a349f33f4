// The page's widgets: what the Gradio buttons and boxes of daisy/space/page.py do. Each event's
// js= is a one-line stub that imports this module and calls one export with the event's inputs
// (positional, in the page's `inputs` order); the return value (or what its promise resolves
// to) is the event's output value, [] where the event has no output.
//
//   mount(element)        the peer panel's js_on_load: ui.js mount, then keep the widgets current
//   mountLoader(element)  the checkpoint loader's js_on_load (ui.js)
//   start(...settings)    Start: a new run with the sliders' settings -> the line under the buttons
//   continueRun()         Continue: the run this tab holds, from its step -> that line
//   stop(), createRoom()
//   generate(prompt, temperature, topK, seed, tokens) -> the Generated text box
//   modelAction(method, what)   the download buttons: the result goes to #model-status
//
// Everything goes through window.daisy (the automation API, docs/ARCHITECTURE.md).
import { mount as mountPanel, mountLoader as mountLoaderPanel } from './ui.js';
import { short } from '../hashing.js';

let settings = [];                              // the sliders' {name, label, min, max, step}
let noModel = 'Train or load a model first.';   // = daisy.space.page.NO_MODEL (the panel's data-no-model)
const READY_TEXT = 'Press Generate to continue the prompt with the model.';

export function mount(element) {
  const api = mountPanel(element);
  const host = element.querySelector('#daisy-peer') || element;
  try { settings = JSON.parse(host.dataset.settings || '[]'); } catch { settings = []; }
  noModel = host.dataset.noModel || noModel;
  if (!api.widgetsFollow) {
    api.widgetsFollow = true;
    let queued = false;
    api.on('state', () => { if (!queued) { queued = true; setTimeout(() => { queued = false; refresh(api); }, 50); } });
    refresh(api);
  }
  return api;
}

export function mountLoader(element) { return mountLoaderPanel(element); }

// A value the page accepts for a setting: a slider's own value (min + k * step, in range). The
// number box beside a slider takes anything; say the rule naming the setting the page shows.
export function settingProblem(spec, value) {
  const v = Number(value);
  const k = (v - spec.min) / spec.step;
  if (Number.isFinite(v) && Number.isInteger(k) && v >= spec.min && v <= spec.max) return null;
  const allowed = spec.step === 1 ? `a whole number from ${spec.min} to ${spec.max}`
    : `one of ${spec.min}, ${spec.min + spec.step}, …, ${spec.max} (steps of ${spec.step})`;
  return `${spec.label} must be ${allowed}; the box says ${value}.`;
}

export function start(...values) {
  const d = window.daisy;
  if (!d) return 'The peer has not loaded yet.';
  const config = {};
  for (const [i, spec] of settings.entries()) {
    const problem = settingProblem(spec, values[i]);
    if (problem) return problem;
    config[spec.name] = Number(values[i]);
  }
  // the panel shows why a start failed; catch so it is not an unhandled rejection
  d.start({ ...config, resume: false }).catch(() => {});
  return '';
}

export function continueRun() {
  const d = window.daisy;
  if (!d) return 'The peer has not loaded yet.';
  d.start({ resume: true }).catch(() => {});
  return '';
}

export function stop() {
  if (window.daisy) window.daisy.stop();
  return [];
}

// Create a room: a server-made code (daisy.space.signaling.routes.make_room_router), then this page
// reopens in it; the link in the address bar is what to share.
export async function createRoom() {
  const r = await fetch('/api/room', { method: 'POST' });
  if (!r.ok) { alert('Could not create a room: HTTP ' + r.status); return []; }
  location.search = '?room=' + encodeURIComponent((await r.json()).room);
  return [];
}

// Generate: runs in the page (frontend_js/generate.js through window.daisy.generate) on the
// peer's current weights: the weights stay in the browser, and the text is the one the Python
// reference gives for the same weights, prompt, settings and seed (tested). Temperature 0 is
// greedy, here as in the kit and in Python.
export async function generate(prompt, temperature, topK, seed, tokens) {
  const d = window.daisy;
  if (!d || !d.hasModel || !d.hasModel()) return noModel;
  try {
    const text = await d.generate(prompt, { temperature: Number(temperature), topK: Math.round(topK),
                                            seed: Math.round(seed), tokens: Math.round(tokens) });
    return prompt + text;
  } catch (e) { return 'Generation failed: ' + (e && e.message || e); }
}

// The download buttons: the page sends its replica to the model routes and saves the file they
// return; the message (file, size, hash) lands in #model-status (the loader's gr.HTML).
export async function modelAction(method, what) {
  const d = window.daisy;
  let text;
  if (!d || !d.hasModel || !d.hasModel()) text = noModel;
  else {
    try { text = await d[method](); } catch (e) { text = `${what} failed: ${e && e.message || e}`; }
  }
  showModelStatus(text, text === noModel ? 'auto' : 'result', d && d.state().hash);
  return [];
}

// kind 'auto': the model line (refresh); 'result': a download's message, kept while the weights
// are the ones it was about (hash)
function showModelStatus(text, kind, hash = null) {
  const el = document.getElementById('model-status');
  if (!el) return;
  el.textContent = text;
  el.dataset.kind = kind;
  el.dataset.hash = hash || '';
}

// What the widgets say follows the model this tab holds, not only the last click: Start and
// Continue say what they will do; the Generated text box and the model line stop saying
// "Train or load a model first." once a run or a load gives this tab a model.
function refresh(api) {
  const s = api.state();
  const has = api.hasModel();
  const point = s.resumable;
  setLabel(document.getElementById('daisy-start'), has ? 'Start a new run' : 'Start training');
  const resume = document.getElementById('daisy-continue');
  if (resume) {
    setLabel(resume, point ? `Continue from step ${point.step} of ${point.steps}` : 'Continue');
    resume.toggleAttribute('data-daisy-shown', Boolean(point) && !s.running);
  }
  const out = document.querySelector('#gen-output textarea');
  if (out) {
    out.placeholder = has ? READY_TEXT : noModel;
    if (has && out.value === noModel) {
      out.value = '';
      out.dispatchEvent(new Event('input', { bubbles: true }));   // Gradio's copy of the value too
    }
  }
  const status = document.getElementById('model-status');
  if (status && (status.dataset.kind !== 'result' || status.dataset.hash !== (s.hash || ''))) {
    showModelStatus(has ? `This tab holds the model at step ${s.step}${s.totalSteps ? ` of ${s.totalSteps}` : ''}` +
                          `${s.hash ? ` (weights ${short(s.hash)})` : ''}: download it with the buttons above.` : noModel, 'auto');
  }
}

function setLabel(button, text) {
  if (button && button.textContent !== text) button.textContent = text;
}
