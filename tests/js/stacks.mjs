// The JavaScript stack of running node processes, even of one spinning in a loop or in microtasks
// (its timers never fire, so its own test timeouts never do): `node tests/js/stacks.mjs PID...`.
// Each process in turn gets SIGUSR1 (node opens its inspector on 127.0.0.1:9229), is paused a few
// times through the DevTools protocol, and the top of each distinct paused stack is printed; then
// it is killed (which frees the port for the next).
// tests/test_js_mirror.py runs it on the test files still running when the Node suite hits its bound.
import WebSocket from 'ws';

const INSPECTOR = 'http://127.0.0.1:9229/json/list';
const SAMPLES = 12;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function targetOf(pid) {
  process.kill(pid, 'SIGUSR1');
  for (let i = 0; i < 30; i++) {
    await sleep(100);
    try {
      const list = await (await fetch(INSPECTOR)).json();
      if (list[0]?.webSocketDebuggerUrl) return list[0].webSocketDebuggerUrl;
    } catch { /* not listening yet */ }
  }
  throw new Error(`pid ${pid}: no inspector on 9229 within 3 s`);
}

// -> its paused stacks: SAMPLES pauses (a spin in microtasks is often paused inside node's own
// hooks, between turns of the loop), each distinct stack once with its count; or throws
async function stacksOf(pid) {
  const ws = new WebSocket(await targetOf(pid));
  const scripts = new Map();                 // scriptId -> url (Debugger.enable announces each)
  const seen = new Map();                    // stack text -> times paused there
  let id = 0, samples = 0;
  const send = (method, params = {}) => ws.send(JSON.stringify({ id: ++id, method, params }));
  const here = (scriptId) => (scripts.get(scriptId) ?? '?').replace(/^file:\/\/.*?\/(frontend_js|tests)\//, '$1/');
  try {
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => (samples ? resolve() : reject(new Error(`pid ${pid}: did not pause within 5 s`))), 5000);
      ws.on('error', reject);
      ws.on('open', () => { send('Debugger.enable'); send('Debugger.pause'); });
      ws.on('message', (raw) => {
        const m = JSON.parse(raw);
        if (m.method === 'Debugger.scriptParsed') scripts.set(m.params.scriptId, m.params.url);
        if (m.method !== 'Debugger.paused') return;
        const text = m.params.callFrames.slice(0, 30)
          .map((f) => `  ${f.functionName || '(anonymous)'} ${here(f.location.scriptId)}:${f.location.lineNumber + 1}`).join('\n');
        seen.set(text, (seen.get(text) ?? 0) + 1);
        if (++samples === SAMPLES) { clearTimeout(timer); resolve(); return; }
        send('Debugger.resume');
        setTimeout(() => send('Debugger.pause'), 20);
      });
    });
    return [...seen].map(([text, n]) => `paused here ${n} of ${samples} times:\n${text}`);
  } finally {
    ws.terminate();
    try { process.kill(pid, 'SIGKILL'); } catch { /* gone already */ }
    await sleep(300);
  }
}

for (const pid of process.argv.slice(2).map(Number)) {
  try {
    console.log(`pid ${pid}:\n${(await stacksOf(pid)).join('\n')}`);
  } catch (err) {
    console.log(`pid ${pid}: no stack (${err.message})`);
  }
}
