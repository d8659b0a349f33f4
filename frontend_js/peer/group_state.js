// Restoring the group from one checkpoint (docs/ARCHITECTURE.md "Group restore"): a checkpoint
// loaded on one device while the group is idle goes to every linked admitted peer as one
// GROUP_STATE message (the state body of state_codec.js with the Adam moments); each receiver
// checks it and adopts it exactly as its own load would (ModelStore.loadState), so Start on ANY
// device of the group then resumes the run from the file's step.
//
//   sender (ModelStore.load succeeded, no run)     each linked admitted peer
//   GROUP_STATE {state body, runId 0}        ──►   idle? admitted sender? decodeState (bounded),
//                                                  settings (makeConfig), weight hash recomputed
//                                                  -> loadState; else refused with a note
//
// Nothing comes back: a receiver that refuses keeps its state, and a resumed run sends the
// leader's STATE to every member anyway (run.js), so a refusal can never fork a run.
import { TYPES } from './frames.js';
import { decodeState, maxStateBytes } from '../state_codec.js';

const short = (h) => (h ? h.slice(0, 16) : '(none)');

export class GroupRestore {
  constructor(peer, mesh) {
    this.peer = peer;
    this.mesh = mesh;
    this.maxBytes = null;      // the largest allowed settings' full state, once compute loaded
    peer.loadCompute().then((c) => { if (!c.error) peer.maxStateBytes = this.maxBytes = maxStateBytes(c); });
    mesh.setLimit(TYPES.GROUP_STATE, (h) => this.limit(h));
    mesh.on(TYPES.GROUP_STATE, (from, m) => { this.receive(from, m); });
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
    return this.maxBytes ?? 'GROUP_STATE before this page\'s compute modules loaded';
  }

  // ---- sender -------------------------------------------------------------------------------
  // After a load on this device: the model store's state to every linked admitted peer that is
  // not training. -> the number of peers it went to (errors are notes, never thrown).
  async share() {
    const p = this.peer, s = p.s, models = p.models;
    if (p.runs.busy || !models.resumable || !models.model) return 0;
    const targets = s.peers.filter((q) => q.id !== s.peerId && q.role !== 'pending' && this.mesh.isReady(q.id));
    const busy = targets.filter((q) => /^(training|starting|joining)/.test(q.state || ''));
    const to = targets.filter((q) => !busy.includes(q));
    if (busy.length) p.note(`The checkpoint was not sent to ${busy.map((q) => q.name).join(', ')}: in a run.`);
    if (!to.length) return 0;
    const c = await p.compute();
    const body = new Uint8Array(models.snapshotBody(c, true));
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
      const c = await p.compute();
      const st = decodeState(ownBuffer(m.payload), { makeConfig: c.config.makeConfig, paramShapes: c.model.paramShapes });
      if (!st.m || !st.v) throw new Error('the state has no Adam moments');
      if (!st.weightHash) throw new Error('the state carries no weight hash');
      // loadState checks settings, sizes and the recomputed hash before it changes anything
      const r = await p.models.loadState(st);
      p.note(`Loaded from ${sender.name}'s file: step ${r.step}, hash ${short(r.hash)}…`);
    } catch (err) {
      refuse(err.message || String(err));
    }
  }
}

// a message payload as its own ArrayBuffer (decodeState views it; a copy only when shared)
function ownBuffer(u8) {
  return u8.byteOffset === 0 && u8.byteLength === u8.buffer.byteLength
    ? u8.buffer : u8.buffer.slice(u8.byteOffset, u8.byteOffset + u8.byteLength);
}
