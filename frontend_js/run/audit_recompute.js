// Recomputing a slot's contribution to a past step from this device's kept state (run/audits.js
// has the overview): the digest an audit compares, or the message and loss a barrier compares.
// An audit this device owes runs through a gated backend, a unit at a time while the gate is
// open (audit_schedule.js opens it); a judge's check runs at once. Either way the compute
// backend has one user at a time (exclusive: the loop's own steps too).
// Imports: audit_book.js (the kept states), the numeric core. Exports: recompute, exclusive,
// AuditVoid (an owed audit voided at the gate), admit.
import { Replica, Trainer, cloneParams } from '../train.js';
import { flattenGrads } from '../collective.js';
import { StepArena } from '../arena.js';
import { waitUntil } from '../page_clock.js';
import { slotMessages, contributionDigest, adamStateHash, messageHashes, roundDigest } from '../audit.js';
import { toHex } from '../hashing.js';
import { qmatmulT } from '../units.js';
import { sha256Hex, GATE_LOOK_MS, roundStart } from './audit_book.js';

// one user of the compute backend at a time: the loop's steps and the audits' recomputations
export function exclusive(run, fn) {
  const p = run.computing.then(fn);
  run.computing = p.catch(() => {});
  return p;
}

// the gate a gated recomputation passes before each unit: open (audit_schedule.js), or the loop is parked or
// finishing. Between two gates the recomputation holds the compute backend (exclusive: the row
// kernels and the units of two steps never interleave on a shared thread pool); at a gate it
// lets go, so the loop's step waits at most for one unit and its glue. An audit voided meanwhile
// (rolled back, restarted, ended) stops at the gate.
export class AuditVoid extends Error {}
async function admit(ctl, run, b, item) {
  item.release?.();
  item.release = null;
  const gone = () => run.ended || run.book !== b || run.epoch !== item.epoch;
  // while this device judges (evidence, a departure's barrier, a conviction's earlier audits) that
  // goes first: the acting leader waits for every survivor's judgement, not for owed audits
  const judging = () => b.accused.size > 0 || b.departing.size > 0 || b.checking !== null;
  const open = () => gone() || (!judging() && (b.gateOpen || run.recovery || run.finishing || run.stopAfter !== null));
  // (woken by a poke; looked at again now and then: a gate opened by a state change that pokes nobody)
  while (!open()) await waitUntil(open, GATE_LOOK_MS, (wake) => ctl.onPoke(wake));
  if (gone()) throw new AuditVoid('the audit is void');
  item.release = await hold(run);
}

// the compute backend, held until the returned release is called
function hold(run) {
  let release;
  const held = new Promise((r) => { release = r; });
  const turn = run.computing;
  run.computing = turn.then(() => held);
  return turn.then(() => release);
}

// the backend of a recomputation: the same kernels, each unit through the gate and counted
function gatedBackend(ctl, run, b, backend, item) {
  // units issued together (model.js both()) pass the gate together: the first waits, the others
  // wait for the same admission, and the next unit after all of them waits at the gate again
  const unit = async (...args) => {
    if (!item.admitting) item.admitting = admit(ctl, run, b, item);
    await item.admitting;
    item.inflight++;
    b.units.done++; b.units.sinceShare++; item.done++;
    ctl.poke();
    try {
      return await qmatmulT(backend.engine, ...args);
    } finally {
      if (--item.inflight === 0) item.admitting = null;
    }
  };
  // the backend and its engine are frozen: a view of each with the one member replaced
  const engine = Object.create(backend.engine, { qmatmulT: { value: unit } });
  return Object.create(backend, { engine: { value: engine } });
}

// the digest of `slot`'s contribution to step t, recomputed from this device's kept state after t
// steps (null: that state is no longer kept); batch: its batch's promise, if fetched already.
// item: an audit this device owes (its units pass the gate); else a judge's check, at once.
// Local steps (docs/VERIFICATION.md §13 "Rounds of local steps"): t is a round's exchange step and
// `adam` the slot's Adam state at the round's start (checked against its commitment by the
// caller); from the kept state there (W = A) the round's inner steps are recomputed and the digest
// covers the delta's messages and the state hash at the round's end
export async function recompute(ctl, run, t, slot, batch = null, item = null, sent = false, adam = null) {
  const b = run.book, r0 = roundStart(run.cfg, t), st = b.states.get(r0);
  if (!st) { ctl.host.note(`Cannot check step ${t + 1}: its state is no longer kept here.`); return null; }
  const rounds = b.span > 1;
  // (a round's inner steps change the weights and moments: copies; a step reads the kept state only)
  const replica = rounds ? new Replica(cloneParams(st.params), { t: adam.t, m: cloneParams(adam.m), v: cloneParams(adam.v) }, cloneParams(st.params))
    : new Replica(st.params, { t: st.t, m: st.m, v: st.v });
  const one = { get: (step, sl) => (batch && step === t && sl === slot ? batch : run.batches.one(step, sl)) };
  const backend = item ? gatedBackend(ctl, run, b, run.trainer.backend, item) : run.trainer.backend;
  const trainer = new Trainer(run.cfg, replica, one, backend);
  const arena = item ? (b.arena ||= ctl.host.backend()?.newArena() ?? new StepArena())
    : (b.judgeArena ||= ctl.host.backend()?.newArena() ?? new StepArena());
  b.reading.add(st);
  const step = async () => {
    if (item) await admit(ctl, run, b, item);          // the gate and the backend, before any kernel
    const gpu = ctl.host.gpu;
    const before = item?.done;
    let r;
    for (let s = r0; s <= t; s++) {
      arena.reset();
      r = gpu ? await gpu.withGpuFallback(run.trainer.backend.engine, () => trainer.localStep(s, slot, arena))
        : await trainer.localStep(s, slot, arena);
      if (rounds) trainer.localApply(r.grads);
    }
    if (item && item.done - before > 0) b.units.perStep = (item.done - before) / (t - r0 + 1);     // a step's units, counted
    const flat = flattenGrads(rounds ? trainer.delta() : r.grads, run.collective.names);
    if (sent) {                    // the message this device received from `slot`, and its loss
      const messages = slotMessages(flat, run.roster.length, run.cfg.seed, t, slot, run.collective.codec);
      return { hash: sha256Hex(messages[messages.length === 1 ? 0 : run.slot]), loss: r.loss, ...(rounds ? { adam: replica.adam } : {}) };
    }
    if (rounds) {
      if (item) item.end = replica.adam;
      const hashes = messageHashes(slotMessages(flat, run.roster.length, run.cfg.seed, t, slot, run.collective.codec));
      return toHex(roundDigest(t, slot, r.loss, hashes, adamStateHash(replica.adam)));
    }
    return toHex(contributionDigest(flat, r.loss, run.roster.length, run.cfg.seed, t, slot, run.collective.codec));
  };
  return (item ? step() : exclusive(run, step)).finally(() => {
    b.reading.delete(st);
    if (item) { item.release?.(); item.release = null; }
  });
}
