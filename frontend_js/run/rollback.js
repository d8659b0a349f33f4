// A conviction's rollback (docs/VERIFICATION.md §13; run/audits.js has the overview): the step the
// group goes back to (rollbackFor: rollbackStep over this device's passes), the convictions as
// STATUS and ROSTER name them (departures.js, roster_change.js compare them), and the committed
// rollback itself (takeRollback: the kept state restored, the audits of the steps undone void;
// goBack: the run's step, hash and curve with it).
// Imports: the rules (audit.js rollbackStep). Exports: rollbackFor, convictions, standing,
// convictionsKey, convictedIds, rollbackTo, takeRollback, goBack.
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

// the convictions as STATUS names them: [[id, back, hash at back, step]] sorted by id, step: the
// lie's, for a departure barrier's conviction (each contribution before it reproduced here), else
// null; one whose rollback is not settled yet has back, hash and step null (the leader waits for it)
export function convictions(run) {
  const b = run.book;
  if (!b) return [];
  // a departing peer whose steps this device is still checking (the barrier) is not settled either
  const unsettled = [...new Set([...b.accused.keys(), ...b.departing.keys()])].filter((id) => !b.convicted.has(id));
  return [...[...b.convicted].map(([id, c]) => [id, c.back, c.hash, c.checked ? c.step : null]), ...unsettled.map((id) => [id, null, null, null])]
    .sort((x, y) => (x[0] < y[0] ? -1 : 1));
}

// The convictions that stand when the group goes on from `from` completed steps: a peer that left
// (in `gone`), convicted by a departure's barrier at a step the new roster undoes (0-based step >=
// from), just left; its lie is moot. The barrier checks every step this device completed, and the
// survivors may stand one step apart: the leaver's last message reached some of them only (a
// closing page's last frames may be lost). The one ahead convicts at that step, the one behind
// cannot; the roster resumes at the lower position, so that step is undone everywhere and the
// judgements agree (docs/PROTOCOL.md "Audited gradients"). Only a barrier's: it recomputed every
// contribution of the leaver before the lie (from its last pass) and each reproduced, so nothing
// the group keeps needs the rollback; any other conviction (an audit's, a cheap check's) stands.
// list: convictions()'s (or a STATUS's) entries
export const standing = (list, from, gone) =>
  list.filter((c) => !(Array.isArray(c) && gone.has(c[0]) && Number.isInteger(c[3]) && c[3] >= from));

export const convictionsKey = (list) => JSON.stringify(list || []);

// every peer this device convicted, its rollback settled or not: gone on its own evidence, no quorum needed
export const convictedIds = (run) => (run.book ? [...run.book.convicted.keys(), ...run.book.accused.keys()] : []);
export const rollbackTo = (list) => Math.min(...list.map(([, back]) => back));

// the committed roster of a conviction: restore the kept state after `from` steps (local steps:
// each survivor its own, at a round start); the audits of the steps undone are void (the
// reference's rule: a pass past `back` is forgotten)
export function takeRollback(run, from, convicted) {
  const b = run.book, st = b.states.get(from);
  if (!st) return false;
  const r = run.replica;
  for (const k of Object.keys(r.params)) { r.params[k].set(st.params[k]); r.adam.m[k].set(st.m[k]); r.adam.v[k].set(st.v[k]); }
  r.adam.t = st.t;
  // local steps: a round start (W = A): this device's own state there, the anchor the group's weights
  if (r.anchor != null) for (const k of Object.keys(r.anchor)) r.anchor[k].set(st.params[k]);
  for (const by of b.passes.values()) {
    for (const [a, steps] of [...by]) {
      const kept = steps.filter((x) => x <= from);
      if (kept.length < steps.length) by.delete(a); else by.set(a, kept);
    }
  }
  for (const [id, p] of [...b.passedStates]) if (p.at > from) b.passedStates.delete(id);
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
