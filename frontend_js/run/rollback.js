// A conviction's rollback (docs/VERIFICATION.md §13; run/audits.js has the overview): the step the
// group goes back to (rollbackFor: rollbackStep over this device's passes), the convictions as
// STATUS and ROSTER name them (departures.js, roster_change.js compare them), and the committed
// rollback itself (takeRollback: the kept state restored, the audits of the steps undone void;
// goBack: the run's step, hash and curve with it).
// Imports: the rules (audit.js rollbackStep). Exports: rollbackFor, convictions, convictionsKey,
// convictedIds, rollbackTo, takeRollback, goBack.
import { rollbackStep } from '../audit.js';

// rollbackStep over this device's passes as the reference keeps them at the conviction: only the
// audits of steps before t count (later ones were recorded here before the evidence came)
export function rollbackFor(run, id, t) {
  const b = run.book;
  const passes = new Map();
  for (const [peer, by] of b.passes) {
    const latest = new Map([[null, b.floor]]);
    for (const [auditor, steps] of by) {
      const valid = steps.filter((x) => x <= (peer === id ? t : Infinity));
      if (valid.length) latest.set(auditor, valid[valid.length - 1]);
    }
    passes.set(peer, latest);
  }
  if (!passes.has(id)) passes.set(id, new Map([[null, b.floor]]));
  const excluded = new Map([...b.excludedFrom].filter(([c]) => passes.has(c)));
  return Math.max(b.floor, rollbackStep(id, passes, excluded));
}

// the convictions as STATUS and ROSTER name them: [[id, back, hash at back]] sorted by id; one
// whose rollback is not settled yet has back and hash null (the acting leader waits for it)
export function convictions(run) {
  const b = run.book;
  if (!b) return [];
  // a departing peer whose steps this device is still checking (the barrier) is not settled either
  const unsettled = [...new Set([...b.accused.keys(), ...b.departing.keys()])].filter((id) => !b.convicted.has(id));
  return [...[...b.convicted].map(([id, c]) => [id, c.back, c.hash]), ...unsettled.map((id) => [id, null, null])]
    .sort((x, y) => (x[0] < y[0] ? -1 : 1));
}

export const convictionsKey = (list) => JSON.stringify(list || []);

// every peer this device convicted, its rollback settled or not: gone on its own evidence, no quorum needed
export const convictedIds = (run) => (run.book ? [...run.book.convicted.keys(), ...run.book.accused.keys()] : []);
export const rollbackTo = (list) => Math.min(...list.map(([, back]) => back));

// the committed roster of a conviction: restore the kept state after `from` steps; the audits of
// the steps undone are void (the reference's rule: a pass past `back` is forgotten)
export function takeRollback(run, from, convicted) {
  const b = run.book, st = b.states.get(from);
  if (!st) return false;
  const r = run.replica;
  for (const k of Object.keys(r.params)) { r.params[k].set(st.params[k]); r.adam.m[k].set(st.m[k]); r.adam.v[k].set(st.v[k]); }
  r.adam.t = st.t;
  for (const by of b.passes.values()) {
    for (const [a, steps] of [...by]) {
      const kept = steps.filter((x) => x <= from);
      if (kept.length < steps.length) by.delete(a); else by.set(a, kept);
    }
  }
  for (const id of convicted) b.excludedFrom.set(id, from);
  for (const [c, since] of b.excludedFrom) b.excludedFrom.set(c, Math.min(since, from));
  b.convicted.clear(); b.accused.clear(); b.queued = []; b.pending.clear(); b.assigned.clear(); b.departing.clear();
  b.since = from;
  clearTimeout(b.skipTimer); b.skipTimer = null;
  for (const t of [...b.states.keys()]) if (t > from) b.states.delete(t);
  for (const map of [b.nonces, b.received, b.beacons, b.pairs, b.digests, b.shardHashes]) for (const t of [...map.keys()]) if (t >= from) map.delete(t);
  b.done = Math.min(b.done, from - 1);
  for (const t of [...b.undrawn]) if (t >= from) b.undrawn.delete(t);
  b.evidence = [];
  b.reproduced.clear();
  return st.hash;
}

// a conviction's rollback: every replica restores its kept state after `from` steps (also the state
// an unchecked end keeps: kept_check.js)
export function goBack(ctl, run, from, convicted) {
  const hash = takeRollback(run, from, convicted);
  if (!hash) return false;
  run.completed = from; run.hash = hash;
  for (const t of [...run.hashLog.keys()]) if (t > from) run.hashLog.delete(t);
  run.hashLog.set(from, hash);
  run.lastSent = Math.min(run.lastSent, from - 1);
  run.undo = null;
  run.curve = run.curve.filter(([st]) => st <= from);
  ctl.host.models.step = from;
  ctl.host.show({ step: from, hash, curve: run.curve });
  ctl.host.emit('step-undone', { step: from, hash });
  return true;
}
