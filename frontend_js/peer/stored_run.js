// The stored run: the group's run outlives its browsers (docs/ARCHITECTURE.md "The stored run").
//   - the run's CURRENT leader (slot 0 of the roster now) uploads the replica (the state body,
//     state_codec.js) to /api/group-run?run=<runId>&final=0|1 every N steps (?storeEvery=N,
//     default STORE_EVERY) and at the end of the run (final=1), without holding up training: one
//     upload in flight at most, a failure is a note, not a stop. The server keeps one stored run
//     per group and takes a write only from that run's writer with steps that only grow, from
//     another member once the writer left, or for a new run once the stored one is final
//     (docs/PROTOCOL.md "The stored run");
//   - a page alone in its group and idle asks /api/group-run/info (on welcome, or when the last
//     other peer left); a stored state
//     becomes state().storedOffer and the panel's "Resume step N of the group's run R (stored by
//     peer W)", which loads it with the model store's checked loader and starts the run from it.
// The server knows the caller's group from the signaling token of its welcome (X-Daisy-Token):
// nothing here names a group.
//   run/loop.js calls afterStep(run) after each reported step and afterRun(run, {state, error}) at its end.
import { encodeState, decodeState } from '../state_codec.js';
import { errorText } from './model_store.js';

export const STORE_EVERY = 25;
const TOKEN_HEADER = 'X-Daisy-Token';

// ?storeEvery=N: a whole number of steps in 1..100000, else the default
export function storeEvery(params) {
  const n = Number(params.get('storeEvery'));
  return Number.isInteger(n) && n >= 1 && n <= 100_000 ? n : STORE_EVERY;
}

export class StoredRun {
  constructor(peer) {
    this.peer = peer;
    this.every = storeEvery(peer.params);
    this.inFlight = null;      // the snapshot being uploaded
    this.queued = null;        // the end-of-run snapshot waiting for it
    this.stored = null;        // {runId, step} of this page's last stored state
    Object.assign(peer.s, {
      storedOffer: null,       // {step, steps, hash, savedAt, config, runId, writer}: a state the group could resume
      storedStep: null,        // the step of the last state this page stored
    });
    this.alone = false;
    peer.bus.on('signal:welcome', () => { this.alone = false; });   // a new identity asks again
    peer.bus.on('roster', () => this.onRoster());
    // another run or model takes the page's place: the offer would replace it
    for (const event of ['run-started', 'model-loaded']) {
      peer.bus.on(event, () => { if (peer.s.storedOffer) peer.set({ storedOffer: null }); });
    }
  }

  token() { return this.peer.conn && this.peer.conn.token; }

  leads(run) { return run.roster[0] === this.peer.s.peerId; }

  afterStep(run) {
    // while the server is away (an outage, a restart) its answer would be a refusal: skip this one
    // (a run of local steps is stored at its end only: between exchanges the leader's weights are its own)
    if (!this.leads(run) || run.completed % this.every !== 0 || this.inFlight || this.peer.s.signal !== 'connected' || run.cfg.local_steps > 1) return;
    this.upload(this.snapshot(run, false));
  }

  // after a mismatch, a split alarm or a failure the replica is not the group's state: keep the last good one
  afterRun(run, { state, error } = {}) {
    if (!this.leads(run) || state === 'failed' || error === 'replica mismatch' || error === 'split alarm') return;
    if (run.completed <= run.desc.startStep) return;
    const last = this.queued || this.inFlight || this.stored;
    if (last && last.runId === run.desc.runId && last.step === run.completed) return;
    const snap = this.snapshot(run, true);
    if (this.inFlight) this.queued = snap;
    else this.upload(snap);
  }

  // synchronous: the bytes are one step's state even while training goes on. final: the run ended
  snapshot(run, final) {
    const r = run.replica;
    const body = encodeState(run.c.model.paramShapes(run.cfg), {
      config: run.desc.config, step: run.completed, adamT: r.adam.t, params: r.params, m: r.adam.m, v: r.adam.v,
      weightHash: run.hash, extra: run.extra });
    return { runId: run.desc.runId, step: run.completed, final, body };
  }

  async upload(snap) {
    this.inFlight = snap;
    try {
      const token = this.token();
      if (!token) throw new Error('not connected to the server');
      const q = new URLSearchParams({ run: String(snap.runId), final: snap.final ? '1' : '0' });
      const res = await fetch(`/api/group-run?${q}`, { method: 'POST', body: snap.body,
        headers: { 'Content-Type': 'application/octet-stream', [TOKEN_HEADER]: token } });
      if (!res.ok) throw new Error(await errorText(res));
      this.stored = { runId: snap.runId, step: snap.step };
      this.peer.set({ storedStep: snap.step });
    } catch (err) {
      this.peer.note(`The group's run was not stored on the server at step ${snap.step}: ${err.message || err}`);
    } finally {
      this.inFlight = null;
      const next = this.queued;
      this.queued = null;
      if (next) this.upload(next);
    }
  }

  // Alone in the group (on welcome, or once the others left) and idle: is there a run to
  // resume? Asked once each time the page becomes alone, not on every roster change.
  onRoster() {
    const s = this.peer.s;
    const alone = Boolean(s.peerId) && s.role !== 'pending' && !s.rejected &&
      !s.peers.some((p) => p.id !== s.peerId && p.role !== 'pending');
    const ask = alone && !this.alone && !this.peer.runs.busy && !this.peer.models.has();
    this.alone = alone;
    if (ask) this.check().catch((err) => this.peer.note(`Could not ask the server for the group's stored run: ${err.message || err}`));
  }

  async check() {
    const res = await fetch('/api/group-run/info', { headers: { [TOKEN_HEADER]: this.token() } });
    if (!res.ok) throw new Error(await errorText(res));
    const info = await res.json();
    const offer = info.stored && info.step < info.steps
      ? { step: info.step, steps: info.steps, hash: info.weight_hash, savedAt: info.saved_at, config: info.config,
          runId: info.run_id ?? null, writer: typeof info.writer === 'string' ? info.writer.slice(0, 64) : null } : null;
    if (!this.peer.runs.busy && !this.peer.models.has()) this.peer.set({ storedOffer: offer });
    return offer;
  }

  // The panel's "Resume step N of the group's run" (window.daisy.resumeStored()): the stored
  // state, checked by loadState, then Start (which resumes a loaded state). -> start's result
  async resume() {
    try {
      if (!this.peer.s.storedOffer) throw new Error('no stored run of this group to resume');
      if (this.peer.runs.busy) throw new Error('a run is going: stop it first');
      const res = await fetch('/api/group-run', { headers: { [TOKEN_HEADER]: this.token() } });
      if (!res.ok) throw new Error(await errorText(res));
      const c = await this.peer.compute();
      const state = decodeState(await res.arrayBuffer(), { makeConfig: c.config.makeConfig, paramShapes: c.model.paramShapes });
      if (!state.m || !state.v) throw new Error('the stored state has no Adam moments');
      const loaded = await this.peer.models.loadState(state);
      this.peer.set({ storedOffer: null });
      return { ...loaded, ...(await this.peer.start({})) };
    } catch (err) {
      this.peer.set({ error: `Resume refused: ${err.message || err}` });
      throw err;
    }
  }
}
