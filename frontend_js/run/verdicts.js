// Every verdict of the audits (run/audits.js has the overview), in one module because they call
// one another: a step's audits drawn (auditStep: commitments checked, the beacon, the pairs, the
// passes), the auditor's recomputations run and judged (work, checkAudit, checkOwner), a member's
// evidence judged (drainEvidence, judgeOwner), a conviction and its rollback settled (convict,
// settle, checkingEarlier). A conviction while a recovery parks the loop audits the frames still
// waiting (advance), which may judge more evidence and convict again.
// Imports: audit_book.js, audit_recompute.js, transcripts.js, rollback.js; the controller's
// ctl.convicted / ctl.judged / ctl.peerGone carry a verdict to the membership modules.
// Exports: auditStep, work, drainEvidence, convict, advance, drawUpTo, owedOnceDrawn, evidenceKey, alarmSplit.
import { TYPES } from '../mesh/frames.js';
import { waitUntil } from '../page_clock.js';
import { AUDIT_WINDOW, auditLoad, auditPairs, beacon, checkStartState, judge, slotDigest, Evidence } from '../audit.js';
import { toHex, fromHex } from '../hashing.js';
import { alarm } from './ending.js';
import { sha256Hex, keepState, recordPass, missingFor, nextExchange, prevExchange, roundIndex, GATE_LOOK_MS } from './audit_book.js';
import { AuditVoid, recompute } from './audit_recompute.js';
import { askTranscript, ownerVerdict, ownerWords, noTranscript } from './transcripts.js';
import { askRoundState } from './round_states.js';
import { rollbackFor } from './rollback.js';

export const evidenceKey = (epoch, ev) => `${epoch}:${ev.step}:${ev.slot}:${ev.accuser}`;

export function alarmSplit(ctl, run, message) {
  alarm(ctl, run, message, 'split alarm');
}

// what a slot contributes, in the panel's words: its gradient of a step, or its round of local steps
export const unitOf = (run) => (run.book.span > 1 ? 'round of' : 'gradient from');

// step t's audits (local steps: of the round ending at t): check what this device received against
// each slot's commitment, the beacon, the pairs; record each audit as a pass; recompute the ones
// this device audits
export async function auditStep(ctl, run, t) {
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
      convict(ctl, run, id, t, `${unitOf(run)} ${h.nameOf(id)} did not reproduce at step ${t + 1} (its nonce does not match its commitment): removed`);
      return false;
    }
    // (local steps: roundDigest, the state hash after the messages' hashes)
    digests.push(slotDigest(t, slot, c.loss, [...c.hashes, ...(c.stateHash ? [c.stateHash] : [])].map(fromHex)));
    nonces.push(fromHex(reveals.get(slot)));
  }
  const beaconBytes = beacon(digests, nonces);
  b.beacons.set(t, toHex(beaconBytes));
  const k = roundIndex(run.cfg, t);                 // the loads count rounds (per step: steps)
  const pairs = auditPairs(run.cfg.seed, t, P, b.rate, beaconBytes, auditLoad(b.assigned, k, P));
  b.pairs.set(t, pairs);
  b.assigned.set(k, pairs.map(([auditor]) => auditor));
  b.digests.set(t, digests.map(toHex));
  b.shardHashes.set(t, Array.from({ length: P }, (_, slot) => commits.get(slot).hashes));
  if (b.span > 1) b.stateHashes.set(t, Array.from({ length: P }, (_, slot) => commits.get(slot).stateHash));
  // an ask of this device's transcript or round state waiting for these pairs is owed now: it is
  // answered at once (its auditor, who drew them first, may wait for it before its next exchange)
  ctl.poke();
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
      const item = { t, audited, committed, epoch: run.epoch, batch, done: 0, release: null, admitting: null, inflight: 0, end: null, stateReady: b.span === 1 };
      b.queued.push(item);
      // local steps: its state at the round's start, asked for now (one ask). It may take longer
      // than an exchange to come (26.5 MB at the largest settings behind a 10 Mbit/s uplink): the
      // ask waits half the verdict window in rounds, and at least the exchange deadline
      if (b.span > 1) askRoundState(ctl, run, b, t, audited, audited, auditStateWait(run, t)).then(() => { item.stateReady = true; ctl.poke(); });
    }
  }
  return drainEvidence(ctl, run);
}

// how long an auditor waits for the audited slot's round state: until half the verdict window has
// passed (W/2 rounds after the audited exchange t; at the run's end or a stop, no later than there)
// and the exchange deadline too
function auditStateWait(run, t) {
  const t0 = performance.now(), due = t + (AUDIT_WINDOW / 2) * run.cfg.local_steps;
  return () => (run.finishing || run.completed >= Math.min(due, run.cfg.steps, run.stopAfter ?? Infinity))
    && performance.now() - t0 >= run.collective.deadlineMs;
}

// the queue's worker: one recomputation at a time, in deadline order among those whose round state
// is here (local steps: an audit waits for the audited slot's state without holding up the others);
// each judged when it ends, a failed one is evidence to every member
export function work(ctl, run, b) {
  if (b.working || !b.queued.length) return;
  b.working = (async () => {
    while (b.queued.length && run.book === b && !run.ended) {
      const item = b.queued.find((a) => a.stateReady);
      if (!item) { await waitUntil(() => b.queued.some((a) => a.stateReady) || !b.queued.length || run.book !== b || run.ended, GATE_LOOK_MS, (wake) => ctl.onPoke(wake)); continue; }
      try {
        await checkAudit(ctl, run, b, item);
      } catch (err) {
        if (!(err instanceof AuditVoid)) console.warn('daisy: an audit failed:', err);
      }
      const i = b.queued.indexOf(item);
      if (i >= 0) b.queued.splice(i, 1);
      ctl.poke();
    }
  })().finally(() => { b.working = null; });
}

async function checkAudit(ctl, run, b, item) {
  const { t, audited, committed, epoch, batch } = item;
  const void_ = () => run.ended || run.book !== b || run.epoch !== epoch;   // rolled back or restarted meanwhile
  if (void_()) return;
  const got = await recomputeUnit(ctl, run, b, t, audited, batch, item);
  if (got === null || void_()) return;
  const recomputed = got.digest;
  if (recomputed === committed) {
    if (run.collective.topology === 'rsag') await checkOwner(ctl, run, b, t, audited, epoch);
    if (void_()) return;
    b.pending.delete(`${t}:${audited}`);
    // local steps: the state it committed to at the next round start, which a departure's barrier starts from
    if (item.end) b.passedStates.set(run.roster[audited], { at: t + 1, adam: item.end });
    return;
  }
  const ev = { runId: run.desc.runId, epoch: run.epoch, step: t, slot: audited, accuser: run.slot, committed, recomputed };
  ctl.tellAll(run, TYPES.EVIDENCE, ev);
  b.evidenceSeen.add(evidenceKey(run.epoch, ev));
  convict(ctl, run, run.roster[audited], t, got.broken ? chainWords(ctl, run, run.roster[audited], t, run.slot) : removalWords(ctl, run, run.roster[audited], t, ev));
}

// The digest of `slot`'s contribution at t, recomputed here -> {digest (hex), broken} or null (void:
// its state is no longer kept, or the slot did not show its state in time: gone). Local steps: from
// its Adam state at the round's start (ROUND_STATE), checked first against the state hash it
// committed to with its round before (or the one every device knows at the floor); a state that
// does not hash to it breaks the chain, evidence by itself: broken, with a digest that is no
// commitment. The audit, a judge and a conviction's earlier audits all recompute through here
async function recomputeUnit(ctl, run, b, t, slot, batch = null, item = null) {
  if (b.span === 1) {
    const digest = await recompute(ctl, run, t, slot, batch, item);
    return digest === null ? null : { digest, broken: false };
  }
  const adam = await askRoundState(ctl, run, b, t, slot);
  if (run.book !== b || run.ended) return null;
  if (adam === null) {
    ctl.host.note(`No Adam state of the round ending at step ${t + 1} from ${ctl.host.nameOf(run.roster[slot])} in time.`);
    ctl.peerGone(run.roster[slot], `no round state of step ${t + 1} in time`);
    return null;
  }
  const chain = b.stateHashes.get(prevExchange(run.cfg, t))?.[slot];
  if (!chain) { ctl.host.note(`Cannot check the round ending at step ${t + 1}: the state hash it starts from is no longer kept here.`); return null; }
  if (checkStartState(adam, fromHex(chain)) !== null) return { digest: sha256Hex(fromHex(chain)), broken: true };
  const digest = await recompute(ctl, run, t, slot, batch, item, false, adam);
  return digest === null ? null : { digest, broken: false };
}

function chainWords(ctl, run, id, t, auditor) {
  return `round of ${ctl.host.nameOf(id)} did not reproduce at step ${t + 1}: removed (its Adam state at the round's start is not the one it committed to; audited by ${ctl.host.nameOf(run.roster[auditor])})`;
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

function removalWords(ctl, run, id, t, ev) {
  return `${unitOf(run)} ${ctl.host.nameOf(id)} did not reproduce at step ${t + 1}: removed`
    + ` (committed ${ev.committed.slice(0, 16)}, recomputed ${ev.recomputed.slice(0, 16)} by ${ctl.host.nameOf(run.roster[ev.accuser])})`;
}

// the evidence this device can judge now (its own audits of that step done). -> false when a
// conviction halted the run
export async function drainEvidence(ctl, run) {
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
    const got = b.reproduced.has(key) ? { digest: b.reproduced.get(key), broken: false } : await recomputeUnit(ctl, run, b, ev.step, ev.slot);
    // a roster change while it recomputed (a conviction's rollback applied) voids the evidence: read
    // against the new roster, its slots would convict a peer it never named
    if (got === null || run.book !== b || run.ended || run.epoch !== epoch) return false;
    const reproduced = got.digest;
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
    if (verdict === 'audited') convict(ctl, run, accused, ev.step, got.broken ? chainWords(ctl, run, accused, ev.step, ev.accuser) : removalWords(ctl, run, accused, ev.step, ev));
    else convict(ctl, run, accuser, ev.step, `${ctl.host.nameOf(accuser)} accused ${ctl.host.nameOf(accused)} at step ${ev.step + 1}, whose ${b.span > 1 ? 'round' : 'gradient'} reproduced: ${ctl.host.nameOf(accuser)} removed`);
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

// ---- conviction -----------------------------------------------------------------------------------
// `id` lied at step t (this device's own evidence): it is gone, and the group goes back to `back`
// It is gone at once (the run halts); its rollback is settled once this device ran the audits
// of every step before t (the reference's passes at that moment), which for a cheap check at the
// step in flight means the reveals still on their way (every member sends its last one when a
// recovery halts it). A convicted peer that withholds its reveals: after a while the steps it
// blocks count as not audited (settle).
export function convict(ctl, run, id, t, why, checked = false) {
  const b = run.book;
  if (run.ended || id === ctl.selfId || !run.roster.includes(id)) return;
  if (!b) { ctl.convicted(run, id, why); return; }             // audits off: removed, nothing to go back to
  t = Math.min(t, run.completed);      // a lie in a frame of the step after ours: this device never completes the one before
  const had = b.convicted.get(id) || b.accused.get(id);
  if (had && had.step <= t) return;
  b.convicted.delete(id);
  b.accused.set(id, { step: t, why, checked });
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
    if (b.done < prevExchange(run.cfg, a.step) || checkingEarlier(ctl, run, b, id, a)) continue;
    b.accused.delete(id);
    const back = rollbackFor(run, id, a.step);
    b.convicted.set(id, { step: a.step, why: a.why, back, hash: b.states.get(back)?.hash ?? null, checked: a.checked });
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
  const upTo = Math.max(...[...b.accused.values()].map((a) => prevExchange(run.cfg, a.step)));
  const next = () => nextExchange(run.cfg, b.done);
  while (b.done < upTo && next() < run.completed && missingFor(run, next()).every((id) => accused.has(id))) {
    ctl.host.note(`Step ${next() + 1} is not audited: ${missingFor(run, next()).map((id) => ctl.host.nameOf(id)).join(', ')} withheld its audit frames.`);
    b.done = next();
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
      const got = await recomputeUnit(ctl, run, b, p.t, p.slot);
      if (got === null || void_()) return;
      if (got.digest !== p.committed) {
        b.pending.delete(`${p.t}:${p.slot}`);
        convict(ctl, run, id, p.t, got.broken ? chainWords(ctl, run, id, p.t, run.slot)
          : `${unitOf(run)} ${ctl.host.nameOf(id)} did not reproduce at step ${p.t + 1}: removed (committed ${p.committed.slice(0, 16)}, recomputed ${got.digest.slice(0, 16)} by this device)`);
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

// the step whose audits this device draws next (local steps: the next round's exchange), if its
// frames are all here and it is at most upTo
const drawable = (run, b, upTo) => {
  const t = nextExchange(run.cfg, b.done);
  return t !== null && run.book === b && !run.ended && t <= upTo && t < run.completed && !missingFor(run, t).length;
};

// every step up to upTo whose frames are all here is drawn now (auditStep), earliest first, outside
// the loop's own catch-up (which checks b.done again after each wait: no step is drawn twice).
// -> false when a conviction or an alarm stopped it
export async function drawUpTo(ctl, run, upTo) {
  const b = run.book;
  while (drawable(run, b, upTo)) {
    if (!(await auditStep(ctl, run, nextExchange(run.cfg, b.done)))) return false;
  }
  return true;
}

// An ask of this device's transcript or round state of step t is owed once this device drew t's
// pairs (owed(): transcriptOwed). Its loop draws them two exchanges late, and may be held in an
// exchange that a member's recovery halted, while that member, halted, drew them from the frames
// (advance) and asked: so this device draws them itself as soon as their frames are here.
// A run that ended here draws nothing more, but an ask may still become owed there (the asker's
// FIN, which the ask follows, may come after it on links that reorder). -> whether it became owed within ms
export async function owedOnceDrawn(ctl, run, b, t, owed, ms) {
  const until = performance.now() + ms;
  let drawing = true;          // (a draw stopped by a conviction or an alarm is not tried again: no spin)
  for (;;) {
    if (owed()) return true;
    if (run.book !== b) return false;
    if (drawing && drawable(run, b, t)) { drawing = await drawUpTo(ctl, run, t); continue; }
    const left = until - performance.now();
    if (left <= 0) return false;
    const ready = () => owed() || run.book !== b || (drawing && drawable(run, b, t));
    if (!(await waitUntil(ready, left, (wake) => ctl.onPoke(wake)))) return owed();
  }
}

// Outside the loop (a recovery parks it): every step whose frames are all here is audited now,
// then the evidence waiting for it is judged (a member must judge evidence while it is halted)
export async function advance(ctl, run) {
  const b = run.book;
  if (!(await drawUpTo(ctl, run, Infinity))) return;
  if (run.book !== b) return;
  // an accused that left for good: the steps blocked only by its withheld frames are skipped once
  // every other member's frames of them are here, which may be after the conviction (settle)
  if (b.accused.size) settle(ctl, run);
  work(ctl, run, b);
  await drainEvidence(ctl, run);
}
