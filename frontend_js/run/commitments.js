// Commitments, nonces and the beacon over the mesh (docs/PROTOCOL.md "Audited gradients";
// run/audits.js has the overview): after each exchange this device commits to what it sent and
// reveals its previous nonce (AUDIT), then the audits two steps back run once every member's
// frames of them are here (catchUp); at the run's end the last nonce goes out alone and the
// last steps are audited before FIN (flush). A member's AUDIT is checked and kept (onAudit).
// Imports: audit_book.js, verdicts.js (auditStep, advance, work). Exports: afterExchange, flush,
// revealLast, onAudit.
import { TYPES } from '../mesh/frames.js';
import { waitUntil } from '../page_clock.js';
import { AUDIT_WINDOW, adamStateHash, referenceNonce } from '../audit.js';
import { toHex } from '../hashing.js';
import { isHash } from './record.js';
import { sha256Hex, VERDICT_STEPS, barrierFloor, missingFor, exchangeAt, nextExchange, prevExchange, roundIndex } from './audit_book.js';
import { alarmSplit, auditStep, work, advance } from './verdicts.js';

// ---- after each exchange: commit, then the audits two exchanges back ------------------------------
// (local steps: exchanges end rounds; each commitment also names this device's Adam state at the
// round's end, the state its next round starts from: docs/VERIFICATION.md §13 "Rounds of local steps")
// out: the exchange's result (ownHashes, inHashes, losses). -> false when a conviction halted the run
export async function afterExchange(ctl, run, s, out, loss) {
  const b = run.book;
  if (!b) return true;
  b.received.set(s, { inHashes: out.inHashes, losses: out.losses, transcript: out.transcript, reduced: out.reduced });
  const nonce = ctl.faults.referenceNonces ? referenceNonce(run.cfg.seed, s, run.slot) : crypto.getRandomValues(new Uint8Array(32));
  b.nonces.set(s, nonce);
  const stateHash = b.span > 1 ? toHex(adamStateHash(run.replica.adam)) : null;
  commitOwn(ctl, run, s, { hashes: out.ownHashes, loss, nonceHash: sha256Hex(nonce), stateHash });
  if (!withholding(ctl, s)) sendAudit(ctl, run, s, out.ownHashes, loss, sha256Hex(nonce), stateHash);
  return catchUp(ctl, run, prevExchange(run.cfg, prevExchange(run.cfg, s)));
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

function sendAudit(ctl, run, s, hashes, loss, nonceHash, stateHash) {
  const b = run.book, p = revealed(run.cfg, s, false);
  const prev = b.nonces.get(p);
  const msg = { runId: run.desc.runId, epoch: run.epoch, step: s, hashes, loss, nonceHash, stateHash,
                reveal: prev && p >= b.floor ? toHex(prev) : null, beacon: b.beacons.get(prevExchange(run.cfg, p)) || null };
  ctl.tellAll(run, TYPES.AUDIT, msg);
}

// the exchange whose nonce an AUDIT of step s reveals: the exchange before s; a tail AUDIT (no
// commitment, step = the last exchange + 1) reveals the step before it. Its beacon is of the
// exchange before that one
const revealed = (cfg, s, tail) => (tail ? s - 1 : prevExchange(cfg, s));

// the nonce of the last step this device committed to, in a tail AUDIT (once): at the run's end,
// and when a recovery halts the loop (the audits of the steps before a lie need every reveal)
export function revealLast(ctl, run) {
  const b = run.book;
  if (!b || !b.nonces.size) return;
  const last = Math.max(...b.nonces.keys()), s = last + 1;
  if (b.tailSent.has(`${run.epoch}:${s}`) || withholding(ctl, s)) return;
  b.tailSent.add(`${run.epoch}:${s}`);
  ctl.tellAll(run, TYPES.AUDIT, { runId: run.desc.runId, epoch: run.epoch, step: s, hashes: null, loss: null, nonceHash: null, stateHash: null,
                                  reveal: toHex(b.nonces.get(last)), beacon: b.beacons.get(prevExchange(run.cfg, last)) || null });
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

// every audit up to step `upTo` (waiting for the frames it needs, within the deadline)
async function catchUp(ctl, run, upTo) {
  const b = run.book;
  while (b.done < upTo && run.book === b && !run.ended && !run.recovery) {
    const t = nextExchange(run.cfg, b.done);
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
      b.undrawn.add(t);
      b.done = t;
      continue;
    }
    if (!ok) {
      const ids = missing();
      ctl.host.note(`No audit commitment of step ${t + 1} from ${ids.map((id) => ctl.host.nameOf(id)).join(', ')} in time.`);
      for (const id of ids) ctl.peerGone(id, `no audit commitment of step ${t + 1} in time`);
      return false;
    }
    if (b.done >= t) continue;        // drawn meanwhile (an ask of a member: verdicts.js owedOnceDrawn)
    if (!(await auditStep(ctl, run, t))) return false;
  }
  return !run.ended && !run.recovery;
}

// ---- frames ---------------------------------------------------------------------------------------
export function onAudit(ctl, from, m) {
  const run = ctl.at, d = m.json, b = run.book;
  const slot = run.roster.indexOf(from);
  if (!b || d.runId !== run.desc.runId || slot < 0 || !Number.isInteger(d.epoch) || !Number.isInteger(d.step)) { ctl.mesh.drop(from, m, 'AUDIT for no audited run of ours'); return; }
  if (d.epoch < run.epoch) { lateChain(run, b, slot, d); return; }   // a late frame of an epoch this device left
  const cfg = run.cfg, tail = d.hashes === null;
  // a commitment is of an exchange step (every step, or a round's last); a tail AUDIT is of the step after one
  const atExchange = d.step - (tail ? 1 : 0) >= 0 && exchangeAt(cfg, d.step - (tail ? 1 : 0)) === d.step - (tail ? 1 : 0);
  if (d.epoch > run.epoch + 1 || d.step < b.floor || d.step > run.completed + 3 * b.span || !atExchange) { ctl.mesh.drop(from, m, `AUDIT of step ${d.step} in epoch ${d.epoch}, this device is at ${run.completed} in epoch ${run.epoch}`); return; }
  const m1 = run.collective.topology === 'allgather' ? 1 : run.roster.length;
  // (local steps: the commitment names the sender's Adam state at its round's end; per step none)
  const stateOk = tail || b.span === 1 ? d.stateHash === null || d.stateHash === undefined : isHash(d.stateHash);
  if (!tail && (!Array.isArray(d.hashes) || d.hashes.length !== m1 || !d.hashes.every(isHash) || !isHash(d.nonceHash) || typeof d.loss !== 'number' || !stateOk)) {
    ctl.mesh.drop(from, m, 'AUDIT with a malformed commitment'); return;
  }
  if ((d.reveal !== null && !isHash(d.reveal)) || (d.beacon !== null && !isHash(d.beacon))) { ctl.mesh.drop(from, m, 'AUDIT with a malformed nonce or beacon'); return; }
  // the frame's epoch: a roster that may be committed a moment later here (its slots are the new ones)
  const epoch = d.epoch;
  if (!tail) {
    // one per step: a repeat is a bad frame, also once the step is audited (its commitments pruned)
    const commits = commitsOf(b, epoch, d.step);
    if (commits.has(slot) || d.step < prevExchange(cfg, b.done)) { ctl.mesh.drop(from, m, `a repeated AUDIT of step ${d.step}`); return; }
    commits.set(slot, { hashes: d.hashes, loss: d.loss, nonceHash: d.nonceHash, stateHash: b.span > 1 ? d.stateHash : null });
  }
  const p = revealed(cfg, d.step, tail), q = prevExchange(cfg, p);
  if (d.reveal !== null && p >= b.floor) {
    const key = `${epoch}:${p}`;
    if (!b.reveals.has(key)) b.reveals.set(key, new Map());
    if (!b.reveals.get(key).has(slot)) b.reveals.get(key).set(slot, d.reveal);
  }
  if (d.beacon !== null) {
    const key = `${epoch}:${q}`;
    const known = b.beacons.get(q);
    if (epoch === run.epoch && known && known !== d.beacon) { alarmSplit(ctl, run, `Split alarm at step ${q + 1}: ${ctl.host.nameOf(from)} saw other commitments of that step. Stopped (never fork).`); return; }
    if (!b.claimedBeacons.has(key)) b.claimedBeacons.set(key, new Map());
    b.claimedBeacons.get(key).set(slot, d.beacon);
  }
  pruneFrames(run);
  ctl.poke();
  if (run.recovery) advance(ctl, run).catch((err) => console.warn('daisy: an audit failed:', err));
}

// local steps: a survivor's AUDIT of the exchange before the book's floor, come after the roster
// changed: its state hash starts its chain in the new epoch (audit_book.js carryChain), if not known yet
function lateChain(run, b, slot, d) {
  const h = b.span > 1 && d.epoch === b.chainEpoch && d.step === b.floor - 1 ? b.stateHashes.get(d.step) : null;
  if (h && h[slot] === null && isHash(d.stateHash)) h[slot] = d.stateHash;
}

// frames older than the audits done, or of epochs this device left, go (windows of W units: W x span steps)
function pruneFrames(run) {
  const b = run.book, cfg = run.cfg, old = b.done - VERDICT_STEPS * b.span;
  for (const map of [b.commits, b.reveals, b.claimedBeacons]) {
    for (const key of [...map.keys()]) {
      const [e, st] = key.split(':').map(Number);
      if (e < run.epoch || st < prevExchange(cfg, b.done)) map.delete(key);
    }
  }
  for (const map of [b.nonces, b.beacons, b.pairs, b.digests, b.shardHashes]) for (const st of [...map.keys()]) if (st < old) map.delete(st);
  // (a state hash lives as long as the state after it: a rollback there starts the next round's chain)
  for (const st of [...b.stateHashes.keys()]) if (st < old && !b.states.has(st + 1)) b.stateHashes.delete(st);
  for (const k of [...b.assigned.keys()]) if (k < roundIndex(cfg, b.done) - VERDICT_STEPS) b.assigned.delete(k);     // (by round index)
  const keep = Math.min(old, barrierFloor(run));              // a departure's barrier reads these
  for (const st of [...b.received.keys()]) if (st < keep) b.received.delete(st);
  for (const map of [b.transcripts, b.asked, b.roundStates, b.stateAsked]) for (const key of [...map.keys()]) if (Number(key.split(':')[1]) < old) map.delete(key);   // epoch:step:owner
  for (const key of [...b.reproduced.keys()]) if (Number(key.split(':')[1]) < old) b.reproduced.delete(key);   // epoch:step:slot:accuser
  for (const set of [b.answered, b.stateAnswered]) for (const key of [...set]) if (Number(key.split(':').at(-1)) < old) set.delete(key);          // asker:epoch:step
  // a pending pass whose auditor's evidence would be here by now (sent by step t + W, before that
  // auditor's gradient of t + W + 1 on the same ordered link) is a pass
  for (const [key, p] of [...b.pending]) if (p.t < b.done - (AUDIT_WINDOW + 1) * b.span) b.pending.delete(key);
}
