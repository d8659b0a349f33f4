// The audit book of a page run (run/audits.js has the overview; record.js the AuditBook record):
// one per run from its start, opened again at a join or a departure (the book's floor). It keeps
// the states after the last steps (trusted points, the auditor's pre-step weights), the passes
// each peer earned, and answers what the other audit modules ask of it: which AUDIT frames of a
// step are missing, from which step a peer's contributions are not covered by a settled pass.
// Imports only the rules (audit.js) and the records; every other audit module imports it.
// Exports: exchangeAt, prevExchange, roundStart, roundIndex (audited units: steps or rounds),
// nextExchange, heldState, roundMismatch, openBook, restartBook, rechain, keepState, recordPass, checkedFrom,
// barrierFloor, missingFor, unitsPerStep, validAuditRate, sha256Hex, VERDICT_STEPS, GATE_LOOK_MS.
import { AUDIT_WINDOW, MAX_AUDIT_RATE, adamStateHash, roundEnd, trustedStep } from '../audit.js';
import { adamInit } from '../optim.js';
import { jsSha, toHex } from '../hashing.js';
import { AuditBook, KEPT_RING, MAX_KEPT_STATES } from './record.js';

export const sha256Hex = (bytes) => jsSha.hexOf([bytes]);
// the run's auditRate: the chance that a slot's contribution to a step is audited, 0..1
export const validAuditRate = (r) => typeof r === 'number' && Number.isFinite(r) && r >= 0 && r <= MAX_AUDIT_RATE;
// steps after its audited step an audit's verdict may still come (W, plus the two steps' lag of the
// reveals): kept states, frames and transcripts live this long
export const VERDICT_STEPS = AUDIT_WINDOW + 4;
export const GATE_LOOK_MS = 250;

// ---- audited units: a step, or a round of local steps (docs/VERIFICATION.md §13 "Rounds of local
// steps"), keyed by the step of its exchange e. One rule for both: with H = local_steps = 1 a
// round is a step (exchangeAt(s) = s, prevExchange(e) = e - 1, roundStart(e) = roundIndex(e) = e).
// the first exchange step at or after step index x
export const exchangeAt = (cfg, x) => roundEnd(x, cfg.local_steps, cfg.steps);
// the exchange whose audits are drawn after those of `done`'s, or null after the run's last
// (exchangeAt clamps to the last step: a loop that drew "the next" there drew the last one again
// forever, synchronously: CI's Node suite hung so)
export const nextExchange = (cfg, done) => (done + 1 < cfg.steps ? exchangeAt(cfg, done + 1) : null);
// the exchange before the round ending at e (its commitment holds the state the round starts from)
export const prevExchange = (cfg, e) => roundStart(cfg, e) - 1;
// the first step of the round ending at e (the kept state an audit of it starts from)
export const roundStart = (cfg, e) => Math.floor(e / cfg.local_steps) * cfg.local_steps;
// the round's index: what auditLoad counts (the loads of the last W rounds)
export const roundIndex = (cfg, e) => Math.floor(e / cfg.local_steps);

// ---- rounds rechecked forward (a barrier, audit_barriers.js; an end before it, kept_check.js)
// a member's state at round start x.from ({id, slot, from}) that this device holds with the hash
// the member committed to: its own kept state there (at the run's start, everyone's), or the end
// state it recomputed as the auditor of the member's pass there (passedStates); else null
export function heldState(run, b, x) {
  const st = b.states.get(x.from), chain = b.stateHashes.get(x.from - 1)?.[x.slot], p = b.passedStates.get(x.id);
  if (!chain) return null;
  if (st && toHex(adamStateHash(st)) === chain) return { t: st.t, m: st.m, v: st.v };
  return p && p.at === x.from && toHex(adamStateHash(p.adam)) === chain ? p.adam : null;
}

// slot's round ending at e as this device recomputed it (mine: recompute(..., sent = true, adam))
// against what it received (got: b.received.get(e)) and the end state the slot committed to (none
// where its AUDIT of e never came: the delta is still checked) -> null, or why it does not reproduce
export function roundMismatch(run, b, e, slot, mine, got) {
  if (mine.hash !== got.inHashes[slot] || !Object.is(mine.loss, got.losses[slot])) return `received ${got.inHashes[slot].slice(0, 16)}, recomputed ${mine.hash.slice(0, 16)}`;
  const committed = b.stateHashes.get(e)?.[slot] ?? b.commits.get(`${run.epoch}:${e}`)?.get(slot)?.stateHash;
  if (committed && toHex(adamStateHash(mine.adam)) !== committed) return "its Adam state at the round's end is not the one it committed to";
  return null;
}

// ---- the book: one per run, from its start (loop.begin) -----------------------------------------
// joined: this device joins a running group (its own state is fresh; the members' are their own)
export function openBook(run, rate, joined = false) {
  run.book = rate > 0 ? new AuditBook(rate, run.completed, unitsPerStep(run.cfg), run.cfg.local_steps) : null;
  if (!run.book) return;
  keepState(run);
  // local steps: every replica starts the run from the same state (fresh, or the resumed one): the
  // first round's chain is that state's hash for every slot. A joiner knows only its own (null: a
  // member's first round after it cannot be chain-checked here, named on the panel if audited)
  const own = toHex(adamStateHash(run.replica.adam));
  if (run.cfg.local_steps > 1) run.book.stateHashes.set(run.completed - 1, run.roster.map((_, slot) => (joined && slot !== run.slot ? null : own)));
}

// a join or a departure: audits start over at its first step (rollbacks never undo a roster change
// other than a conviction). before, epochBefore: the roster and epoch it replaces
export function restartBook(run, before = run.roster, epochBefore = run.epoch) {
  const old = run.book;
  if (!old) return;
  run.book = new AuditBook(old.rate, run.completed, old.units.perStep, old.span);
  keepState(run);
  if (old.span > 1) carryChain(run, old, before, epochBefore);
}

// local steps: the chain of each slot's first round after a roster change: a survivor's state hash
// committed with its last round (its AUDIT of the exchange before: kept by the old book, or still on
// its way: commitments.js onAudit fills it in), a joiner's fresh state (every device knows it)
function carryChain(run, old, before, epochBefore) {
  const b = run.book, at = run.completed - 1;
  const fresh = toHex(adamStateHash(adamInit(run.replica.params)));
  const committed = (i) => old.stateHashes.get(at)?.[i] ?? old.commits.get(`${epochBefore}:${at}`)?.get(i)?.stateHash ?? null;
  b.stateHashes.set(at, run.roster.map((id, slot) => (slot === run.slot ? toHex(adamStateHash(run.replica.adam))
    : before.includes(id) ? committed(before.indexOf(id)) : fresh)));
  b.chainEpoch = epochBefore;
}

// local steps, a conviction's rollback to `run.completed` (a round start) with the roster now
// `run.roster` (was `before`): each survivor restored its own state there, the one it committed to
// with the round before; its hash is the chain of the survivor's next round, in its new slot
export function rechain(run, before) {
  const b = run.book;
  if (!b || b.span === 1) return;
  const at = run.completed - 1, h = b.stateHashes.get(at);
  b.stateHashes = new Map(h ? [[at, run.roster.map((id) => h[before.indexOf(id)])]] : []);
}

// an estimate of a local step's units (INT8 matmuls): 6 per layer and the head forward, twice that
// backward; replaced by the count of the first recomputation
export const unitsPerStep = (cfg) => 18 * cfg.layers + 3;

// the state after run.completed steps, kept (a trusted point, the auditor's pre-step weights); with
// local steps only at a round's start (W = A there; m, v, t this device's own)
export function keepState(run) {
  const b = run.book, c = run.completed;
  if (!b || b.states.has(c) || c % b.span !== 0) return;
  const r = run.replica, spare = b.spare.pop();
  const copy = (from, into) => (into ? (Object.entries(from).forEach(([k, v]) => into[k].set(v)), into) : cloneArrays(from));
  b.states.set(c, { params: copy(r.params, spare?.params), m: copy(r.adam.m, spare?.m), v: copy(r.adam.v, spare?.v), t: r.adam.t, hash: run.hash });
  pruneStates(run);
}
const cloneArrays = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Float64Array.from(v)]));
// a state no longer kept lends its arrays to the next (no allocation per step), unless a
// recomputation is reading it
function release(b, t) {
  const st = b.states.get(t);
  b.states.delete(t);
  if (st && !b.reading.has(st) && b.spare.length < 2) b.spare.push(st);
}

// a pass of `audited` by `auditor` (the state after step `after`). Kept per auditor: the last 4
// whose verdict is in and every pending one (a conviction filters passes by step: a pending pass
// may be the failing audit itself, so the settled ones before it must still be here)
export function recordPass(run, audited, auditor, after) {
  const b = run.book, slot = run.roster.indexOf(audited);
  let by = b.passes.get(audited);
  if (!by) { by = new Map(); b.passes.set(audited, by); }
  const steps = by.get(auditor) || [];
  steps.push(after);
  const settled = (xs) => xs.filter((x) => !b.pending.has(`${x - 1}:${slot}`)).length;
  while (settled(steps.slice(1)) >= 4) steps.shift();
  by.set(auditor, steps);
}

// the first step of `id`'s contributions not covered by a settled pass: after its latest pass by an
// auditor never convicted whose verdict is in, the book's floor or the last rollback. shared: only
// the passes every member counts settled by now, those older than the verdict window (W + 1 units
// before the audits done); others' views differ (an auditor knows its own verdicts at once, a FIN
// settles what its sender audited), so a page keeps its own states from there (pruneStates)
export function checkedFrom(run, id, shared = false) {
  const b = run.book, slot = run.roster.indexOf(id);
  const settled = new Map([[null, b.floor]]);
  for (const [auditor, steps] of b.passes.get(id) || []) {
    const ok = steps.filter((x) => (shared ? x - 1 < b.done - (AUDIT_WINDOW + 1) * b.span : !b.pending.has(`${x - 1}:${slot}`)));
    if (ok.length) settled.set(auditor, ok[ok.length - 1]);
  }
  return Math.max(b.floor, b.since, trustedStep(settled, new Set(b.excludedFrom.keys())));
}

// the oldest step a departure's barrier may need (the states and received bytes kept from it on)
export function barrierFloor(run) {
  return Math.min(run.completed, ...run.roster.filter((_, slot) => slot !== run.slot).map((id) => checkedFrom(run, id)));
}

// keep: the last KEPT_RING states, the floor, and every pass a rollback may go back to; at most
// MAX_KEPT_STATES (the oldest trusted points go first: a rollback past them stops the run)
function pruneStates(run) {
  const b = run.book, c = run.completed;
  const needed = new Set([b.floor]);
  for (const byAuditor of b.passes.values()) for (const steps of byAuditor.values()) for (const t of steps) needed.add(t);
  for (const { t } of b.pending.values()) needed.add(roundStart(run.cfg, t));   // audits whose verdict may still come
  for (let t = barrierFloor(run); t < c; t++) needed.add(t);       // what a departure's barrier checks
  // (local steps: this device's own state since its last pass every member counts settled, from
  // which the end's barrier may ask it: a member that has not seen a later verdict asks an earlier one)
  if (b.span > 1 && run.slot >= 0) for (let t = checkedFrom(run, run.roster[run.slot], true); t < c; t++) needed.add(t);
  const ring = KEPT_RING * b.span;
  for (const t of [...b.states.keys()]) if (t < c - ring && !needed.has(t)) release(b, t);
  const old = [...b.states.keys()].filter((t) => t < c - ring && t !== b.floor).sort((x, y) => x - y);
  while (b.states.size > MAX_KEPT_STATES && old.length) release(b, old.shift());
}

// the peers whose AUDIT of t (commitment) or of t+1 (the reveal of t) is not here yet
export function missingFor(run, t) {
  const b = run.book;
  const commits = b.commits.get(`${run.epoch}:${t}`), reveals = b.reveals.get(`${run.epoch}:${t}`);
  return run.roster.filter((id, slot) => slot !== run.slot && (!commits?.has(slot) || !reveals?.has(slot)));
}
