// The trainer, mirroring daisy/train.py: P simulated peers in one process, each with its own
// replica. Per step s (0-based): every peer i computes (loss_i, g_i) on batch (seed, s, slot i)
// with its own weights; the group reduces G = reduceGradients(g); every peer applies Adam with G
// to its own copy and hashes it. Honest replicas give P equal hashes on every step.
import { getBatch } from './data.js';
import { weightHashAsync } from './hashing.js';
import { initParams, lossAndGrads } from './model.js';
import { adamInit, adamStep } from './optim.js';
import { reduceGradients, reduceLosses } from './reduce.js';
import { cpuEngine } from './units.js';
import { StepArena } from './arena.js';

export const MAX_PEERS = 64;

const cloneParams = (params) => Object.fromEntries(Object.entries(params).map(([k, v]) => [k, Float64Array.from(v)]));

// one peer's state: weights and Adam moments
export class Replica {
  constructor(params, adam) { this.params = params; this.adam = adam; }
  get step() { return this.adam.t; }
}

// P replicas training in lockstep on one token stream (Uint16Array)
export class Group {
  constructor(cfg, peers, stream, engine = cpuEngine, replicas = null) {
    this.cfg = cfg; this.stream = stream; this.engine = engine;
    if (replicas === null) {
      const params = initParams(cfg);
      replicas = Array.from({ length: peers }, () => new Replica(cloneParams(params), adamInit(params)));
    }
    this.replicas = replicas;
    this.arena = new StepArena();      // every array of a step; reused by the next step
  }

  // run one step -> {step (number after it), loss (group loss), hashes [one per peer]}
  async step() {
    const cfg = this.cfg, s = this.replicas[0].step;
    const losses = [], grads = [];
    this.arena.reset();
    try {
      for (let slot = 0; slot < this.replicas.length; slot++) {
        const { x, y } = getBatch(this.stream, cfg.seed, s, slot, cfg.batch, cfg.seq_len);
        const r = await lossAndGrads(this.replicas[slot].params, cfg, x, y, cfg.batch, cfg.seq_len, this.engine, this.arena);
        losses.push(r.loss); grads.push(r.grads);
      }
    } catch (e) {
      this.arena = new StepArena();      // a failed step's arrays are never handed out again
      throw e;
    }
    const G = reduceGradients(grads, this.arena);
    for (const r of this.replicas) adamStep(r.params, G, r.adam, cfg.lr);
    const loss = reduceLosses(losses);
    if (!Number.isFinite(loss)) {
      throw new RangeError(`loss became ${pyFloatRepr(loss)} at step ${s + 1}: lower the learning rate`);
    }
    return { step: s + 1, loss, hashes: await Promise.all(this.replicas.map((r) => weightHashAsync(r.params))) };
  }
}

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
