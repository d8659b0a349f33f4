// Audited gradients in a page run (docs/VERIFICATION.md §13 is the contract; docs/PROTOCOL.md
// "Audited gradients" the frames). The rules are audit.js's (the reference's twin, the same
// names); this module is their use over the mesh, lagging the step loop so no step waits for an
// audit, and spreading each audit's recomputation over up to W = AUDIT_WINDOW steps so no page
// pays more than its share (about `rate` local steps per step):
//
//   after exchange s   AUDIT {epoch, step s, hashes, loss, nonceHash = SHA-256(n_s), reveal n_{s-1},
//                      beacon of s-2} to every member. The hashes are of the messages this device
//                      sent; every receiver checks the one it got (a mismatch: the split alarm).
//   step t = s-2       once every slot's AUDIT of t and of t+1 (its reveal) is here: digests,
//                      beacon, the pairs (auditPairs, the auditors' loads balanced over the last W
//                      steps). Each audit is recorded as a pass of the audited peer (trusted
//                      points, kept states), pending until its verdict; the auditor recomputes the
//                      audited slot from its kept state after t steps, in slices (a unit at a
//                      time) while its loop waits for the exchange, plus its share per step
//                      (payShare: the earliest-deadline rate, at least `rate` local steps), done
//                      by step t + W, and compares digests.
//   a failed audit     EVIDENCE {epoch, step, slot, accuser, committed, recomputed} to every member.
//                      Each member recomputes itself (judge): the audited peer or the accuser is
//                      convicted on this device's own evidence and the evidence is passed on.
//   a shard owner      (reduce-scatter) an audit of slot k also audits k's reduce: the auditor asks
//                      k for its transcript (TRANSCRIPT_ASK -> TRANSCRIPT: the P messages of shard k it
//                      reduced), checks each against its sender's commitment and recomputes the
//                      reduce against the REDUCED k sent; a mismatch is EVIDENCE {kind: 'reduce'},
//                      which every member judges by asking k itself (no answer in time: k is gone)
//   a cheap check      a gradient not finite or of the wrong size (mesh_collective.js): convicted
//                      at once by every receiver
//   a conviction       the peer is gone (recovery.js) with a rollback: the roster drops it from
//                      `back` = rollbackStep over this device's passes, every replica restores its
//                      kept state after `back` steps and the steps from there are recomputed.
//
// Every honest replica computes the same pairs, passes and `back`, so the run the group keeps is
// `python -m daisy.train --attack` with that removal (tests/js/audit_mesh.test.mjs). Audits and
// rollbacks never reach before the book's floor: the run's start, or its last join or departure.
import { TYPES } from '../mesh/frames.js';
import { Replica, Trainer } from '../train.js';
import { flattenGrads } from '../collective.js';
import { StepArena } from '../arena.js';
import { waitUntil } from '../page_clock.js';
import { AUDIT_WINDOW, MAX_AUDIT_RATE, auditLoad, auditPairs, beacon, checkReducedShard, slotMessages, trustedStep, contributionDigest, judge, referenceNonce, rollbackStep, slotDigest, Evidence } from '../audit.js';
import { CodecError } from '../exchange_codec.js';
import { jsSha, toHex, fromHex } from '../hashing.js';
import { qmatmulT } from '../units.js';
import { AuditBook, KEPT_RING, MAX_KEPT_STATES, isHash } from './record.js';
import { alarm } from './ending.js';

const sha256Hex = (bytes) => jsSha.hexOf([bytes]);
// the run's auditRate: the chance that a slot's contribution to a step is audited, 0..1
export const validAuditRate = (r) => typeof r === 'number' && Number.isFinite(r) && r >= 0 && r <= MAX_AUDIT_RATE;
// steps after its audited step an audit's verdict may still come (W, plus the two steps' lag of the
// reveals): kept states, frames and transcripts live this long
const VERDICT_STEPS = AUDIT_WINDOW + 4;
const GATE_LOOK_MS = 250;

// ---- the book: one per run, from its start (loop.begin) -----------------------------------------
export function openBook(run, rate) {
  run.book = rate > 0 ? new AuditBook(rate, run.completed, unitsPerStep(run.cfg)) : null;
  if (run.book) keepState(run);
}

// a join or a departure: audits start over at its first step (rollbacks never undo a roster change
// other than a conviction)
export function restartBook(run) {
  if (!run.book) return;
  run.book = new AuditBook(run.book.rate, run.completed, run.book.units.perStep);
  keepState(run);
}

// the state after run.completed steps, kept (a trusted point, the auditor's pre-step weights)
export function keepState(run) {
  const b = run.book, c = run.completed;
  if (!b || b.states.has(c)) return;
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

// keep: the last KEPT_RING states, the floor, and every pass a rollback may go back to; at most
// MAX_KEPT_STATES (the oldest trusted points go first: a rollback past them stops the run)
function pruneStates(run) {
  const b = run.book, c = run.completed;
  const needed = new Set([b.floor]);
  for (const byAuditor of b.passes.values()) for (const steps of byAuditor.values()) for (const t of steps) needed.add(t);
  for (const { t } of b.pending.values()) needed.add(t);          // audits whose verdict may still come
  for (let t = barrierFloor(run); t < c; t++) needed.add(t);       // what a departure's barrier checks
  for (const t of [...b.states.keys()]) if (t < c - KEPT_RING && !needed.has(t)) release(b, t);
  const old = [...b.states.keys()].filter((t) => t < c - KEPT_RING && t !== b.floor).sort((x, y) => x - y);
  while (b.states.size > MAX_KEPT_STATES && old.length) release(b, old.shift());
}

// ---- after each exchange: commit, then the audits two steps back ----------------------------------
// out: the exchange's result (ownHashes, inHashes, losses). -> false when a conviction halted the run
export async function afterExchange(ctl, run, s, out, loss) {
  const b = run.book;
  if (!b) return true;
  b.received.set(s, { inHashes: out.inHashes, losses: out.losses, transcript: out.transcript, reduced: out.reduced });
  const nonce = ctl.faults.referenceNonces ? referenceNonce(run.cfg.seed, s, run.slot) : crypto.getRandomValues(new Uint8Array(32));
  b.nonces.set(s, nonce);
  commitOwn(ctl, run, s, { hashes: out.ownHashes, loss, nonceHash: sha256Hex(nonce) });
  if (!withholding(ctl, s)) sendAudit(ctl, run, s, out.ownHashes, loss, sha256Hex(nonce));
  return catchUp(ctl, run, s - 2);
}

// the fault plan's page that withholds its AUDIT frames (tests: a forger that leaves at once)
const withholding = (ctl, s) => ctl.faults.withholdAudits !== null && s >= ctl.faults.withholdAudits.from;

function commitOwn(ctl, run, s, commit) {
  commitsOf(run.book, run.epoch, s).set(run.slot, commit);
}

function commitsOf(b, epoch, s) {
  const key = `${epoch}:${s}`;
  let m = b.commits.get(key);
  if (!m) { m = new Map(); b.commits.set(key, m); }
  return m;
}

function sendAudit(ctl, run, s, hashes, loss, nonceHash) {
  const b = run.book;
  const prev = b.nonces.get(s - 1);
  const msg = { runId: run.desc.runId, epoch: run.epoch, step: s, hashes, loss, nonceHash,
                reveal: prev && s - 1 >= b.floor ? toHex(prev) : null, beacon: b.beacons.get(s - 2) || null };
  ctl.tellAll(run, TYPES.AUDIT, msg);
}

// the run's last steps: the nonce of the last step goes out alone (a tail AUDIT: no commitment),
// and the audits of the last two steps run before FIN. -> false when a conviction halted the run
export async function flush(ctl, run) {
  const b = run.book;
  if (!b) return true;
  revealLast(ctl, run);
  if (!(await catchUp(ctl, run, run.completed - 1))) return false;
  b.gateOpen = true;                 // every audit this device owes, before FIN
  ctl.poke();
  work(ctl, run, b);
  while (b.working) await b.working;
  return !run.ended && !run.recovery && run.book === b;
}

// the nonce of the last step this device committed to, in a tail AUDIT (once): at the run's end,
// and when a recovery halts the loop (the audits of the steps before a lie need every reveal)
export function revealLast(ctl, run) {
  const b = run.book;
  if (!b || !b.nonces.size) return;
  const last = Math.max(...b.nonces.keys()), s = last + 1;
  if (b.tailSent.has(`${run.epoch}:${s}`) || withholding(ctl, s)) return;
  b.tailSent.add(`${run.epoch}:${s}`);
  ctl.tellAll(run, TYPES.AUDIT, { runId: run.desc.runId, epoch: run.epoch, step: s, hashes: null, loss: null, nonceHash: null,
                                  reveal: toHex(b.nonces.get(last)), beacon: b.beacons.get(s - 2) || null });
}

// every audit up to step `upTo` (waiting for the frames it needs, within the deadline)
async function catchUp(ctl, run, upTo) {
  const b = run.book;
  while (b.done < upTo && run.book === b && !run.ended && !run.recovery) {
    const t = b.done + 1;
    // (at the run's end a member gone is not waited for: its steps are recomputed, checkEnd)
    const missing = () => missingFor(run, t).filter((id) => !run.finishing || !run.gone.has(id));
    const ok = await waitUntil(() => !missing().length || run.ended || run.recovery || run.book !== b, run.collective.deadlineMs,
      (wake) => ctl.onPoke(wake));
    if (run.ended || run.recovery || run.book !== b) return false;
    if (run.finishing && (!ok || missingFor(run, t).length)) {
      // the run's end: that step's audits are not drawn, and a member whose frames did not come is
      // not waited for again (its contributions are recomputed: checkEnd; it changes no roster)
      const ids = missingFor(run, t).filter((id) => !run.gone.has(id));
      if (ids.length) ctl.host.note(`Step ${t + 1} is not audited: no audit commitment of it from ${ids.map((id) => ctl.host.nameOf(id)).join(', ')} in time (checked at the run's end).`);
      for (const id of ids) ctl.peerGone(id, `no audit commitment of step ${t + 1} in time`);
      b.done = t;
      continue;
    }
    if (!ok) {
      const ids = missing();
      ctl.host.note(`No audit commitment of step ${t + 1} from ${ids.map((id) => ctl.host.nameOf(id)).join(', ')} in time.`);
      for (const id of ids) ctl.peerGone(id, `no audit commitment of step ${t + 1} in time`);
      return false;
    }
    if (!(await auditStep(ctl, run, t))) return false;
  }
  return !run.ended && !run.recovery;
}

// Outside the loop (a recovery parks it): every step whose frames are all here is audited now,
// then the evidence waiting for it is judged (a member must judge evidence while it is halted)
async function advance(ctl, run) {
  const b = run.book;
  while (run.book === b && !run.ended && b.done + 1 < run.completed && !missingFor(run, b.done + 1).length) {
    if (!(await auditStep(ctl, run, b.done + 1))) return;
  }
  if (run.book !== b) return;
  // an accused that left for good: the steps blocked only by its withheld frames are skipped once
  // every other member's frames of them are here, which may be after the conviction (settle)
  if (b.accused.size) settle(ctl, run);
  work(ctl, run, b);
  await drainEvidence(ctl, run);
}

// the peers whose AUDIT of t (commitment) or of t+1 (the reveal of t) is not here yet
function missingFor(run, t) {
  const b = run.book;
  const commits = b.commits.get(`${run.epoch}:${t}`), reveals = b.reveals.get(`${run.epoch}:${t}`);
  return run.roster.filter((id, slot) => slot !== run.slot && (!commits?.has(slot) || !reveals?.has(slot)));
}

// step t's audits: check what this device received against each slot's commitment, the beacon,
// the pairs; record each audit as a pass; recompute the ones this device audits
async function auditStep(ctl, run, t) {
  const b = run.book, h = ctl.host, P = run.roster.length;
  const commits = b.commits.get(`${run.epoch}:${t}`), reveals = b.reveals.get(`${run.epoch}:${t}`) || new Map();
  reveals.set(run.slot, toHex(b.nonces.get(t)));
  const got = b.received.get(t);
  const digests = [], nonces = [];
  for (let slot = 0; slot < P; slot++) {
    const c = commits.get(slot), id = run.roster[slot];
    const mine = got.inHashes[slot];
    const claimed = c.hashes.length === 1 ? c.hashes[0] : c.hashes[run.slot];
    if (slot !== run.slot && (claimed !== mine || !Object.is(c.loss, got.losses[slot]))) {
      alarmSplit(ctl, run, `Split alarm at step ${t + 1}: ${h.nameOf(id)} committed to other bytes than it sent this device. Stopped (never fork).`);
      return false;
    }
    if (sha256Hex(fromHex(reveals.get(slot))) !== c.nonceHash) {
      convict(ctl, run, id, t, `gradient from ${h.nameOf(id)} did not reproduce at step ${t + 1} (its nonce does not match its commitment): removed`);
      return false;
    }
    digests.push(slotDigest(t, slot, c.loss, c.hashes.map(fromHex)));
    nonces.push(fromHex(reveals.get(slot)));
  }
  const beaconBytes = beacon(digests, nonces);
  b.beacons.set(t, toHex(beaconBytes));
  const pairs = auditPairs(run.cfg.seed, t, P, b.rate, beaconBytes, auditLoad(b.assigned, t, P));
  b.pairs.set(t, pairs);
  b.assigned.set(t, pairs.map(([auditor]) => auditor));
  b.digests.set(t, digests.map(toHex));
  b.shardHashes.set(t, Array.from({ length: P }, (_, slot) => commits.get(slot).hashes));
  b.done = t;
  // a member's beacon of t that is not ours: it saw other commitments (the split alarm)
  for (const [slot, x] of b.claimedBeacons.get(`${run.epoch}:${t}`) || []) {
    if (x !== toHex(beaconBytes)) { alarmSplit(ctl, run, `Split alarm at step ${t + 1}: ${h.nameOf(run.roster[slot])} saw other commitments of that step. Stopped (never fork).`); return false; }
  }
  for (const [auditor, audited] of pairs) {
    // its verdict may come up to W steps later: until then the pass is pending here
    b.pending.set(`${t}:${audited}`, { t, slot: audited, auditor, committed: toHex(digests[audited]) });
    recordPass(run, run.roster[audited], run.roster[auditor], t + 1);
  }
  keepState(run);
  settle(ctl, run);
  for (const [auditor, audited] of pairs) {
    if (auditor !== run.slot) continue;
    b.audits++;
    const committed = toHex(digests[audited]);
    // the fault plan: a lying auditor accuses (the members judge it); a forger passes its fellow
    // colluders unchecked
    const lying = ctl.faults.liarAuditor !== null && t >= ctl.faults.liarAuditor.from;
    const f = ctl.faults.forge, colluding = f !== null && t >= f.from && (f.colluders || []).includes(run.roster[audited]);
    // (recorded as an honest auditor records its evidence: the members judging it check this
    // device's earlier audits, its transcripts included)
    if (lying && ctl.faults.liarAuditor.reduce && run.collective.topology === 'rsag') {
      // a false accusation of the audited owner's reduce (its transcript will clear it)
      const ev = { runId: run.desc.runId, epoch: run.epoch, step: t, slot: audited, accuser: run.slot, kind: 'reduce',
                   committed: sha256Hex(b.received.get(t).reduced[audited]), recomputed: sha256Hex(fromHex(committed)) };
      ctl.tellAll(run, TYPES.EVIDENCE, ev);
      b.evidenceSeen.add(evidenceKey(run.epoch, ev));
    } else if (lying) {
      const ev = { runId: run.desc.runId, epoch: run.epoch, step: t, slot: audited, accuser: run.slot, committed, recomputed: sha256Hex(fromHex(committed)) };
      ctl.tellAll(run, TYPES.EVIDENCE, ev);
      b.evidenceSeen.add(evidenceKey(run.epoch, ev));
    }
    else if (!colluding) {
      const batch = run.batches.one(t, audited);      // fetched now: here by the time the recomputation runs
      batch.catch(() => {});
      b.queued.push({ t, audited, committed, epoch: run.epoch, batch, done: 0, release: null, admitting: null, inflight: 0 });
    }
  }
  return drainEvidence(ctl, run);
}

// ---- the share: audits spread over steps and idle time (docs/VERIFICATION.md §13 "The schedule")
// The recomputations this device owes run one at a time through a gated backend: a unit (one
// INT8 matmul with its quantization) runs only while the gate is open. It is open while the loop
// waits for the exchange (idle: the transfer hides the work), while a recovery parks the loop or
// the run finishes, and after each exchange until this step's share is done (payShare). The loop
// then computes its own step with the gate shut.

// the loop waits for the exchange: audits may run
export function idle(ctl, run) {
  const b = run.book;
  if (!b) return;
  b.gateOpen = true;
  ctl.poke();
  work(ctl, run, b);
}

// after the exchange of step s (afterExchange queued the audits of s - 2): this step's share of
// the audit work is done before the loop applies s, then the gate shuts. The share: the
// earliest-deadline rate (every queued audit done by the step before its deadline t + W), at least
// `rate` local steps per step while work is queued, less what ran while the loop was idle.
export async function payShare(ctl, run, s) {
  const b = run.book;
  if (!b) return;
  b.gateOpen = true;
  ctl.poke();
  work(ctl, run, b);
  const need = shareUnits(b, s) - b.units.sinceShare;
  if (need > 0) {
    const target = b.units.done + need;
    const paid = () => b.units.done >= target || !b.queued.length || run.ended || run.recovery || run.book !== b;
    while (!paid()) await waitUntil(paid, GATE_LOOK_MS, (wake) => ctl.onPoke(wake));
  }
  b.gateOpen = false;
  b.units.sinceShare = 0;
}

// units this step owes: max over the queue (deadline order) of ceil(work up to k / steps left to k's
// deadline), and at least rate x one step's units while any is queued
export function shareUnits(b, s) {
  const U = b.units.perStep;
  let cum = 0, need = 0;
  for (const a of b.queued) {
    cum += Math.max(0, U - a.done);
    need = Math.max(need, Math.ceil(cum / Math.max(1, a.t + AUDIT_WINDOW - s)));
  }
  return cum ? Math.min(cum, Math.max(need, Math.ceil(b.rate * U))) : 0;
}

// an estimate of a local step's units (INT8 matmuls): 6 per layer and the head forward, twice that
// backward; replaced by the count of the first recomputation
export const unitsPerStep = (cfg) => 18 * cfg.layers + 3;

// the queue's worker: one recomputation at a time, in deadline order; each judged when it ends, a
// failed one is evidence to every member
function work(ctl, run, b) {
  if (b.working || !b.queued.length) return;
  b.working = (async () => {
    while (b.queued.length && run.book === b && !run.ended) {
      const item = b.queued[0];
      try {
        await checkAudit(ctl, run, b, item);
      } catch (err) {
        if (!(err instanceof AuditVoid)) console.warn('daisy: an audit failed:', err);
      }
      if (b.queued[0] === item) b.queued.shift();
      ctl.poke();
    }
  })().finally(() => { b.working = null; });
}

// the gate a gated recomputation passes before each unit: open (above), or the loop is parked or
// finishing. Between two gates the recomputation holds the compute backend (exclusive: the row
// kernels and the units of two steps never interleave on a shared thread pool); at a gate it
// lets go, so the loop's step waits at most for one unit and its glue. An audit voided meanwhile
// (rolled back, restarted, ended) stops at the gate.
class AuditVoid extends Error {}
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

async function checkAudit(ctl, run, b, item) {
  const { t, audited, committed, epoch, batch } = item;
  const void_ = () => run.ended || run.book !== b || run.epoch !== epoch;   // rolled back or restarted meanwhile
  if (void_()) return;
  const recomputed = await recompute(ctl, run, t, audited, batch, item);
  if (recomputed === null || void_()) return;
  if (recomputed === committed) {
    if (run.collective.topology === 'rsag') await checkOwner(ctl, run, b, t, audited, epoch);
    if (!void_()) b.pending.delete(`${t}:${audited}`);
    return;
  }
  const ev = { runId: run.desc.runId, epoch: run.epoch, step: t, slot: audited, accuser: run.slot, committed, recomputed };
  ctl.tellAll(run, TYPES.EVIDENCE, ev);
  b.evidenceSeen.add(evidenceKey(run.epoch, ev));
  convict(ctl, run, run.roster[audited], t, removalWords(ctl, run, run.roster[audited], t, ev));
}

// ---- reduce-scatter: a shard owner's reduce (docs/VERIFICATION.md §13 "A shard owner's reduced shard")
// The audit of slot k passed its gradient; k also owns shard k: its transcript against the REDUCED
// it sent. A mismatch is evidence for every member (each asks k for the transcript itself).
async function checkOwner(ctl, run, b, t, k, epoch) {
  const owner = run.roster[k];
  const transcript = await askTranscript(ctl, run, b, t, k);
  if (run.ended || run.book !== b || run.epoch !== epoch) return;
  if (transcript === null) { noTranscript(ctl, run, owner, t); return; }
  const v = ownerVerdict(run, b, t, k, transcript);
  if (v.reason === null) return;
  const ev = { runId: run.desc.runId, epoch: run.epoch, step: t, slot: k, accuser: run.slot, kind: 'reduce', committed: v.committed, recomputed: v.recomputed };
  ctl.tellAll(run, TYPES.EVIDENCE, ev);
  b.evidenceSeen.add(evidenceKey(run.epoch, ev));
  convict(ctl, run, owner, t, ownerWords(ctl, run, owner, t, v.reason, run.slot));
}

// -> the transcript of step t from the owner of shard k (its P messages, concatenated), or null
// when none came within the deadline; this device's own when it is that owner
// The owner answers one ask per asker and step (a repeat is a bad frame there), so this device asks
// once: the audit, a judgement of reduce evidence and a conviction's earlier audits share the answer
function askTranscript(ctl, run, b, t, k) {
  if (k === run.slot) return Promise.resolve(concat(b.received.get(t)?.transcript));
  const key = `${run.epoch}:${t}:${k}`;
  if (!b.asked.has(key)) b.asked.set(key, (async () => {
    b.asking.add(key);
    ctl.mesh.sendJson(run.roster[k], TYPES.TRANSCRIPT_ASK, { runId: run.desc.runId, epoch: run.epoch, step: t }, { runId: run.desc.runId, slot: run.slot }).catch(() => {});
    await waitUntil(() => b.transcripts.has(key) || run.ended || run.book !== b, run.collective.deadlineMs, (wake) => ctl.onPoke(wake));
    b.asking.delete(key);
  })());
  return b.asked.get(key).then(() => b.transcripts.get(key) ?? null);
}

// a transcript of shard k: the P slots' messages of it, each of the shard's message size
const transcriptBytes = (run, k) => run.roster.length * run.collective.codec.messageBytes(run.collective.shardValues(k));

const concat = (parts) => {
  if (!parts) return null;
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
};

// the owner's transcript of step t against the commitments and the REDUCED this device got ->
// {reason (null: it reproduces), committed: SHA-256 of that REDUCED, recomputed: of the transcript}
function ownerVerdict(run, b, t, k, transcript) {
  const c = run.collective, codec = c.codec, P = run.roster.length;
  const n = c.shardValues(k), size = transcriptBytes(run, k) / P;
  const slices = Array.from({ length: P }, (_, s) => transcript.subarray(s * size, (s + 1) * size));
  const committed = b.shardHashes.get(t).map((hashes) => fromHex(hashes[k]));
  const reduced = b.received.get(t).reduced[k];
  let reason;
  try {
    reason = checkReducedShard(slices, committed, codec.decode(reduced, n), n, codec, run.cfg.seed, t, c.bounds[k]);
  } catch (err) {
    if (!(err instanceof CodecError)) throw err;
    reason = null;                // a committed slice that does not decode: its sender's lie, not the owner's
  }
  return { reason, committed: sha256Hex(reduced), recomputed: sha256Hex(transcript) };
}

function ownerWords(ctl, run, owner, t, reason, accuser) {
  return `reduced shard from ${ctl.host.nameOf(owner)} did not reproduce at step ${t + 1}: removed (${reason}; audited by ${ctl.host.nameOf(run.roster[accuser])})`;
}

// an owner that does not show its transcript in time is gone (this device's own evidence)
function noTranscript(ctl, run, owner, t) {
  ctl.host.note(`No transcript of step ${t + 1} from ${ctl.host.nameOf(owner)} in time.`);
  ctl.peerGone(owner, `no transcript of step ${t + 1} in time`);
}

// the mesh's limit for a TRANSCRIPT: only from an owner this device asked, at its exact size
export function transcriptLimit(ctl, hd) {
  const run = ctl.run, b = run?.book;
  if (!b || run.collective.topology !== 'rsag' || hd.runId !== run.desc.runId) return 'TRANSCRIPT for no audit of ours';
  if (!b.asking.has(`${run.epoch}:${hd.step}:${hd.slot}`)) return `TRANSCRIPT of step ${hd.step} from slot ${hd.slot}, not asked for`;
  return transcriptBytes(run, hd.slot);
}

// a pass of `audited` by `auditor` (the state after step `after`). Kept per auditor: the last 4
// whose verdict is in and every pending one (a conviction filters passes by step: a pending pass
// may be the failing audit itself, so the settled ones before it must still be here)
function recordPass(run, audited, auditor, after) {
  const b = run.book, slot = run.roster.indexOf(audited);
  let by = b.passes.get(audited);
  if (!by) { by = new Map(); b.passes.set(audited, by); }
  const steps = by.get(auditor) || [];
  steps.push(after);
  const settled = (xs) => xs.filter((x) => !b.pending.has(`${x - 1}:${slot}`)).length;
  while (settled(steps.slice(1)) >= 4) steps.shift();
  by.set(auditor, steps);
}

// the digest of `slot`'s contribution to step t, recomputed from this device's kept state after t
// steps (null: that state is no longer kept); batch: its batch's promise, if fetched already.
// item: an audit this device owes (its units pass the gate); else a judge's check, at once
async function recompute(ctl, run, t, slot, batch = null, item = null, sent = false) {
  const b = run.book, st = b.states.get(t);
  if (!st) { ctl.host.note(`Cannot check step ${t + 1}: its state is no longer kept here.`); return null; }
  const replica = new Replica(st.params, { t: st.t, m: st.m, v: st.v });
  const one = { get: (step, sl) => (batch && step === t && sl === slot ? batch : run.batches.one(step, sl)) };
  const backend = item ? gatedBackend(ctl, run, b, run.trainer.backend, item) : run.trainer.backend;
  const trainer = new Trainer(run.cfg, replica, one, backend);
  const arena = item ? (b.arena ||= ctl.host.backend()?.newArena() ?? new StepArena())
    : (b.judgeArena ||= ctl.host.backend()?.newArena() ?? new StepArena());
  b.reading.add(st);
  const step = async () => {
    if (item) await admit(ctl, run, b, item);          // the gate and the backend, before any kernel
    arena.reset();
    const gpu = ctl.host.gpu;
    const before = item?.done;
    const r = gpu ? await gpu.withGpuFallback(run.trainer.backend.engine, () => trainer.localStep(t, slot, arena))
      : await trainer.localStep(t, slot, arena);
    if (item && item.done - before > 0) b.units.perStep = item.done - before;     // a step's units, counted
    const flat = flattenGrads(r.grads, run.collective.names);
    if (sent) {                    // the message this device received from `slot`, and its loss
      const messages = slotMessages(flat, run.roster.length, run.cfg.seed, t, slot, run.collective.codec);
      return { hash: sha256Hex(messages[messages.length === 1 ? 0 : run.slot]), loss: r.loss };
    }
    return toHex(contributionDigest(flat, r.loss, run.roster.length, run.cfg.seed, t, slot, run.collective.codec));
  };
  return (item ? step() : exclusive(run, step)).finally(() => {
    b.reading.delete(st);
    if (item) { item.release?.(); item.release = null; }
  });
}

// one user of the compute backend at a time: the loop's steps and the audits' recomputations
export function exclusive(run, fn) {
  const p = run.computing.then(fn);
  run.computing = p.catch(() => {});
  return p;
}

// ---- frames ---------------------------------------------------------------------------------------
export function onAudit(ctl, from, m) {
  const run = ctl.at, d = m.json, b = run.book;
  const slot = run.roster.indexOf(from);
  if (!b || d.runId !== run.desc.runId || slot < 0 || !Number.isInteger(d.epoch) || !Number.isInteger(d.step)) { ctl.mesh.drop(from, m, 'AUDIT for no audited run of ours'); return; }
  if (d.epoch < run.epoch) return;                                     // a late frame of an epoch this device left
  if (d.epoch > run.epoch + 1 || d.step < b.floor || d.step > run.completed + 3) { ctl.mesh.drop(from, m, `AUDIT of step ${d.step} in epoch ${d.epoch}, this device is at ${run.completed} in epoch ${run.epoch}`); return; }
  const tail = d.hashes === null;
  const m1 = run.collective.topology === 'allgather' ? 1 : run.roster.length;
  if (!tail && (!Array.isArray(d.hashes) || d.hashes.length !== m1 || !d.hashes.every(isHash) || !isHash(d.nonceHash) || typeof d.loss !== 'number')) {
    ctl.mesh.drop(from, m, 'AUDIT with a malformed commitment'); return;
  }
  if ((d.reveal !== null && !isHash(d.reveal)) || (d.beacon !== null && !isHash(d.beacon))) { ctl.mesh.drop(from, m, 'AUDIT with a malformed nonce or beacon'); return; }
  // the frame's epoch: a roster that may be committed a moment later here (its slots are the new ones)
  const epoch = d.epoch;
  if (!tail) {
    // one per step: a repeat is a bad frame, also once the step is audited (its commitments pruned)
    const commits = commitsOf(b, epoch, d.step);
    if (commits.has(slot) || d.step < b.done - 1) { ctl.mesh.drop(from, m, `a repeated AUDIT of step ${d.step}`); return; }
    commits.set(slot, { hashes: d.hashes, loss: d.loss, nonceHash: d.nonceHash });
  }
  if (d.reveal !== null && d.step - 1 >= b.floor) {
    const key = `${epoch}:${d.step - 1}`;
    if (!b.reveals.has(key)) b.reveals.set(key, new Map());
    if (!b.reveals.get(key).has(slot)) b.reveals.get(key).set(slot, d.reveal);
  }
  if (d.beacon !== null) {
    const key = `${epoch}:${d.step - 2}`;
    const known = b.beacons.get(d.step - 2);
    if (epoch === run.epoch && known && known !== d.beacon) { alarmSplit(ctl, run, `Split alarm at step ${d.step - 1}: ${ctl.host.nameOf(from)} saw other commitments of that step. Stopped (never fork).`); return; }
    if (!b.claimedBeacons.has(key)) b.claimedBeacons.set(key, new Map());
    b.claimedBeacons.get(key).set(slot, d.beacon);
  }
  pruneFrames(run);
  ctl.poke();
  if (run.recovery) advance(ctl, run).catch((err) => console.warn('daisy: an audit failed:', err));
}

// frames older than the audits done, or of epochs this device left, go
function pruneFrames(run) {
  const b = run.book;
  for (const map of [b.commits, b.reveals, b.claimedBeacons]) {
    for (const key of [...map.keys()]) {
      const [e, st] = key.split(':').map(Number);
      if (e < run.epoch || st < b.done - 1) map.delete(key);
    }
  }
  for (const map of [b.nonces, b.beacons, b.pairs, b.digests, b.shardHashes, b.assigned]) for (const st of [...map.keys()]) if (st < b.done - VERDICT_STEPS) map.delete(st);
  const keep = Math.min(b.done - VERDICT_STEPS, barrierFloor(run));              // a departure's barrier reads these
  for (const st of [...b.received.keys()]) if (st < keep) b.received.delete(st);
  for (const map of [b.transcripts, b.asked]) for (const key of [...map.keys()]) if (Number(key.split(':')[1]) < b.done - VERDICT_STEPS) map.delete(key);   // epoch:step:owner
  for (const key of [...b.reproduced.keys()]) if (Number(key.split(':')[1]) < b.done - VERDICT_STEPS) b.reproduced.delete(key);   // epoch:step:slot:accuser
  for (const key of [...b.answered]) if (Number(key.split(':').at(-1)) < b.done - VERDICT_STEPS) b.answered.delete(key);          // asker:epoch:step
  // a pending pass whose auditor's evidence would be here by now (sent by step t + W, before that
  // auditor's gradient of t + W + 1 on the same ordered link) is a pass
  for (const [key, p] of [...b.pending]) if (p.t < b.done - AUDIT_WINDOW - 1) b.pending.delete(key);
}

// a member's evidence: checked once this device ran that step's audits itself. Its sender is the
// accuser (its own word) or relays another member's (docs/PROTOCOL.md "Audited gradients"): a
// relay is checked against the same pairs and commitments this device holds, and convicts only
// what this device recomputes itself (the accused, when its contribution does not reproduce); a
// relayed accusation that reproduces convicts nobody (only the accuser's own frame names it) and
// is a bad frame, as is one naming no audit. A relay of evidence judged here already is dropped
// without counting (every honest member relays it once).
export function onEvidence(ctl, from, m) {
  const run = ctl.at, d = m.json, b = run.book;
  const sender = run.roster.indexOf(from);
  if (b && d.runId === run.desc.runId && Number.isInteger(d.epoch) && d.epoch < run.epoch) return;   // a late frame of an epoch this device left
  if (!b || d.runId !== run.desc.runId || sender < 0 || !Number.isInteger(d.accuser) || d.accuser < 0 || d.accuser >= run.roster.length
      || !Number.isInteger(d.step) || !Number.isInteger(d.slot)
      || !isHash(d.committed) || !isHash(d.recomputed) || d.epoch !== run.epoch || (d.kind !== undefined && d.kind !== 'reduce')) { ctl.mesh.drop(from, m, 'EVIDENCE for no audited run of ours'); return; }
  if (d.accuser !== sender && b.evidenceSeen.has(evidenceKey(run.epoch, d))) return;      // a relay of evidence judged here
  if (b.evidence.length >= run.roster.length * 2) { ctl.mesh.drop(from, m, 'too much evidence at once'); return; }
  b.evidence.push({ from, ev: d });
  (run.recovery ? advance(ctl, run) : drainEvidence(ctl, run)).catch((err) => console.warn('daisy: checking evidence failed:', err));
}

// an auditor or a judge asks this device, the owner of a shard, for its transcript of a step. Sent
// only where the protocol owes it: to the auditor the beacon named for this device's slot at that
// step, or to a member judging an EVIDENCE of this device's reduce at that step; once per asker and
// step, while kept. An ask not owed yet (this device has not drawn that step's pairs, or the
// evidence is still on its way) waits for it up to the exchange deadline; one never owed is a bad
// frame (counted toward the flood limit), as is a repeated one. So a member makes this device send
// a transcript only where the run would anyway (docs/PROTOCOL.md "Mesh limits"). Also answered
// from the run that just ended here (idle): a member still auditing the last steps may ask then.
export async function onTranscriptAsk(ctl, from, m) {
  const run = ctl.phase === 'running' ? ctl.at : ctl.lastRun, d = m.json, b = run?.book;
  const ok = b && d.runId === run.desc.runId && d.epoch === run.epoch && run.roster.includes(from) && Number.isInteger(d.step);
  const parts = ok ? b.received.get(d.step)?.transcript : null;
  if (!parts) { ctl.mesh.drop(from, m, `TRANSCRIPT_ASK of step ${d.step}: no transcript of it kept here`); return; }
  const key = `${from}:${d.epoch}:${d.step}`;
  if (b.answered.has(key)) { ctl.mesh.drop(from, m, `a second TRANSCRIPT_ASK of step ${d.step}`); return; }
  b.answered.add(key);                       // a repeat while this one waits is a second ask too
  const owed = () => run.book === b && transcriptOwed(run, b, run.roster.indexOf(from), d.epoch, d.step);
  if (!(await waitUntil(owed, run.collective.deadlineMs, (wake) => ctl.onPoke(wake)))) {
    if (run.book === b) ctl.mesh.drop(from, m, `TRANSCRIPT_ASK of step ${d.step}: not this step's auditor of this device, nor judging its reduce`);
    return;
  }
  const kept = b.received.get(d.step)?.transcript;
  if (kept) ctl.mesh.send(from, { type: TYPES.TRANSCRIPT, slot: run.slot, runId: run.desc.runId, step: d.step, payload: concat(kept) }).catch(() => {});
}

// whether the member in slot `asker` is owed this device's transcript of step t: the pairs of t name
// it this device's auditor; or an EVIDENCE of kind 'reduce' against this device's slot at t is here;
// or this device was audited at t and an EVIDENCE naming it (accused or accuser) at a later step
// within the verdict window is here: every member that convicts on it checks this device's audits
// before that step whose verdicts may still come, its reduce included (checkingEarlier). Pending or
// judged, or sent by this device: evidenceSeen's keys (and reproduced's) are epoch:step:slot:accuser
function transcriptOwed(run, b, asker, epoch, t) {
  if (asker < 0) return false;
  const pairs = b.pairs.get(t);
  if (pairs?.some(([auditor, audited]) => auditor === asker && audited === run.slot)) return true;
  const audited = Boolean(pairs?.some(([, d]) => d === run.slot));
  const owes = ({ e, step, slot, accuser, reduce }) => e === epoch && (
    (reduce && step === t && slot === run.slot)
    || (audited && step > t && step - t <= VERDICT_STEPS && (slot === run.slot || accuser === run.slot)));
  if (b.evidence.some(({ ev }) => owes({ e: ev.epoch, step: ev.step, slot: ev.slot, accuser: ev.accuser, reduce: ev.kind === 'reduce' }))) return true;
  for (const k of [...b.evidenceSeen, ...b.reproduced.keys()]) {
    const [e, step, slot, accuser] = k.split(':').map(Number);
    if (owes({ e, step, slot, accuser, reduce: slot === run.slot && step === t })) return true;
  }
  return false;
}

// a transcript this device asked for (the mesh checked its size against transcriptLimit); a second
// one of the same ask is a bad frame
export function onTranscript(ctl, from, m) {
  const run = ctl.at, b = run.book, slot = run.roster.indexOf(from);
  const key = `${run.epoch}:${m.step}:${slot}`;
  const want = b && slot >= 0 && m.slot === slot && b.asking.has(key) ? transcriptBytes(run, slot) : -1;
  if (m.payload.length !== want) { ctl.mesh.drop(from, m, 'TRANSCRIPT not asked for, or of another size'); return; }
  if (b.transcripts.has(key)) { ctl.mesh.drop(from, m, `a second TRANSCRIPT of step ${m.step}`); return; }
  b.transcripts.set(key, m.payload);
  ctl.poke();
}

const evidenceKey = (epoch, ev) => `${epoch}:${ev.step}:${ev.slot}:${ev.accuser}`;

// the evidence this device can judge now (its own audits of that step done). -> false when a
// conviction halted the run
async function drainEvidence(ctl, run) {
  const b = run.book;
  while (b && run.book === b && !run.ended) {
    const i = b.evidence.findIndex(({ ev }) => ev.step <= b.done);
    if (i < 0) break;
    const [{ from, ev }] = b.evidence.splice(i, 1);
    // its slots are those of its epoch's roster: after a roster change they name other peers
    if (ev.epoch !== run.epoch) { ctl.mesh.dropStale(); continue; }
    const key = evidenceKey(run.epoch, ev);
    if (b.evidenceSeen.has(key)) continue;
    const relayed = run.roster.indexOf(from) !== ev.accuser;
    const pairs = b.pairs.get(ev.step);
    if (ev.kind === 'reduce') return judgeOwner(ctl, run, b, from, ev, pairs, relayed);
    const committed = b.digests.get(ev.step)?.[ev.slot];
    if (!pairs || !pairs.some(([a, d]) => a === ev.accuser && d === ev.slot) || committed !== ev.committed) {
      ctl.mesh.drop(from, { type: TYPES.EVIDENCE }, `EVIDENCE of step ${ev.step + 1} that names no audit of that step or another commitment`);
      continue;
    }
    const epoch = run.epoch;
    const reproduced = b.reproduced.get(key) ?? await recompute(ctl, run, ev.step, ev.slot);
    // a roster change while it recomputed (a conviction's rollback applied) voids the evidence: read
    // against the new roster, its slots would convict a peer it never named
    if (reproduced === null || run.book !== b || run.ended || run.epoch !== epoch) return false;
    const verdict = judge(new Evidence({ run: String(run.desc.runId), ...ev }), reproduced);
    const accused = run.roster[ev.slot], accuser = run.roster[ev.accuser];
    if (verdict !== 'audited' && relayed) {
      // a false accusation in another member's words: not the accuser's own (it may not have said it)
      b.reproduced.set(key, reproduced);
      if (ev.slot !== run.slot) ctl.mesh.drop(from, { type: TYPES.EVIDENCE }, `a relayed EVIDENCE of step ${ev.step + 1} whose gradient reproduced (only the accuser's own frame convicts it)`);
      continue;
    }
    b.evidenceSeen.add(key);
    // relayed once, so every honest member judges it even when the accuser told only one
    if (verdict === 'audited') ctl.tellAll(run, TYPES.EVIDENCE, { ...ev, runId: run.desc.runId, epoch: run.epoch }, run.roster.filter((id) => id !== accuser && id !== from));
    if (verdict === 'audited') convict(ctl, run, accused, ev.step, removalWords(ctl, run, accused, ev.step, ev));
    else convict(ctl, run, accuser, ev.step, `${ctl.host.nameOf(accuser)} accused ${ctl.host.nameOf(accused)} at step ${ev.step + 1}, whose gradient reproduced: ${ctl.host.nameOf(accuser)} removed`);
    return false;
  }
  return !run.ended && !run.recovery;
}

// evidence against a shard owner's reduce: this device asks the owner for the transcript itself
// (its own when it is that owner) and judges; no answer in time: the owner is gone. -> false
async function judgeOwner(ctl, run, b, from, ev, pairs, relayed) {
  const got = b.received.get(ev.step), key = evidenceKey(run.epoch, ev);
  if (run.collective.topology !== 'rsag' || !pairs || !pairs.some(([a, d]) => a === ev.accuser && d === ev.slot)
      || !got?.reduced || ev.committed !== sha256Hex(got.reduced[ev.slot])) {
    ctl.mesh.drop(from, { type: TYPES.EVIDENCE }, `EVIDENCE of step ${ev.step + 1} against a reduce that names no audit of it or another REDUCED`);
    return drainEvidence(ctl, run);
  }
  const owner = run.roster[ev.slot], accuser = run.roster[ev.accuser];
  const cleared = b.reproduced.has(key);            // a relay of it cleared the owner here already
  if (!cleared) {
    b.evidenceSeen.add(key);                         // (the owner answers the asks of its judges: transcriptOwed)
    // the owner first (it answers this device's ask only once it holds evidence against it), the
    // others once its reduce did not reproduce
    if (owner !== ctl.selfId && owner !== from && owner !== accuser) ctl.tellAll(run, TYPES.EVIDENCE, { ...ev, runId: run.desc.runId, epoch: run.epoch }, [owner]);
  }
  const epoch = run.epoch;
  const transcript = cleared ? null : await askTranscript(ctl, run, b, ev.step, ev.slot);
  if (run.book !== b || run.ended || run.epoch !== epoch) return false;     // (a roster change meanwhile: void, as above)
  if (!cleared && transcript === null) { noTranscript(ctl, run, owner, ev.step); return false; }
  const { reason } = cleared ? { reason: null } : ownerVerdict(run, b, ev.step, ev.slot, transcript);
  if (reason === null && relayed) {
    // cleared, in another member's words: only the accuser's own frame convicts it
    b.evidenceSeen.delete(key);
    b.reproduced.set(key, 'cleared');
    if (ev.slot !== run.slot) ctl.mesh.drop(from, { type: TYPES.EVIDENCE }, `a relayed EVIDENCE of step ${ev.step + 1} against a reduce that reproduced (only the accuser's own frame convicts it)`);
    return drainEvidence(ctl, run);
  }
  b.evidenceSeen.add(key);
  if (reason !== null) ctl.tellAll(run, TYPES.EVIDENCE, { ...ev, runId: run.desc.runId, epoch: run.epoch }, run.roster.filter((id) => id !== accuser && id !== from && id !== owner));
  if (reason !== null) convict(ctl, run, owner, ev.step, ownerWords(ctl, run, owner, ev.step, reason, ev.accuser));
  else convict(ctl, run, accuser, ev.step, `${ctl.host.nameOf(accuser)} accused the reduced shard of ${ctl.host.nameOf(owner)} at step ${ev.step + 1}, which reproduced: ${ctl.host.nameOf(accuser)} removed`);
  return false;
}

function removalWords(ctl, run, id, t, ev) {
  return `gradient from ${ctl.host.nameOf(id)} did not reproduce at step ${t + 1}: removed`
    + ` (committed ${ev.committed.slice(0, 16)}, recomputed ${ev.recomputed.slice(0, 16)} by ${ctl.host.nameOf(run.roster[ev.accuser])})`;
}

// ---- cheap checks (mesh_collective.js, on arrival) ------------------------------------------------
// A gradient of the wrong size or malformed convicts its sender at once; a non-finite one only
// when this device's own gradient of that step is finite (an honest run that diverged lies to
// nobody), so it waits for our local step when it came first.
export function onLie(ctl, collective, slot, step, lie) {
  const run = ctl.run;
  if (!run || run.collective !== collective) return;
  const id = collective.roster[slot];
  const why = `gradient from ${ctl.host.nameOf(id)} ${lie.why} at step ${step + 1}: removed`;
  if (!lie.nonFinite || run.ownFinite?.step === step) {
    if (!lie.nonFinite || run.ownFinite.finite) convict(ctl, run, id, step, why);
    return;
  }
  if (run.lies.length < run.roster.length) run.lies.push({ id, step, why });
  if (run.recovery) judgeHalted(ctl, run);
}

// a recovery halts the loop before our own local step of the lie's step: nothing will tell, so
// the lie counts (our replica is finite: it completed the steps before)
export function judgeHalted(ctl, run) {
  const lies = run.lies;
  run.lies = [];
  for (const x of lies) convict(ctl, run, x.id, x.step, x.why);
}

// the loop's local step of `step` is done: the verdict on non-finite gradients that came first
export function ownStep(ctl, run, step, local) {
  let finite = Number.isFinite(local.loss);
  for (const g of Object.values(local.grads)) {
    if (!finite) break;
    for (let i = 0; i < g.length; i++) if (!Number.isFinite(g[i])) { finite = false; break; }
  }
  run.ownFinite = { step, finite };
  const now = run.lies.filter((x) => x.step === step);
  run.lies = run.lies.filter((x) => x.step > step);
  if (finite) for (const x of now) convict(ctl, run, x.id, x.step, x.why);
}

// ---- conviction -----------------------------------------------------------------------------------
// `id` lied at step t (this device's own evidence): it is gone, and the group goes back to `back`
// It is gone at once (the run halts); its rollback is settled once this device ran the audits
// of every step before t (the reference's passes at that moment), which for a cheap check at the
// step in flight means the reveals still on their way (every member sends its last one when a
// recovery halts it). A convicted peer that withholds its reveals: after a while the steps it
// blocks count as not audited (settle).
export function convict(ctl, run, id, t, why) {
  const b = run.book;
  if (run.ended || id === ctl.selfId || !run.roster.includes(id)) return;
  if (!b) { ctl.convicted(run, id, why); return; }             // audits off: removed, nothing to go back to
  t = Math.min(t, run.completed);      // a lie in a frame of the step after ours: this device never completes the one before
  const had = b.convicted.get(id) || b.accused.get(id);
  if (had && had.step <= t) return;
  b.convicted.delete(id);
  b.accused.set(id, { step: t, why });
  ctl.host.note(why);
  ctl.convicted(run, id, why);
  settle(ctl, run);
  if (b.accused.size && run.recovery) advance(ctl, run).catch((err) => console.warn('daisy: an audit failed:', err));
}

// the accused whose rollback this device can compute now: convicted, and the recovery told
function settle(ctl, run) {
  const b = run.book;
  let changed = false;
  for (const [id, a] of [...b.accused]) {
    if (b.done < a.step - 1 || checkingEarlier(ctl, run, b, id, a)) continue;
    b.accused.delete(id);
    const back = rollbackFor(run, id, a.step);
    b.convicted.set(id, { step: a.step, why: a.why, back, hash: b.states.get(back)?.hash ?? null });
    ctl.host.emit('convicted', { peer: id, step: a.step + 1, why: a.why, back });
    changed = true;
  }
  if (changed) ctl.judged(run);
  // reveals withheld by the accused only: wait a while, then those steps count as not audited; at
  // once when every accused left for good (its LEAVE, or the server's word: nothing more comes)
  if (!b.accused.size) return;
  const left = [...b.accused.keys()].every((id) => run.confirmed.has(id) || ctl.serverGone.has(id));
  if (left) { clearTimeout(b.skipTimer); b.skipTimer = null; if (skipWithheld(ctl, run, b)) settle(ctl, run); return; }
  if (!b.skipTimer) {
    b.skipTimer = setTimeout(() => {
      b.skipTimer = null;
      if (run.book !== b || run.ended) return;
      skipWithheld(ctl, run, b);
      settle(ctl, run);
    }, run.collective.deadlineMs);
  }
}

// the steps before the accused's lies blocked only by the accused's missing AUDIT frames count as
// not audited. -> whether any did
function skipWithheld(ctl, run, b) {
  const accused = new Set(b.accused.keys()), from = b.done;
  const upTo = Math.max(...[...b.accused.values()].map((a) => a.step - 1));
  while (b.done < upTo && b.done + 1 < run.completed && missingFor(run, b.done + 1).every((id) => accused.has(id))) {
    ctl.host.note(`Step ${b.done + 2} is not audited: ${missingFor(run, b.done + 1).map((id) => ctl.host.nameOf(id)).join(', ')} withheld its audit frames.`);
    b.done += 1;
  }
  return b.done > from;
}

// The accused's audits before its lie whose verdicts may still come (another auditor's, within W
// steps): this device checks them itself, earliest first, before it settles the rollback (one
// that fails is the lie: the reference convicts at the first audit that fails). -> true while
// some are left to check
function checkingEarlier(ctl, run, b, id, a) {
  const slot = run.roster.indexOf(id);
  const left = [...b.pending.values()].filter((p) => p.slot === slot && p.t < a.step).sort((x, y) => x.t - y.t);
  if (!left.length) return false;
  if (b.checking) return true;
  const epoch = run.epoch;
  b.checking = (async () => {
    const void_ = () => run.book !== b || run.ended || run.epoch !== epoch;
    for (const p of left) {
      const got = await recompute(ctl, run, p.t, p.slot);
      if (got === null || void_()) return;
      if (got !== p.committed) {
        b.pending.delete(`${p.t}:${p.slot}`);
        convict(ctl, run, id, p.t, `gradient from ${ctl.host.nameOf(id)} did not reproduce at step ${p.t + 1}: removed (committed ${p.committed.slice(0, 16)}, recomputed ${got.slice(0, 16)} by this device)`);
        return;
      }
      if (run.collective.topology === 'rsag') {             // its reduce, as its auditor checks it
        const transcript = await askTranscript(ctl, run, b, p.t, p.slot);
        if (void_()) return;
        if (transcript === null) {           // withheld (asked once): that audit fails, as the auditor's would
          b.pending.delete(`${p.t}:${p.slot}`);
          convict(ctl, run, id, p.t, `${ctl.host.nameOf(id)} showed no transcript of step ${p.t + 1} in time: removed`);
          return;
        }
        const { reason } = ownerVerdict(run, b, p.t, p.slot, transcript);
        if (reason !== null) {
          b.pending.delete(`${p.t}:${p.slot}`);
          convict(ctl, run, id, p.t, ownerWords(ctl, run, id, p.t, reason, run.slot));
          return;
        }
      }
      b.pending.delete(`${p.t}:${p.slot}`);
    }
  })().catch((err) => console.warn('daisy: checking an audit failed:', err)).finally(() => {
    b.checking = null;
    if (run.book === b && !run.ended) settle(ctl, run);
  });
  return true;
}

// rollbackStep over this device's passes as the reference keeps them at the conviction: only the
// audits of steps before t count (later ones were recorded here before the evidence came)
function rollbackFor(run, id, t) {
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

// ---- a departure is a barrier (docs/PROTOCOL.md "Audited gradients": nothing unaudited outlives it)
// Before the roster drops a departing peer (LEAVE, closed link, deadline, the server's word), this
// device recomputes every contribution of its since its last settled pass (or the book's floor,
// or the last rollback) from its own kept states, earliest first, and compares it with the bytes
// and loss it received from that peer at that step (its own evidence, no commitment needed: a
// peer that withholds its AUDIT frames is checked all the same). One that does not reproduce
// convicts it (a rollback as an audit's); meanwhile STATUS names it unsettled, so the acting
// leader waits. Cost: one local step per step since that pass, on every survivor.
export function checkDeparture(ctl, run, id) {
  const b = run.book;
  if (!b || run.ended || id === ctl.selfId || !run.roster.includes(id) || b.departing.has(id) || b.accused.has(id) || b.convicted.has(id)) return;
  const slot = run.roster.indexOf(id), epoch = run.epoch, from = checkedFrom(run, id), upTo = run.completed;
  b.departing.set(id, { from, upTo });
  const void_ = () => run.ended || run.book !== b || run.epoch !== epoch || !b.departing.has(id);
  (async () => {
    for (let u = from; u < upTo; u++) {
      const got = b.received.get(u);
      if (!got || !b.states.has(u)) { ctl.host.note(`Cannot check step ${u + 1} of ${ctl.host.nameOf(id)}, which left: its state is no longer kept here.`); continue; }
      const mine = await recompute(ctl, run, u, slot, null, null, true);
      if (mine === null || void_()) return;
      if (mine.hash !== got.inHashes[slot] || !Object.is(mine.loss, got.losses[slot])) {
        b.departing.delete(id);
        convict(ctl, run, id, u, `gradient from ${ctl.host.nameOf(id)} did not reproduce at step ${u + 1}: removed (checked when it left; received ${got.inHashes[slot].slice(0, 16)}, recomputed ${mine.hash.slice(0, 16)})`);
        return;
      }
      b.pending.delete(`${u}:${slot}`);
    }
    if (void_()) return;
    b.departing.delete(id);
    ctl.judged(run);
  })().catch((err) => console.warn('daisy: checking a departure failed:', err));
}

// ---- a run's end is a barrier too (docs/PROTOCOL.md "Audited gradients"; loop.js finishBarrier)
// Every member ran the audits it owes (flush) and sent FIN; then this device recomputes every other
// member's contributions since its last settled pass (a pass whose auditor sent its FIN of this
// epoch and step is settled: that auditor ran every audit it owed, and its evidence came first on
// the same ordered link), earliest step first, slots in order at a step, against the bytes and
// loss it received; the first that does not reproduce convicts its sender with an audit's
// rollback (the reference's AuditedRun.finish). Cost: one local step per contribution since its
// sender's last settled pass (about (P - 1)/q at rate q), at each end. -> true when all reproduced
export async function checkEnd(ctl, run) {
  const b = run.book;
  if (!b) return true;
  const epoch = run.epoch, void_ = () => run.ended || run.book !== b || run.epoch !== epoch || run.recovery !== null;
  // this device's judgements first (evidence it holds, a conviction's earlier audits)
  const judging = () => b.accused.size > 0 || b.checking !== null || b.evidence.some(({ ev }) => ev.step <= b.done);
  while (judging() && !void_()) await waitUntil(() => !judging() || void_(), GATE_LOOK_MS, (wake) => ctl.onPoke(wake));
  if (void_()) return false;
  const finished = (slot) => {
    const f = run.fins.get(run.roster[slot]);
    return slot === run.slot || (f && f.epoch === run.epoch && f.step === run.completed);
  };
  for (const [key, p] of [...b.pending]) if (finished(p.auditor)) b.pending.delete(key);
  const others = run.roster.map((id, slot) => ({ id, slot, from: checkedFrom(run, id) })).filter(({ slot }) => slot !== run.slot);
  for (let u = Math.min(run.completed, ...others.map((x) => x.from)); u < run.completed; u++) {
    const got = b.received.get(u);
    for (const { id, slot, from } of others) {
      if (u < from) continue;
      if (!got || !b.states.has(u)) { ctl.host.note(`Cannot check step ${u + 1} of ${ctl.host.nameOf(id)} at the run's end: its state is no longer kept here.`); continue; }
      const mine = await recompute(ctl, run, u, slot, null, null, true);
      if (mine === null || void_()) return false;
      if (mine.hash !== got.inHashes[slot] || !Object.is(mine.loss, got.losses[slot])) {
        convict(ctl, run, id, u, `gradient from ${ctl.host.nameOf(id)} did not reproduce at step ${u + 1}: removed (checked at the run's end; received ${got.inHashes[slot].slice(0, 16)}, recomputed ${mine.hash.slice(0, 16)})`);
        return false;
      }
    }
  }
  return !void_();
}

// the first step of `id`'s contributions not covered by a settled pass: after its latest pass by an
// auditor never convicted whose verdict is in, the book's floor or the last rollback
function checkedFrom(run, id) {
  const b = run.book, slot = run.roster.indexOf(id);
  const settled = new Map([[null, b.floor]]);
  for (const [auditor, steps] of b.passes.get(id) || []) {
    const ok = steps.filter((x) => !b.pending.has(`${x - 1}:${slot}`));
    if (ok.length) settled.set(auditor, ok[ok.length - 1]);
  }
  return Math.max(b.floor, b.since, trustedStep(settled, new Set(b.excludedFrom.keys())));
}

// the oldest step a departure's barrier may need (the states and received bytes kept from it on)
function barrierFloor(run) {
  return Math.min(run.completed, ...run.roster.filter((_, slot) => slot !== run.slot).map((id) => checkedFrom(run, id)));
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
  b.evidence = [];
  b.reproduced.clear();
  return st.hash;
}

function alarmSplit(ctl, run, message) {
  alarm(ctl, run, message, 'split alarm');
}
