// The audited run of local steps, mirroring daisy/attack_rounds.py (docs/VERIFICATION.md §13
// "Rounds of local steps"): node frontend_js/cli.mjs --local-steps H --attack SPEC [--audit-rate R]
// prints the lines of python -m daisy.train with the same flags. The audited unit is a slot's
// round: its H inner steps from the anchor and its own Adam state, and the delta it sends at the
// round's exchange (step e). A slot commits, with its messages, to the hash of its Adam state at the
// round's end (roundDigest, adamStateHash); an auditor takes the slot's state at the round's start
// (its transcript), checks it against the slot's commitment before (checkStartState), recomputes
// the H steps and compares digests. Beacon, nonces, pairs and codec are keyed on e; the loads of
// auditPairs count rounds. Kinds: attack.js's applied to the delta, `moments` (honest deltas, its
// Adam m negated at each round's end, committed to as it is) and `unchained` (honest deltas and
// commitments; each next round starts from its m negated, not the state it committed to). A removal rolls back to the round
// start after the convicted peer's last passed audit; each survivor restores its own state there
// and keeps its order (the kept run: --local-steps H --roster R naming the slots that left).
import { flattenGrads, unflatten } from './collective.js';
import { reduceLosses } from './reduce.js';
import { Group, Trainer, cloneReplica } from './train.js';
import {
  adamStateHash, auditLoad, auditPairs, beacon, checkStartState, cheapCheck, messageBounds,
  messageHashes, referenceNonce, rollbackStep, roundDigest, roundEnd, trustedStep,
} from './audit.js';
import { AuditedRun, forge } from './attack.js';
import { Sha256, toHex } from './hashing.js';

// the forgers' Adam state: m negated in place
function negateM(replica) {
  for (const k of Object.keys(replica.adam.m)) replica.adam.m[k] = replica.adam.m[k].map((x) => -x);
}

export class RoundAuditedRun extends AuditedRun {
  get unit() { return ['round of peer', 'round']; }

  constructor(cfg, group, attack, rate) {
    super(cfg, group, attack, rate);
    this.snapshots = new Map([[0, new Map(this.ids.map((pid, slot) => [pid, cloneReplica(group.replicas[slot])]))]]);
    this.schedule = new Map();                                   // round start -> its peers (ids), kept timeline
    this.committed = new Map(this.ids.map((pid, slot) => [pid, adamStateHash(group.replicas[slot].adam)]));
    this.unchain = new Set();                                    // peers that go on from a state they did not commit to
  }

  endOf(s) { return roundEnd(s, this.cfg.local_steps, this.cfg.steps); }

  // the round of `replica` (advanced in place) on the batches (seed, s, slot), s = r0..e
  // -> [[loss of each step], flat delta]
  async honestRound(replica, r0, e, slot) {
    const t = new Trainer(this.cfg, replica, this.group.batches, this.group.backend), losses = [];
    for (let s = r0; s <= e; s++) {
      this.group.arena.reset();
      const r = await t.localStep(s, slot, this.group.arena);
      t.localApply(r.grads);
      losses.push(r.loss);
    }
    return [losses, flattenGrads(t.delta(), this.names)];
  }

  // what the peer in `slot` sends at the round's exchange: [[losses], flat delta]; its replica holds
  // its state at the round's end (forged moments for `moments`)
  async contribute(r0, e, slot) {
    const pid = this.ids[slot], replica = this.group.replicas[slot];
    const start = cloneReplica(replica);
    const [losses, flat] = await this.honestRound(replica, r0, e, slot);
    if (!this.attacking(pid, e) || this.attack.kind === 'liar-auditor' || this.attack.kind === 'liar-owner') return [losses, flat];
    const kind = this.attack.kind, previous = this.previous.has(pid) ? this.previous.get(pid) : flat;
    this.previous.set(pid, flat);
    if (kind === 'moments') {
      negateM(replica);
      return [losses, flat];
    }
    if (kind === 'unchained') {          // committed to the honest state, then goes on from another
      this.unchain.add(pid);
      return [losses, flat];
    }
    if (kind === 'stale') return [losses, previous];
    if (kind === 'otherbatch') return [losses, (await this.honestRound(start, r0, e, this.ids.length + slot))[1]];
    return [losses, forge(kind, this.attack.factor, flat, this.cfg.seed, e, slot)];
  }

  // the digest an honest peer recomputes for `slot`'s round from round start u: from the slot's own
  // state there (its transcript; what it committed to at its round before), or from `replica`
  // (advanced to the round's end in place)
  async recompute(u, slot, P, replica = null) {
    replica ??= cloneReplica(this.before.get(u)[0][slot]);
    const e = this.endOf(u);
    const [losses, flat] = await this.honestRound(replica, u, e, slot);
    return roundDigest(e, slot, losses[losses.length - 1], messageHashes(this.messages(flat, P, e, slot)), adamStateHash(replica.adam));
  }

  // the slot's transcript (its state at round start u, as it holds it) against what it committed to
  // at its round before: null, or the reason (evidence by itself)
  brokenChain(u, slot) {
    const [starts, , chain] = this.before.get(u);
    return checkStartState(starts[slot].adam, chain[slot]);
  }

  // -> [the digest the auditor reports for the audited slot, or null with the reason its transcript breaks the chain]
  async audit(u, auditor, audited, committed, P) {
    this.audits++;
    const aPid = this.ids[auditor], dPid = this.ids[audited];
    const e = this.endOf(u);
    if (this.attacking(aPid, e)) {
      if (this.attack.kind === 'liar-auditor') {
        const h = new Sha256();
        h.update(Uint8Array.from('a false accusation', (c) => c.charCodeAt(0))); h.update(committed);
        return [h.digest(), null];
      }
      if (this.attacking(dPid, e)) return [committed, null];       // colluders pass each other
    }
    const reason = this.brokenChain(u, audited);
    if (reason !== null) return [null, reason];
    return [await this.recompute(u, audited, P), null];
  }

  // compute the round from r0 = the replicas' step: apply it, or remove a peer and roll back
  async step(emit) {
    const { cfg } = this;
    const r0 = this.group.replicas[0].step, P = this.ids.length;
    const e = this.endOf(r0);
    const leaving = this.attack !== null && this.attack.leave !== null;
    const leavers = this.ids.filter((pid) => leaving && this.attack.leave === r0 && this.attack.peers.includes(pid));
    if (leavers.length) return this.depart(leavers, r0, emit);
    const committed = this.group.replicas.map(cloneReplica);     // the states of this.committed
    this.ids.forEach((pid, slot) => { if (this.unchain.has(pid)) negateM(this.group.replicas[slot]); });   // (the kind unchained)
    this.unchain = new Set();
    const starts = this.group.replicas.map(cloneReplica);
    this.before.set(r0, starts);
    const sent = [];
    for (let slot = 0; slot < P; slot++) sent.push(await this.contribute(r0, e, slot));
    const messages = sent.map(([, flat], slot) => this.messages(flat, P, e, slot));
    const states = this.group.replicas.map((r) => adamStateHash(r.adam));
    const digests = sent.map(([losses], slot) => roundDigest(e, slot, losses[losses.length - 1], messageHashes(messages[slot]), states[slot]));
    const N = sent[0][1].length;
    for (let slot = 0; slot < P; slot++) {
      const losses = sent[slot][0];
      const reason = cheapCheck(losses[losses.length - 1], messages[slot], N, P, this.codec);
      if (reason !== null) return this.remove(slot, r0, `delta from peer ${this.ids[slot]} ${reason} at step ${e + 1}: removed`, emit);
    }
    const nonces = this.ids.map((_, slot) => referenceNonce(cfg.seed, e, slot));
    this.before.set(r0, [starts, digests, this.ids.map((pid) => this.committed.get(pid)), committed]);
    const floor = Math.min(...this.checkedFrom().values());
    for (const t of [...this.before.keys()]) if (t < floor) this.before.delete(t);
    const k = Math.floor(r0 / cfg.local_steps);                // the loads count rounds
    const pairs = this.withheld(e) ? [] : auditPairs(cfg.seed, e, P, this.rate, beacon(digests, nonces), auditLoad(this.assigned, k, P));
    this.assigned.set(k, pairs.map(([auditor]) => auditor));
    const passed = await this.judgePairs(pairs, r0, e, digests, messages, N, P, emit);
    if (passed !== null) await this.apply(r0, e, sent, messages, states, passed, emit);
  }

  // the leavers withhold their commitments from the round holding attack.start on: that round's
  // audits and its round before's are not drawn (a beacon needs every nonce, revealed with the next round's commitment)
  withheld(e) {
    const a = this.attack;
    if (a === null || a.leave === null || !a.peers.some((p) => this.ids.includes(p))) return false;
    return e >= a.start || (e + 1 < this.cfg.steps && this.endOf(e + 1) >= a.start);
  }

  // a barrier: every round from slotsFrom.get(slot) (a round start) to `end` is recomputed, earliest
  // first, slots in order; the first that does not reproduce convicts its sender. Forward, as a page
  // can: from the state the slot committed to at slotsFrom.get(slot), each round from the end state of
  // the one before (the chain is the commitments, never the slot's own states) -> whether it removed a peer
  async recheck(slotsFrom, end, where, emit) {
    const running = new Map();                                   // slot -> its Adam state, recomputed forward
    for (const u of [...this.before.keys()].filter((t) => t < end).sort((a, b) => a - b)) {
      const digests = this.before.get(u)[1];
      for (let slot = 0; slot < this.ids.length; slot++) {
        if (!slotsFrom.has(slot) || u < slotsFrom.get(slot)) continue;
        const replica = cloneReplica(this.before.get(u)[3][slot]);    // W = A there: the group's weights
        if (running.has(slot)) replica.adam = running.get(slot);
        if (toHex(await this.recompute(u, slot, this.ids.length, replica)) !== toHex(digests[slot])) {
          const why = `round of peer ${this.ids[slot]} did not reproduce at step ${this.endOf(u) + 1}: removed (checked ${where})`;
          this.remove(slot, u, why, emit);
          return true;
        }
        running.set(slot, replica.adam);
      }
    }
    return false;
  }

  // a departure (at a round start) is a barrier; then the leavers go and each survivor keeps its own
  // state under its new slot
  async depart(leavers, r0, emit) {
    const excluded = new Set(this.excludedFrom.keys());
    const check = new Map(leavers.map((pid) => [this.ids.indexOf(pid), Math.max(this.changed, trustedStep(this.passes.get(pid), excluded))]));
    if (await this.recheck(check, r0, 'when it left', emit)) return;
    for (const pid of leavers) {
      emit.left(r0, pid);
      this.passes.delete(pid);
    }
    const keep = this.ids.map((pid, slot) => [pid, slot]).filter(([pid]) => !leavers.includes(pid));
    this.regroup(keep.map(([pid]) => pid), keep.map(([, slot]) => this.group.replicas[slot]));
    this.changed = r0;
    this.before = new Map();
  }

  async finish(end, emit) {
    if (this.rate === 0) return false;
    const start = this.checkedFrom();
    return this.recheck(new Map(this.ids.map((pid, slot) => [slot, start.get(pid)])), end, "at the run's end", emit);
  }

  // the group from now on: these peers, each with its own state (copied), in this order
  regroup(ids, replicas) {
    this.ids = [...ids];
    const g = this.group;
    this.group = new Group(this.cfg, ids.length, g.batches, g.backend, replicas.map(cloneReplica));
    this.committed = new Map(ids.map((pid, i) => [pid, adamStateHash(replicas[i].adam)]));
    this.assigned = new Map();
    this.unchain = new Set();                                    // (restored states are the committed ones)
  }

  // D from the checked messages (the codec's slot-ordered mean, as AuditedRun.apply does with G), the
  // outer step on every replica; the round's lines
  async apply(r0, e, sent, messages, states, passed, emit) {
    const P = this.ids.length, N = sent[0][1].length;
    const D = unflatten(this.reduce(e, messages, N), this.shapes);
    const before = await this.group.backend.weightHashAsync(this.group.replicas[0].anchor);
    const hashes = [];
    for (const t of this.group.trainers) hashes.push((await t.outer(D)).hash);
    for (let s = r0; s <= e; s++) {
      this.schedule.set(s, [...this.ids]);
      const loss = reduceLosses(sent.map(([losses]) => losses[s - r0]));
      emit.step(s + 1, loss, s === e ? hashes : this.ids.map(() => before));
    }
    this.committed = new Map(this.ids.map((pid, slot) => [pid, states[slot]]));
    for (const [auditor, audited] of passed) this.passes.get(this.ids[audited]).set(this.ids[auditor], e + 1);
    if (passed.length) this.snapshots.set(e + 1, new Map(this.ids.map((pid, slot) => [pid, cloneReplica(this.group.replicas[slot])])));
    this.keepSnapshots();
  }

  reduce(e, messages, N) {
    const P = this.ids.length, flat = new Float64Array(N);
    const bounds = messageBounds(N, P, this.codec);
    bounds.forEach(([lo, hi], k) => {
      if (bounds.length > 1) { flat.set(this.codec.decode(this.reducedMessage(e, k, messages, N), hi - lo), lo); return; }   // rsag: each shard as its owner sent it
      const decoded = messages.map((ms) => this.codec.decode(ms[k], hi - lo));
      flat.set(this.codec.reduce(decoded, { seed: this.cfg.seed, step: e, offset: lo }), lo);
    });
    return flat;
  }

  // convict the peer in `slot` (caught in the round from r0): every survivor goes back to its own
  // state at the round start rollbackStep names, in its order there
  remove(slot, r0, why, emit) {
    const pid = this.ids[slot];
    const back = rollbackStep(pid, this.passes, this.excludedFrom);
    emit.removed(this.endOf(r0) + 1, pid, why, back);
    this.excludedFrom.set(pid, back);
    for (const [c, since] of this.excludedFrom) this.excludedFrom.set(c, Math.min(since, back));
    const snap = this.snapshots.get(back);
    const ids = [...snap.keys()].filter((p) => this.ids.includes(p) && p !== pid);   // a leaver stays gone
    this.regroup(ids, ids.map((p) => snap.get(p)));
    this.changed = back;
    for (const t of [...this.before.keys()]) if (t >= back) this.before.delete(t);
    for (const by of this.passes.values()) for (const [a, t] of [...by]) if (t > back) by.delete(a);   // passes in the rounds undone are void
    this.keepSnapshots();
    this.recomputed += r0 - back;
    for (const t of [...this.schedule.keys()]) if (t >= back) this.schedule.delete(t);
  }

  // the kept timeline as a --roster schedule naming the slots that left ("0:3,8:2:1")
  roster() {
    const out = [];
    let last = null;
    for (const t of [...this.schedule.keys()].sort((a, b) => a - b)) {
      const ids = this.schedule.get(t);
      if (last === null) out.push(`${t}:${ids.length}`);
      else if (ids.join('.') !== last.join('.')) {
        out.push(`${t}:${ids.length}:${last.map((p, i) => (ids.includes(p) ? null : i)).filter((i) => i !== null).join('.')}`);
      }
      last = ids;
    }
    return out.join(',');
  }
}
