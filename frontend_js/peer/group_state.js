// Restoring the group from one checkpoint (docs/ARCHITECTURE.md "Group restore"): a checkpoint
// loaded on one device while the group is idle goes to every linked admitted peer as one
// GROUP_STATE message (the state body of state_codec.js with the Adam moments); each receiver
// checks it (peer_state.js readPeerState). A page that holds no model adopts it at once
// (ModelStore.loadState), so one person can restore a fresh group; a page that holds a model gets
// an offer on its panel ("peer X offers step N, hash …: Load / Ignore") and keeps its own model
// until its user clicks Load: nothing replaces a model without its user's click.
//
//   sender (ModelStore.load succeeded, no run)     each linked admitted peer
//   GROUP_STATE {state body, runId 0}        ──►   idle? admitted sender? readPeerState (bounded,
//                                                  settings, Adam moments, weight hash recomputed)
//                                                  -> no model: loadState; a model: the offer
//
// Nothing comes back: a receiver that refuses keeps its state, and a resumed run sends the
// leader's STATE to every member anyway (run/start.js), so a refusal can never fork a run.
import { TYPES } from '../mesh/frames.js';
import { MAX_STATE_BYTES } from '../state_codec.js';
import { makeConfig } from '../config.js';
import { readPeerState } from '../peer_state.js';
import { short } from '../hashing.js';

export class GroupRestore {
  constructor(peer, mesh) {
    this.peer = peer;
    this.mesh = mesh;
    this.offered = null;       // {from, state}: the latest offer to a page that holds a model (one kept)
    Object.assign(peer.s, { restoreOffer: null });   // {from, name, step, steps, hash}: the panel's Load / Ignore
    mesh.setLimit(TYPES.GROUP_STATE, (h) => this.limit(h));
    mesh.on(TYPES.GROUP_STATE, (from, m) => { this.receive(from, m); });
    // a run or another model takes the page's place: the offer is void
    for (const event of ['run-started', 'model-loaded']) peer.bus.on(event, () => this.decline());
  }

  // What a GROUP_STATE may weigh, decided from its first chunk before anything is allocated:
  // nothing during a run (or one being set up), nothing inside a run's frames, else the largest
  // state any allowed settings make.
  limit(h) {
    if (h.runId !== 0) return `GROUP_STATE inside run ${h.runId}: a restore travels outside runs`;
    if (this.peer.runs.busy) {
      if (h.chunkIndex === 0) this.peer.note('Refused a checkpoint from the group: a run is going on this device.');
      return 'GROUP_STATE while a run is going';
    }
    return MAX_STATE_BYTES;
  }

  // ---- sender -------------------------------------------------------------------------------
  // After a load on this device: the model store's state to every linked admitted peer that is
  // not training (ids: only these; the headless keeper's stopped run to a peer that just linked).
  // -> the number of peers it went to (errors are notes, never thrown).
  async share(ids = null) {
    const p = this.peer, s = p.s, models = p.models;
    if (p.runs.busy || !models.model || !(models.resumable || models.resumePoint())) return 0;   // a load, or a stopped run
    const targets = s.peers.filter((q) => q.id !== s.peerId && q.role !== 'pending' && this.mesh.isReady(q.id)
      && (!ids || ids.includes(q.id)));
    const busy = targets.filter((q) => /^(training|starting|joining)/.test(q.state || ''));
    const to = targets.filter((q) => !busy.includes(q));
    if (busy.length) p.note(`The checkpoint was not sent to ${busy.map((q) => q.name).join(', ')}: in a run.`);
    if (!to.length) return 0;
    const body = new Uint8Array(models.snapshotBody(true));
    const failed = [];
    await Promise.all(to.map((q) => this.mesh.send(q.id, { type: TYPES.GROUP_STATE, payload: body })
      .catch((err) => failed.push(`${q.name} (${err.message || err})`))));
    const sent = to.length - failed.length;
    p.note(`Sent the checkpoint to ${sent} other device(s)` + (failed.length ? `; not to ${failed.join(', ')}.` : '.'));
    return sent;
  }

  // ---- receiver -----------------------------------------------------------------------------
  async receive(from, m) {
    const p = this.peer;
    const refuse = (why) => {
      this.mesh.drop(from, m, why);
      p.note(`Refused a checkpoint from ${p.nameOf(from)}: ${why}.`);
    };
    try {
      const sender = p.s.peers.find((q) => q.id === from);
      if (!sender || sender.role === 'pending') { refuse('not an admitted member of this group'); return; }
      if (p.runs.busy) { refuse('a run is going on this device'); return; }
      const { state, hash } = readPeerState(m.payload, { needWeightHash: true });
      if (!p.models.has()) {
        // loadState checks settings and sizes before it changes anything; readPeerState hashed the weights
        const r = await p.models.loadState(state, hash);
        p.note(`Loaded from ${sender.name}'s file: step ${r.step}, hash ${short(r.hash)}…`);
        return;
      }
      const cfg = makeConfig(state.config);
      this.offered = { from, state, hash };
      p.set({ restoreOffer: { from, name: sender.name, step: state.step, steps: cfg.steps, hash } });
      p.note(`${sender.name} offers its checkpoint (step ${state.step}, hash ${short(hash)}…): Load or Ignore; this device keeps its own model until then.`);
    } catch (err) {
      refuse(err.message || String(err));
    }
  }

  // the panel's Load (window.daisy.acceptRestore()): the offered state replaces this page's model
  async accept() {
    const offer = this.offered;
    if (!offer) throw new Error('no checkpoint is offered');
    this.decline();
    const r = await this.peer.models.loadState(offer.state, offer.hash);
    this.peer.note(`Loaded the checkpoint ${this.peer.nameOf(offer.from)} offered: step ${r.step}, hash ${short(r.hash)}…`);
    return r;
  }

  // the panel's Ignore (window.daisy.declineRestore()): the model stays as it is
  decline() {
    this.offered = null;
    if (this.peer.s.restoreOffer) this.peer.set({ restoreOffer: null });
  }
}
