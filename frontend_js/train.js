// The trainer, mirroring daisy/train.py. One replica's step (Trainer.localStep, then Trainer.apply):
//   local step: (loss, grads) on its batch (seed, step, slot) with its own weights
//   -> collective.exchange(step, roster, slot, loss, grads) -> the slot-ordered reduce G
//   -> Adam with G on its own copy -> weight hash
// Group: P simulated peers in one process (the CLI, tests) over a SimulatedCollective. The page
// runs one Trainer over a MeshCollective (mesh/mesh_collective.js). Honest replicas give equal hashes.
// Every part of the step (GEMM, row pieces, Adam, hash) runs on the one backend given
// (engines.js); the default is the JS mirror itself.
import { initParams, lossAndGrads, paramShapes, checkBackend } from './model.js';
import { adamInit } from './optim.js';
import { referenceBackend } from './engines.js';
import { SimulatedCollective } from './collective.js';
import { reduceLosses } from './reduce.js';
import { StreamBatches } from './batch_source.js';

export const MAX_PEERS = 64;

export const cloneParams = (params) => Object.fromEntries(Object.entries(params).map(([k, v]) => [k, Float64Array.from(v)]));

// one peer's state: weights and Adam moments; in a run of local steps (cfg.local_steps H > 1) also
// the group's weights at the last exchange (`anchor`; null otherwise; daisy/train.py Replica);
// t0: the step its Adam state started at (0; a joiner of a run of local steps starts a fresh one)
export class Replica {
  constructor(params, adam, anchor = null, t0 = 0) { this.params = params; this.adam = adam; this.anchor = anchor; this.t0 = t0; }
  get step() { return this.t0 + this.adam.t; }
}

const cloneOrNull = (x) => (x == null ? null : cloneParams(x));      // (a state read from a peer has no anchor)

// a replica's whole state, copied (weights, Adam m, v, t, the anchor): what a joining device
// receives, what an audit's rollback restores (daisy/train.py copy_replica: the one snapshot rule)
export const cloneReplica = (r) => new Replica(cloneParams(r.params),
  { t: r.adam.t, m: cloneParams(r.adam.m), v: cloneParams(r.adam.v) }, cloneOrNull(r.anchor), r.t0 ?? 0);

// a joiner of a run of local steps, at a round's start (r: any replica there): the group's weights
// (W = A, checked against the group's hash) and a fresh Adam state (m = v = 0, t = 0: nothing
// another device's own moments would have to be trusted for; daisy/train.py local_joiner)
export const localJoiner = (r) => new Replica(cloneParams(r.anchor), adamInit(r.anchor), cloneParams(r.anchor), r.step);

// whether 0-based step s ends with an exchange: every step when H = 1; else the last step of each
// round of H and the run's last step (daisy/train.py is_exchange_step)
export const isExchangeStep = (cfg, s) => cfg.local_steps === 1 || (s + 1) % cfg.local_steps === 0 || s + 1 === cfg.steps;

// a replica entering a run of local steps at an exchange: anchor = its weights
export function withLocalState(r) {
  if (r.anchor == null) r.anchor = cloneParams(r.params);
  return r;
}

// One replica's training step (Python: local_step, apply). batches: a BatchSource (batch_source.js);
// backend: engines.js.
export class Trainer {
  constructor(cfg, replica, batches, backend = referenceBackend) {
    this.cfg = cfg; this.replica = replica; this.batches = batches;
    this.backend = checkBackend(backend, 'Trainer');
  }

  // (loss, grads) of this replica on the batch of (seed, step, slot); arrays from `arena`.
  // sink: optional, {grad(name, values)} told of each gradient as it becomes final (the streamed
  // exchange: MeshCollective.beginStep); the result is the same either way
  async localStep(step, slot, arena, sink = null) {
    const cfg = this.cfg;
    const { x, y } = await this.batches.get(step, slot);
    const onGrad = sink ? (name, values) => sink.grad(name, values) : null;
    return lossAndGrads(this.replica.params, cfg, x, y, cfg.batch, cfg.seq_len, this.backend, arena, onGrad);
  }

  // Adam with the group's G, then the hash -> {step (number after it), hash}
  async apply(G) {
    this.backend.adamStep(this.replica.params, G, this.replica.adam, this.cfg.lr);
    return { step: this.replica.step, hash: await this.backend.weightHashAsync(this.replica.params) };
  }

  // ---- local steps (cfg.local_steps H > 1; docs/VERIFICATION.md "Local steps")
  // an inner step: Adam with this replica's own gradient, no exchange
  localApply(g) { this.backend.adamStep(this.replica.params, g, this.replica.adam, this.cfg.lr); }

  // what this replica sends at an exchange: D_i = anchor - params, per tensor
  delta() {
    const r = this.replica;
    return Object.fromEntries(Object.entries(r.params).map(([k, w]) => {
      const a = r.anchor[k], d = new Float64Array(w.length);
      for (let i = 0; i < w.length; i++) d[i] = a[i] - w[i];
      return [k, d];
    }));
  }

  // the outer step with the group's D: anchor = anchor - D (the replicas' weights averaged); params = anchor
  async outer(D) {
    const r = this.replica;
    for (const k of Object.keys(r.anchor)) {
      const a = r.anchor[k], d = D[k];
      for (let i = 0; i < a.length; i++) a[i] = a[i] - d[i];
      r.params[k].set(a);                   // in place: an engine may hold the weights' arrays
    }
    return { step: r.step, hash: await this.backend.weightHashAsync(r.params) };
  }
}

export function checkLoss(loss, step) {
  if (!Number.isFinite(loss)) {
    throw new RangeError(`loss became ${pyFloatRepr(loss)} at step ${step}: lower the learning rate`);
  }
}

// P replicas training in lockstep on one token stream (Uint16Array) or a BatchSource.
// trainer(cfg, replica, batches, {concurrent: true}): makes each replica's trainer (backends.js
// PickedBackend.trainer: the resident step's, which then leases GPU buffers of its own, as its
// steps overlap the others'); default a Trainer on `backend`
const IN_GROUP = Object.freeze({ concurrent: true });
export class Group {
  constructor(cfg, peers, stream, backend = referenceBackend, replicas = null, trainer = null) {
    this.cfg = cfg; this.backend = checkBackend(backend, 'Group');
    this.batches = stream && typeof stream.get === 'function' ? stream : new StreamBatches(stream, cfg);
    if (replicas === null) {
      const params = initParams(cfg);
      replicas = Array.from({ length: peers }, () => new Replica(cloneParams(params), adamInit(params)));
    }
    if (cfg.local_steps > 1) replicas = replicas.map(withLocalState);
    this.replicas = replicas;
    this.makeTrainer = trainer || ((c, r, b) => new Trainer(c, r, b, backend));
    this.trainers = replicas.map((r) => this.makeTrainer(cfg, r, this.batches, IN_GROUP));
    this.collective = new SimulatedCollective(paramShapes(cfg), { seed: cfg.seed, exchange: cfg.exchange });
    this.arena = this.backend.newArena();   // every array of a step; reused by the next step
  }

  // slots 0..peers-1 from now on: the slots `left` names leave first (the others keep their order
  // and their own state under their new slots), then a new slot gets a copy of replica 0 (local
  // steps: localJoiner); shrinking without `left` drops the highest
  resize(peers, left = []) {
    if (left.length) {
      this.replicas = this.replicas.filter((_, i) => !left.includes(i));
      this.trainers = this.trainers.filter((_, i) => !left.includes(i));
    }
    while (this.replicas.length > peers) { this.replicas.pop(); this.trainers.pop(); }
    while (this.replicas.length < peers) {
      const r = this.cfg.local_steps > 1 ? localJoiner(this.replicas[0]) : cloneReplica(this.replicas[0]);
      this.replicas.push(r);
      this.trainers.push(this.makeTrainer(this.cfg, r, this.batches, IN_GROUP));
    }
  }

  // run one step -> {step (number after it), loss (group loss), hashes [one per peer]}
  async step() {
    const s = this.replicas[0].step;
    const roster = this.trainers.map((_, slot) => slot);
    if (this.cfg.local_steps > 1) return this.localStep(s, roster);
    const reduced = [];
    this.arena.reset();
    try {
      for (let slot = 0; slot < this.trainers.length; slot++) {
        const r = await this.trainers[slot].localStep(s, slot, this.arena);
        reduced.push(this.collective.exchange(s, roster, slot, r.loss, r.grads, r.encoded ?? null));
      }
    } catch (e) {
      this.arena = this.backend.newArena();   // a failed step's arrays are never handed out again
      this.collective = new SimulatedCollective(paramShapes(this.cfg), { seed: this.cfg.seed, exchange: this.cfg.exchange });
      throw e;
    }
    const outs = await Promise.all(reduced);
    const applied = [];
    for (let slot = 0; slot < this.trainers.length; slot++) applied.push(await this.trainers[slot].apply(outs[slot].grads));
    const loss = outs[0].loss;
    checkLoss(loss, s + 1);
    return { step: s + 1, loss, hashes: applied.map((a) => a.hash) };
  }

  // a step of local steps (daisy/train.py Group.local_step): each replica's own Adam step; at an
  // exchange step the deltas go through the collective and every replica takes the outer step.
  // Hashes: each replica's anchor (equal on every replica; its own weights between exchanges are its own)
  async localStep(s, roster) {
    const losses = [];
    for (let slot = 0; slot < this.trainers.length; slot++) {
      this.arena.reset();
      const r = await this.trainers[slot].localStep(s, slot, this.arena);
      losses.push(r.loss);
      this.trainers[slot].localApply(r.grads);
    }
    let loss = reduceLosses(losses), hashes = [];
    if (isExchangeStep(this.cfg, s)) {
      const outs = await Promise.all(this.trainers.map((t, slot) => this.collective.exchange(s, roster, slot, losses[slot], t.delta())));
      for (let slot = 0; slot < this.trainers.length; slot++) hashes.push((await this.trainers[slot].outer(outs[slot].grads)).hash);
      loss = outs[0].loss;
    } else {
      for (const t of this.trainers) hashes.push(await this.backend.weightHashAsync(t.replica.anchor));
    }
    checkLoss(loss, s + 1);
    return { step: s + 1, loss, hashes };
  }
}

// ---- the roster schedule (daisy/train.py parse_roster, check_roster, peers_at, left_at; the same messages)
export class RosterError extends Error {}

// "0:2,10:3" -> [[0, 2], [10, 3]]: from 0-based step index 0 on 2 peers, from 10 on 3; an entry
// may name the slots that leave: "0:3,8:1:0.2" -> [[0, 3], [8, 1, [0, 2]]] (PEERS above the ones
// that stay appends joiners after them)
export function parseRoster(text) {
  const entries = text.split(',');
  const schedule = [];
  entries.forEach((entry, i) => {
    if (!/^[0-9]{1,9}:[0-9]{1,9}(:[0-9]{1,2}(\.[0-9]{1,2}){0,62})?$/.test(entry)) {
      throw new RosterError(`--roster entry '${entry}' is not STEP:PEERS (a 0-based step index and a peer count, e.g. 0:2,10:3) or STEP:PEERS:SLOTS (the slots that leave, e.g. 8:1:0.2)`);
    }
    const fields = entry.split(':');
    const [step, peers] = fields.slice(0, 2).map(Number);
    if (!(peers >= 1 && peers <= MAX_PEERS)) throw new RosterError(`--roster entry '${entry}': peers must be in 1..${MAX_PEERS}`);
    if (schedule.length && step <= schedule[schedule.length - 1][0]) {
      throw new RosterError(`--roster entry '${entry}': steps must be strictly increasing (it follows '${entries[i - 1]}')`);
    }
    if (fields.length === 3) {
      const left = fields[2].split('.').map(Number);
      const before = schedule.length ? schedule[schedule.length - 1][1] : 0;
      if (left.some((x, j) => j > 0 && x <= left[j - 1]) || left[left.length - 1] >= before) {
        throw new RosterError(`--roster entry '${entry}': the slots that leave must be increasing slots of the ${before} peers before it`);
      }
      if (before - left.length > peers) {
        throw new RosterError(`--roster entry '${entry}': ${before - left.length} of the ${before} peers stay, more than ${peers}`);
      }
      schedule.push([step, peers, left]);
    } else schedule.push([step, peers]);
  });
  return schedule;
}

// the schedule covers a run of `steps` steps that starts (or resumes) at step index `start`; with
// local steps H > 1 the roster changes only at a round's start (a multiple of H)
export function checkRoster(schedule, text, start, steps, localSteps = 1) {
  const entries = text.split(',');
  if (schedule[0][0] > start) {
    throw new RosterError(`--roster entry '${entries[0]}': the first entry must be at or before step ${start}, where this run starts`);
  }
  if (schedule[schedule.length - 1][0] >= steps) {
    throw new RosterError(`--roster entry '${entries[entries.length - 1]}' is past the run's last step index ${steps - 1}`);
  }
  schedule.forEach((e, i) => {
    if (localSteps > 1 && e[0] > start && e[0] % localSteps !== 0) {
      throw new RosterError(`--roster entry '${entries[i]}': with --local-steps ${localSteps} the roster changes only at a round's start (a step index that is a multiple of ${localSteps})`);
    }
  });
}

// P of 0-based step index `step`: the last entry at or before it
export const peersAt = (schedule, step) => schedule.filter(([s]) => s <= step).at(-1)[1];

// the slots that leave at 0-based step index `step` (an entry there naming them), else []
export const leftAt = (schedule, step) => schedule.find((e) => e[0] === step && e.length === 3)?.[2] ?? [];

// Python's repr(float): shortest round-trip digits; scientific when the decimal exponent is
// < -4 or >= 16 ('1e-05', '1.5e+16'); integral values keep '.0'; nan, inf, -inf.
export function pyFloatRepr(x) {
  if (x !== x) return 'nan';
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const [mant, expStr] = x.toExponential().split('e');       // shortest digits, d.ddd form
  const e = Number(expStr);
  const neg = mant.startsWith('-');
  const digits = mant.replace('-', '').replace('.', '');
  const sign = neg ? '-' : '';
  if (e < -4 || e >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${m}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
  }
  if (e < 0) return `${sign}0.${'0'.repeat(-e - 1)}${digits}`;
  if (digits.length <= e + 1) return `${sign}${digits}${'0'.repeat(e + 1 - digits.length)}.0`;
  return `${sign}${digits.slice(0, e + 1)}.${digits.slice(e + 1)}`;
}

// json.dumps of a float (NaN and infinities as Python writes them)
export const pyJsonFloat = (x) => (x !== x ? 'NaN' : x === Infinity ? 'Infinity' : x === -Infinity ? '-Infinity' : pyFloatRepr(x));

// the --json line of one step, byte for byte as daisy.train prints it
export function stepJsonLine({ step, loss, hashes }) {
  return `{"step": ${step}, "loss": ${pyJsonFloat(loss)}, "hashes": [${hashes.map((h) => `"${h}"`).join(', ')}]}`;
}
