// The stored run: the group's run outlives its browsers (docs/ARCHITECTURE.md "The stored run").
//   - every device of the run vouches over its own signaling seat for its replica every N steps
//     (?storeEvery=N, default STORE_EVERY: the same N on every page of a group) and at the end of
//     the run: `vouch` {run, step, hash, final, roster} (docs/PROTOCOL.md "Client → server");
//   - the run's CURRENT leader (slot 0 of the roster now) uploads the replica (the state body,
//     state_codec.js) to /api/group-run?run=<runId>&final=0|1 at those steps, without holding up
//     training: one upload in flight at most, a failure is a note, not a stop. The server hashes
//     the weights itself and keeps the state only when more than half of the run's roster vouched
//     for that hash at that step; a state vouched by more devices is never replaced by one vouched
//     by fewer, except by the same group carrying on (docs/PROTOCOL.md "The stored run (HTTP)");
//   - a page alone in its group and idle asks /api/group-run/info (on welcome, or when the last
//     other peer left); a stored state
//     becomes state().storedOffer and the panel's "Resume step N of the group's run (run R,
//     vouched by K of N devices)", which loads it with the model store's checked loader and starts the run from it.
// The server knows the caller's group from the signaling token of its welcome (X-Daisy-Token):
// nothing here names a group.
//   run/loop.js calls afterStep(run) after each reported step and afterRun(run, {state, error}) at its end.
import { encodeState, decodeState } from '../state_codec.js';
import { paramShapes } from '../model.js';
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
    this.outvouched = null;    // {runId, size}: the server keeps a state vouched by more than this run's roster of `size`
    Object.assign(peer.s, {
      storedOffer: null,       // {step, steps, hash, savedAt, config, runId, vouchedBy, rosterSize}: a state the group could resume
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
    // a run of local steps is stored (and vouched) at its end only: between exchanges each
    // replica's weights are its own
    if (run.completed % this.every !== 0 || run.cfg.local_steps > 1) return;
    this.vouch(run, false);
    // while the server is away (an outage, a restart) its answer would be a refusal: skip this one
    if (!this.leads(run) || this.inFlight || this.peer.s.signal !== 'connected' || this.outvoted(run)) return;
    this.upload(this.snapshot(run, false));
  }

  // after a mismatch, a split alarm or a failure the replica is not the group's state: keep the last good one
  afterRun(run, { state, error } = {}) {
    if (state === 'failed' || error === 'replica mismatch' || error === 'split alarm') return;
    if (run.completed <= run.desc.startStep) return;
    this.vouch(run, true);
    if (!this.leads(run) || this.outvoted(run)) return;
    const last = this.queued || this.inFlight || this.stored;
    if (last && last.runId === run.desc.runId && last.step === run.completed) return;
    const snap = this.snapshot(run, true);
    if (this.inFlight) this.queued = snap;
    else this.upload(snap);
  }

  // this device's word, over its own seat, that its replica of the run holds run.hash after
  // run.completed steps (the server counts these, never the uploader's claim)
  vouch(run, final) {
    this.peer.conn?.send({ type: 'vouch', run: run.desc.runId, step: run.completed, hash: run.hash, final,
      roster: [...run.roster] });
  }

  // the server refused this run as vouched by fewer devices than the stored one: no more
  // uploads of it until its roster grows (a lone page resuming a group's run is not stored)
  outvoted(run) {
    const o = this.outvouched;
    return Boolean(o) && o.runId === run.desc.runId && run.roster.length <= o.size;
  }

  // synchronous: the bytes are one step's state even while training goes on. final: the run ended
  snapshot(run, final) {
    const r = run.replica;
    const body = encodeState(paramShapes(run.cfg), {
      config: run.desc.config, step: run.completed, adamT: r.adam.t, params: r.params, m: r.adam.m, v: r.adam.v,
      weightHash: run.hash, extra: run.extra });
    return { runId: run.desc.runId, step: run.completed, final, body, size: run.roster.length };
  }

  async upload(snap) {
    this.inFlight = snap;
    try {
      const token = this.token();
      if (!token) throw new Error('not connected to the server');
      const q = new URLSearchParams({ run: String(snap.runId), final: snap.final ? '1' : '0' });
      const res = await fetch(this.peer.serverUrl(`/api/group-run?${q}`), { method: 'POST', body: snap.body,
        headers: { 'Content-Type': 'application/octet-stream', [TOKEN_HEADER]: token } });
      if (res.status === 409) {
        const why = await res.json().catch(() => ({}));
        if (why.refusal === 'outvouched') this.outvouched = { runId: snap.runId, size: snap.size };
        throw new Error(typeof why.error === 'string' ? why.error : 'HTTP 409');
      }
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
    const res = await fetch(this.peer.serverUrl('/api/group-run/info'), { headers: { [TOKEN_HEADER]: this.token() } });
    if (!res.ok) throw new Error(await errorText(res));
    const info = await res.json();
    const offer = info.stored && info.step < info.steps
      ? { step: info.step, steps: info.steps, hash: info.weight_hash, savedAt: info.saved_at, config: info.config,
          runId: info.run_id ?? null, vouchedBy: info.vouched_by ?? null, rosterSize: info.roster_size ?? null } : null;
    if (!this.peer.runs.busy && !this.peer.models.has()) this.peer.set({ storedOffer: offer });
    return offer;
  }

  // The panel's "Resume step N of the group's run" (window.daisy.resumeStored()): the stored
  // state, checked by loadState, then Start (which resumes a loaded state). -> start's result
  async resume() {
    try {
      if (!this.peer.s.storedOffer) throw new Error('no stored run of this group to resume');
      if (this.peer.runs.busy) throw new Error('a run is going: stop it first');
      const res = await fetch(this.peer.serverUrl('/api/group-run'), { headers: { [TOKEN_HEADER]: this.token() } });
      if (!res.ok) throw new Error(await errorText(res));
      const state = decodeState(await res.arrayBuffer());
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
