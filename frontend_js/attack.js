// The audited run and its attacker, mirroring daisy/attack.py (docs/VERIFICATION.md §13):
//   node frontend_js/cli.mjs --peers P --attack "slot=1,from=39,kind=scale:-1000" [--audit-rate R]
// prints the lines of python -m daisy.train with the same flags. The attacking peers are named by
// their slot at the run's start and keep their ids when slots renumber. Kinds: scale:F, nan,
// noise, const, stale, otherbatch, mismatch, liar-auditor, liar-owner, moments and unchained (local
// steps only: attack_rounds.js) (daisy/attack.py says what each sends);
// slot=1+3 makes two colluders, each passing the other's audit. A step: every slot's messages and
// commitment; cheap checks; the seeded audits, each recomputed by its auditor; a failed audit judged
// by recomputation removes the audited peer or its accuser; a removal rolls the group back to the
// state after that peer's last passed audit and recomputes from there without it. A departure
// (leave=STEP) and the run's end (its last step, --stop-after) are barriers: every contribution not
// covered by a passed audit is recomputed first (depart, finish).
import { PURPOSE_ATTACK, draw, key, uniform } from './prng.js';
import { paramShapes } from './model.js';
import { flattenGrads, unflatten } from './collective.js';
import { BLOCK, SCALE_BYTES, CodecError, codecFor } from './exchange_codec.js';
import { reduceLosses } from './reduce.js';
import { Group, Trainer, cloneReplica, stepJsonLine } from './train.js';
import {
  MAX_AUDIT_RATE, Evidence, auditLoad, trustedStep, auditPairs, beacon, cheapCheck, checkReducedShard, contributionDigest, judge, messageBounds,
  messageHashes, referenceNonce, rollbackStep, sha256, slotDigest, slotMessages,
} from './audit.js';
import { Sha256, short, toHex } from './hashing.js';

export const KINDS = ['scale:F', 'nan', 'noise', 'const', 'stale', 'otherbatch', 'mismatch', 'liar-auditor', 'liar-owner',
  'moments', 'unchained'];     // the last two: runs of local steps only (attack_rounds.js)

// ---- the attack setting ---------------------------------------------------------------------------
export class AttackError extends Error {}

export class Attack {
  constructor(peers, start, kind, factor, leave = null) {
    this.peers = peers;     // attacking peer ids (their slots at the run's start)
    this.start = start;     // the first 0-based step index they attack
    this.kind = kind;       // a name of KINDS ('scale' for scale:F)
    this.factor = factor;   // F of scale:F, else 1
    this.leave = leave;     // they leave before this step index, withholding their commitments from `start` on
    Object.freeze(this);
  }
}

// "slot=1,from=39,kind=scale:-1000" -> Attack; AttackError with daisy/attack.py's messages
export function parseAttack(text) {
  const got = new Map();
  for (const part of text.split(',')) {
    const eq = part.indexOf('=');
    const name = eq < 0 ? part : part.slice(0, eq);
    if (eq < 0 || !['slot', 'from', 'kind', 'leave'].includes(name)) {
      throw new AttackError(`--attack part '${part}' is not slot=S[+S...], from=STEP, kind=KIND or leave=STEP`);
    }
    if (got.has(name)) throw new AttackError(`--attack names ${name} twice`);
    got.set(name, part.slice(eq + 1));
  }
  if (!got.has('slot') || !got.has('kind')) throw new AttackError('--attack needs slot=S and kind=KIND (from=STEP is 0 unless given)');
  const slot = got.get('slot');
  if (!/^[0-9]{1,2}(\+[0-9]{1,2})*$/.test(slot)) {
    throw new AttackError(`--attack slot '${slot}' is not a slot or slots joined by + (e.g. 1 or 1+3)`);
  }
  const peers = slot.split('+').map(Number);
  if (new Set(peers).size !== peers.length) throw new AttackError(`--attack slot '${slot}' names a slot twice`);
  const start = got.has('from') ? got.get('from') : '0';
  if (!/^[0-9]{1,9}$/.test(start)) throw new AttackError(`--attack from '${start}' is not a 0-based step index`);
  let kind = got.get('kind'), factor = 1;
  const m = /^scale:(-?[0-9]{1,9}(\.[0-9]{1,9})?)$/.exec(kind);
  if (m) { kind = 'scale'; factor = Number(m[1]); }
  else if (!KINDS.includes(kind) || kind === 'scale:F') throw new AttackError(`--attack kind '${kind}' is not one of ${KINDS.join(', ')}`);
  const leave = got.has('leave') ? got.get('leave') : null;
  if (leave !== null && (!/^[0-9]{1,9}$/.test(leave) || Number(leave) <= Number(start))) {
    throw new AttackError(`--attack leave '${leave}' is not a 0-based step index after from=${start}`);
  }
  return new Attack(Object.freeze(peers), Number(start), kind, factor, leave === null ? null : Number(leave));
}

// "0.1" -> 0.1: the chance that a slot's contribution to a step is audited, 0..1
export function parseAuditRate(text) {
  if (!/^[0-9]{1,2}(\.[0-9]{1,9})?$/.test(text) || !(Number(text) >= 0 && Number(text) <= MAX_AUDIT_RATE)) {
    throw new AttackError(`--audit-rate must be a chance from 0 to 1 (each slot's contribution audited with it at each step), got ${text}`);
  }
  return Number(text);
}

// the attack fits a run of P peers and `steps` steps; at least one peer stays honest
export function checkAttack(attack, P, steps, localSteps = 1) {
  for (const s of attack.peers) if (s >= P) throw new AttackError(`--attack slot ${s} is outside the group of ${P} peers`);
  if (attack.peers.length >= P) throw new AttackError(`--attack names every one of the ${P} peers; at least one must be honest`);
  if (attack.start >= steps) throw new AttackError(`--attack from ${attack.start} is past the run's last step index ${steps - 1}`);
  if (attack.leave !== null && attack.leave >= steps) throw new AttackError(`--attack leave ${attack.leave} is past the run's last step index ${steps - 1}`);
  if ((attack.kind === 'moments' || attack.kind === 'unchained') && localSteps === 1) {
    throw new AttackError(`--attack kind '${attack.kind}' forges a round's Adam state: only with --local-steps above 1`);
  }
  if (attack.leave !== null && localSteps > 1 && attack.leave % localSteps !== 0) {
    throw new AttackError(`--attack leave ${attack.leave}: with --local-steps ${localSteps} a peer leaves at a `
      + `round's start (a multiple of ${localSteps})`);
  }
}

// ---- forged gradients ------------------------------------------------------------------------------
export function maxNorm(flat) {
  let m = 0;
  for (let i = 0; i < flat.length; i++) m = Math.max(m, Math.abs(flat[i]));
  return m;
}

// the next float64 above x (numpy's nextafter(x, inf)) for finite x
function nextUp(x) {
  if (x === 0) return Number.MIN_VALUE;
  const dv = new DataView(new ArrayBuffer(8));
  dv.setFloat64(0, x);
  const bits = dv.getBigUint64(0);
  dv.setBigUint64(0, x > 0 ? bits + 1n : bits - 1n);
  return dv.getFloat64(0);
}

// the forged flat gradient of the kinds that need only the honest one
export function forge(kind, factor, flat, seed, step, slot) {
  const N = flat.length;
  if (kind === 'scale') return flat.map((v) => v * factor);
  if (kind === 'nan') return new Float64Array(N).fill(NaN);
  if (kind === 'noise') {
    const k = key(PURPOSE_ATTACK, seed, step, slot), m = maxNorm(flat);
    return Float64Array.from({ length: N }, (_, i) => (2.0 * uniform(k, i) - 1.0) * m);
  }
  if (kind === 'const') {
    const k = key(PURPOSE_ATTACK, seed), m = maxNorm(flat);
    return Float64Array.from({ length: N }, (_, i) => ((draw(k, i) & 1) ? 1.0 : -1.0) * m);
  }
  if (kind === 'mismatch') {
    const out = Float64Array.from(flat);
    out[0] = nextUp(out[0]);
    return out;
  }
  throw new Error(`forge: ${kind} needs more than the honest gradient`);
}

// A lying owner's REDUCED message: the honest one with every value negated, still well formed
// (f64: each float64's sign bit flipped; int8: each code negated, the block scales kept), so it
// decodes to exactly minus the honest shard. A new array; the message is left as it is.
export function forgeReduced(message, codec) {
  const out = Uint8Array.from(message);
  if (codec.name === 'f64') {
    for (let i = 7; i < out.length; i += 8) out[i] ^= 0x80;
    return out;
  }
  const codes = new Int8Array(out.buffer);
  for (let at = 0; at < out.length; at += SCALE_BYTES + BLOCK) {
    for (let i = at + SCALE_BYTES; i < Math.min(out.length, at + SCALE_BYTES + BLOCK); i++) codes[i] = -codes[i];   // -127..127
  }
  return out;
}

// ---- the audited run -----------------------------------------------------------------------------
// A Group (train.js) trained with commitments, audits and removal; a removal replaces the Group by
// one of the survivors, restored to the rollback's state
export class AuditedRun {
  constructor(cfg, group, attack, rate) {
    this.cfg = cfg; this.group = group; this.attack = attack; this.rate = rate;
    this.shapes = paramShapes(cfg);
    this.codec = codecFor(cfg.exchange);
    this.names = this.shapes.map(([n]) => n);
    this.ids = group.replicas.map((_, slot) => slot);             // peer id of each slot
    this.passes = new Map(this.ids.map((p) => [p, new Map([[null, 0]])]));   // peer -> auditor -> step after its pass
    this.excludedFrom = new Map();                               // convicted peer -> step it is left out from
    this.snapshots = new Map([[0, cloneReplica(group.replicas[0])]]);   // step -> state after it
    this.schedule = new Map();                                   // step index -> P (kept timeline)
    this.previous = new Map();                                   // attacker id -> its last honest flat
    this.assigned = new Map();                                   // step -> its audits' auditor slots (since the
                                                                 // roster's last change: auditLoad)
    this.changed = 0;                                            // the step of the roster's last change
    this.before = new Map();                                     // step -> [state after it, its digests]: what a
                                                                 // departure's or the end's barrier checks
    this.audits = 0;
    this.recomputed = 0;
  }

  attacking(pid, s) {
    const a = this.attack;
    return a !== null && a.peers.includes(pid) && s >= a.start;
  }

  // [loss, flat gradient] of the trainer's replica on the batch (seed, s, slot)
  async honest(trainer, s, slot) {
    const r = await trainer.localStep(s, slot, this.group.arena);
    return [r.loss, flattenGrads(r.grads, this.names)];
  }

  // what the peer in `slot` sends at step index s: [loss, flat]
  async contribute(s, slot) {
    const pid = this.ids[slot], trainer = this.group.trainers[slot];
    const [loss, flat] = await this.honest(trainer, s, slot);
    if (!this.attacking(pid, s) || this.attack.kind === 'liar-auditor' || this.attack.kind === 'liar-owner') return [loss, flat];
    const kind = this.attack.kind, previous = this.previous.has(pid) ? this.previous.get(pid) : flat;
    this.previous.set(pid, flat);
    if (kind === 'stale') return [loss, previous];
    if (kind === 'otherbatch') return [loss, (await this.honest(trainer, s, this.ids.length + slot))[1]];
    return [loss, forge(kind, this.attack.factor, flat, this.cfg.seed, s, slot)];
  }

  // the digest an honest peer recomputes for `slot` at s (the first honest replica's)
  async recompute(s, slot, P) {
    const [loss, flat] = await this.honest(this.group.trainers[this.honestSlot(s)], s, slot);
    return contributionDigest(flat, loss, P, this.cfg.seed, s, slot, this.codec);
  }

  get unit() { return ['gradient from peer', 'gradient']; }     // a slot's audited contribution, in the run's words

  // -> [the digest the auditor reports for the audited slot, null: a gradient's audit has no
  // transcript that could break on its own; attack_rounds.js's rounds have one]
  async audit(s, auditor, audited, committed, P) {
    this.audits++;
    const aPid = this.ids[auditor], dPid = this.ids[audited];
    if (this.attacking(aPid, s)) {
      if (this.attack.kind === 'liar-auditor') {
        const h = new Sha256();
        h.update(Uint8Array.from('a false accusation', (c) => c.charCodeAt(0))); h.update(committed);
        return [h.digest(), null];
      }
      if (this.attacking(dPid, s)) return [committed, null];       // colluders pass each other
    }
    return [await this.recompute(s, audited, P), null];
  }

  // The drawn pairs' audits of the contributions made from `at` (the step; a round's start) and
  // sent at 0-based step index `step` -> the pairs that passed, or null once a peer was removed
  // (the auditor for a false accusation, else the audited: a transcript that breaks, a digest
  // that does not reproduce, a reduced shard that does not). unit: a contribution in the run's words.
  async judgePairs(pairs, at, step, digests, messages, N, P, emit) {
    const [ofPeer, unit] = this.unit, cfg = this.cfg, passed = [];
    for (const [auditor, audited] of pairs) {
      const [got, broken] = await this.audit(at, auditor, audited, digests[audited], P);
      if (broken !== null) {
        this.remove(audited, at, `${ofPeer} ${this.ids[audited]} did not reproduce at step ${step + 1}: removed (${broken}; audited by peer ${this.ids[auditor]})`, emit);
        return null;
      }
      const reported = toHex(got);
      const committed = toHex(digests[audited]);
      if (reported === committed) {
        const reason = this.checkOwner(step, audited, messages, N);
        if (reason !== null) {
          const why = `reduced shard from peer ${this.ids[audited]} did not reproduce at step ${step + 1}: `
            + `removed (${reason}; audited by peer ${this.ids[auditor]})`;
          this.remove(audited, at, why, emit);
          return null;
        }
        passed.push([auditor, audited]);
        continue;
      }
      const ev = new Evidence({ run: String(cfg.seed), step, slot: audited, accuser: auditor, committed, recomputed: reported });
      if (judge(ev, toHex(await this.recompute(at, audited, P))) === 'audited') {
        const why = `${ofPeer} ${this.ids[audited]} did not reproduce at step ${step + 1}: removed `
          + `(committed ${short(ev.committed)}, recomputed ${short(ev.recomputed)} by peer ${this.ids[auditor]})`;
        this.remove(audited, at, why, emit);
        return null;
      }
      const why = `peer ${this.ids[auditor]} accused peer ${this.ids[audited]} at step ${step + 1}, `
        + `whose ${unit} reproduced: peer ${this.ids[auditor]} removed`;
      this.remove(auditor, at, why, emit);
      return null;
    }
    return passed;
  }

  // the leavers withhold their commitments (AUDIT) from attack.start on: the audits of steps from
  // start - 1 on are not drawn (the beacon of a step needs every nonce, revealed with the next step's commitment)
  withheld(s) {
    const a = this.attack;
    return a !== null && a.leave !== null && s >= a.start - 1 && a.peers.some((p) => this.ids.includes(p));
  }

  // A departure is a barrier: before the roster drops a leaver, every contribution of its since its
  // last passed audit (or the roster's last change) is recomputed, earliest first; one that does not
  // reproduce convicts it (an audit's removal and rollback). Else it leaves, the run goes on without it from s.
  async depart(leavers, s, emit) {
    for (const pid of leavers) {
      const slot = this.ids.indexOf(pid);
      const start = Math.max(this.changed, trustedStep(this.passes.get(pid), new Set(this.excludedFrom.keys())));
      for (let u = start; u < s; u++) {
        const [state, digests] = this.before.get(u);
        this.group.arena.reset();
        const [loss, flat] = await this.honest(new Trainer(this.cfg, cloneReplica(state), this.group.batches, this.group.backend), u, slot);
        if (toHex(contributionDigest(flat, loss, this.ids.length, this.cfg.seed, u, slot, this.codec)) !== toHex(digests[slot])) {
          return this.remove(slot, u, `gradient from peer ${pid} did not reproduce at step ${u + 1}: removed (checked when it left)`, emit);
        }
      }
    }
    const state = cloneReplica(this.group.replicas[this.honestSlot(s)]);
    for (const pid of leavers) {
      emit.left(s, pid);
      this.ids.splice(this.ids.indexOf(pid), 1);
      this.passes.delete(pid);
    }
    const g = this.group;
    this.group = new Group(this.cfg, this.ids.length, g.batches, g.backend, this.ids.map(() => cloneReplica(state)));
    this.assigned = new Map(); this.changed = s;
    this.before = new Map();
  }

  // compute step index s = the replicas' step: apply it, or remove a peer and roll back
  async step(emit) {
    const { cfg, group } = this;
    const s = group.replicas[0].step, P = this.ids.length;
    const leaving = this.attack !== null && this.attack.leave !== null;
    const leavers = this.ids.filter((pid) => leaving && this.attack.leave === s && this.attack.peers.includes(pid));
    if (leavers.length) return this.depart(leavers, s, emit);
    this.before.set(s, cloneReplica(group.replicas[this.honestSlot(s)]));
    group.arena.reset();
    const sent = [];
    for (let slot = 0; slot < P; slot++) sent.push(await this.contribute(s, slot));
    const messages = sent.map(([, flat], slot) => this.messages(flat, P, s, slot));
    const digests = sent.map(([loss], slot) => slotDigest(s, slot, loss, messageHashes(messages[slot])));
    const N = sent[0][1].length;
    for (let slot = 0; slot < P; slot++) {
      const reason = cheapCheck(sent[slot][0], messages[slot], N, P, this.codec);
      if (reason !== null) return this.remove(slot, s, `gradient from peer ${this.ids[slot]} ${reason} at step ${s + 1}: removed`, emit);
    }
    const nonces = this.ids.map((_, slot) => referenceNonce(cfg.seed, s, slot));
    this.before.set(s, [this.before.get(s), digests]);
    const floor = Math.min(...this.checkedFrom().values());
    for (const t of [...this.before.keys()]) if (t < floor) this.before.delete(t);
    const pairs = this.withheld(s) ? [] : auditPairs(cfg.seed, s, P, this.rate, beacon(digests, nonces), auditLoad(this.assigned, s, P));
    this.assigned.set(s, pairs.map(([auditor]) => auditor));
    const passed = await this.judgePairs(pairs, s, s, digests, messages, N, P, emit);
    if (passed !== null) await this.apply(s, sent, messages, passed, emit);
  }

  // peer -> the first step of its contributions not covered by a passed audit: after its latest pass
  // by an auditor never convicted, or the roster's last change
  checkedFrom() {
    const excluded = new Set(this.excludedFrom.keys());
    return new Map(this.ids.map((pid) => [pid, Math.max(this.changed, trustedStep(this.passes.get(pid), excluded))]));
  }

  // A run's end (its last step, or a Stop: --stop-after) is a barrier: every contribution since its
  // sender's last passed audit (or the roster's last change) is recomputed, earliest step first,
  // slots in order at a step; the first that does not reproduce convicts its sender (an audit's
  // removal and rollback; the caller computes the steps from there again); audits off (rate 0): none.
  // -> whether it removed a peer
  async finish(end, emit) {
    if (this.rate === 0) return false;                 // audits off: nothing is checked
    const start = this.checkedFrom();
    for (let u = Math.min(...start.values()); u < end; u++) {
      const [state, digests] = this.before.get(u);
      for (let slot = 0; slot < this.ids.length; slot++) {
        const pid = this.ids[slot];
        if (u < start.get(pid)) continue;
        this.group.arena.reset();
        const [loss, flat] = await this.honest(new Trainer(this.cfg, cloneReplica(state), this.group.batches, this.group.backend), u, slot);
        if (toHex(contributionDigest(flat, loss, this.ids.length, this.cfg.seed, u, slot, this.codec)) !== toHex(digests[slot])) {
          this.remove(slot, u, `gradient from peer ${pid} did not reproduce at step ${u + 1}: removed (checked at the run's end)`, emit);
          return true;
        }
      }
    }
    return false;
  }

  // the REDUCED message the owner of shard k sends at s (reduce-scatter): the codec's reduce of the
  // slots' messages of shard k, forged by a lying owner
  reducedMessage(s, k, messages, N) {
    const [lo, hi] = messageBounds(N, this.ids.length, this.codec)[k];
    const decoded = messages.map((ms) => this.codec.decode(ms[k], hi - lo));
    const message = this.codec.reduceMessage(decoded, { seed: this.cfg.seed, step: s, offset: lo });
    return this.attacking(this.ids[k], s) && this.attack.kind === 'liar-owner' ? forgeReduced(message, this.codec) : message;
  }

  // an audit of slot k also audits its reduce, when it owns a shard (reduce-scatter): its transcript
  // (the slots' messages of shard k, each as committed) against the REDUCED it sent. null when it
  // reproduces (or in an all-gather run), else the reason
  checkOwner(s, k, messages, N) {
    if (messages[0].length === 1) return null;
    const [lo, hi] = messageBounds(N, this.ids.length, this.codec)[k];
    const transcript = messages.map((ms) => ms[k]);
    const reduced = this.codec.decode(this.reducedMessage(s, k, messages, N), hi - lo);
    return checkReducedShard(transcript, transcript.map((m) => sha256(m)), reduced, hi - lo, this.codec, this.cfg.seed, s, lo);
  }

  // the slot's messages; a forged gradient the codec refuses to encode (int8: a value that is not
  // finite or too large) is sent as its raw float64 bytes, as a forger would
  messages(flat, P, s, slot) {
    try {
      return slotMessages(flat, P, this.cfg.seed, s, slot, this.codec);
    } catch (e) {
      if (!(e instanceof CodecError)) throw e;
      return messageBounds(flat.length, P, this.codec).map(([lo, hi]) => new Uint8Array(Float64Array.from(flat.subarray(lo, hi)).buffer));
    }
  }

  // G from the checked messages (collective.js codecReduce's rule), Adam on every replica
  async apply(s, sent, messages, passed, emit) {
    const { cfg, group } = this;
    const P = this.ids.length, N = sent[0][1].length;
    const flat = new Float64Array(N);
    const bounds = messageBounds(N, P, this.codec);
    bounds.forEach(([lo, hi], k) => {
      if (bounds.length > 1) { flat.set(this.codec.decode(this.reducedMessage(s, k, messages, N), hi - lo), lo); return; }   // rsag: each shard as its owner sent it
      const decoded = messages.map((ms) => this.codec.decode(ms[k], hi - lo));
      flat.set(this.codec.reduce(decoded, { seed: cfg.seed, step: s, offset: lo }), lo);
    });
    const G = unflatten(flat, this.shapes);
    const hashes = [];
    for (const trainer of group.trainers) hashes.push((await trainer.apply(G)).hash);
    const loss = reduceLosses(sent.map(([l]) => l));
    this.schedule.set(s, P);
    for (const [auditor, audited] of passed) this.passes.get(this.ids[audited]).set(this.ids[auditor], s + 1);
    if (passed.length) this.snapshots.set(s + 1, cloneReplica(group.replicas[this.honestSlot(s)]));
    this.keepSnapshots();
    emit.step(s + 1, loss, hashes);
  }

  honestSlot(s) {
    return this.ids.findIndex((q) => !this.attacking(q, s));
  }

  // keep the states a rollback may need: every step some pass (or join) points at
  keepSnapshots() {
    const needed = new Set();
    for (const by of this.passes.values()) for (const t of by.values()) needed.add(t);
    for (const t of [...this.snapshots.keys()]) if (!needed.has(t)) this.snapshots.delete(t);
  }

  // convict the peer in `slot`: every replica goes back to the state rollbackStep names, the later
  // steps are recomputed without it (and without every peer convicted before)
  remove(slot, s, why, emit) {
    const pid = this.ids[slot];
    const back = rollbackStep(pid, this.passes, this.excludedFrom);
    emit.removed(s + 1, pid, why, back);
    this.excludedFrom.set(pid, back);
    for (const [c, since] of this.excludedFrom) this.excludedFrom.set(c, Math.min(since, back));
    this.ids.splice(slot, 1);
    this.assigned = new Map(); this.changed = back;  // slots renumber: loads count from `back` on
    for (const t of [...this.before.keys()]) if (t >= back) this.before.delete(t);
    for (const by of this.passes.values()) for (const [a, t] of [...by]) if (t > back) by.delete(a);   // passes in the steps undone are void
    const state = this.snapshots.get(back);
    const g = this.group;
    this.group = new Group(this.cfg, this.ids.length, g.batches, g.backend, this.ids.map(() => cloneReplica(state)));
    this.keepSnapshots();
    this.recomputed += s - back;
    for (const t of [...this.schedule.keys()]) if (t >= back) this.schedule.delete(t);
  }

  // the kept timeline's P per step as a --roster schedule ("0:3,38:2")
  roster() {
    const out = [];
    let last = null;
    for (const t of [...this.schedule.keys()].sort((a, b) => a - b)) {
      if (this.schedule.get(t) !== last) { out.push(`${t}:${this.schedule.get(t)}`); last = this.schedule.get(t); }
    }
    return out.join(',');
  }
}

// ---- the CLI's output ------------------------------------------------------------------------------
export class Printer {
  constructor(asJson, out) {
    this.asJson = asJson; this.out = out;
    this.agree = true;            // the last step's replicas all had one hash
  }

  step(step, loss, hashes) {
    this.agree = new Set(hashes).size === 1;
    this.out(this.asJson ? stepJsonLine({ step, loss, hashes })
      : `step ${String(step).padStart(5)}  loss ${loss.toFixed(4)}  hash ${short(hashes[0])}  `
        + `(${hashes.length} peers ${this.agree ? 'agree' : 'DISAGREE'})`);
  }

  // a leaver whose contributions since its last pass all reproduced: gone from `step` on
  left(step, peer) {
    this.out(this.asJson ? `{"event": "left", "step": ${step}, "peer": ${peer}}`
      : `audit: peer ${peer} left before step ${step + 1}; its steps since its last passed audit reproduced`);
  }

  removed(step, peer, why, back) {
    this.out(this.asJson
      ? `{"event": "removed", "step": ${step}, "peer": ${peer}, "why": ${JSON.stringify(why)}, "rollback_to": ${back}}`
      : `audit: ${why}; rolled back to step ${back}`);
  }
}

// cli.mjs --attack/--audit-rate: train to the run's end (or --stop-after); out, err: line writers
// runner: AuditedRun, or with local steps attack_rounds.js's RoundAuditedRun (cli.mjs picks)
export async function runAudited(args, cfg, group, out, err, runner = AuditedRun) {
  const run = new runner(cfg, group, args.attackSpec, args.audit_rate);
  const emit = new Printer(args.json, out);
  const end = args.stop_after === null ? cfg.steps : args.stop_after;
  for (;;) {
    while (run.group.replicas[0].step < end) {
      await run.step(emit);
      if (!emit.agree) { err('error: replicas diverged; stopping (never fork)'); return 3; }
    }
    if (!(await run.finish(end, emit))) break;        // the end's barrier: a removal computes the steps again
  }
  err(`audit: ${run.audits} audits, ${run.recomputed} steps recomputed; the run's roster: ${run.roster()}`);
  return 0;
}
