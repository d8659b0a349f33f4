// Departures and failover (docs/ARCHITECTURE.md "Membership", docs/PROTOCOL.md "One lying
// member"; run/recovery.js has the overview): this device's own evidence that a peer left, the
// recovery it begins (HALT, STATUS), the acting leader's proposal of the survivors' roster once
// every member it counts told its position (tryFinish), and the stop when there is no safe way on
// (giveUp). Frames: HALT, STATUS, LEAVE.
// Imports: roster_apply.js, and of the audits audit_barriers.js (a departure's barrier),
// rollback.js (the convictions), commitments.js (revealLast), evidence.js (judgeHalted).
// Exports: evidence, reaches, reachMs, ending, beginRecovery, awaitRecovery, tellStatus,
// sendStatus, tryFinish, answersTimeout, giveUp, onHalt, onStatus, onLeave.
import { TYPES } from '../mesh/frames.js';
import { ExchangeError } from '../mesh/mesh_collective.js';
import { actingLeader, mayGoOn, scheduleWith, scheduleLocal, leftSlots, rosterDigest } from '../mesh/roster.js';
import { Recovery, RosterChange, isHash } from './record.js';
import { end, restoreUndo, position, positionHash, roundEnd, toRoundStart } from './ending.js';
import { checkDeparture } from './audit_barriers.js';
import { convictions, standing, convictionsKey, convictedIds, rollbackTo, goBack } from './rollback.js';
import { revealLast } from './commitments.js';
import { judgeHalted } from './evidence.js';
import { voidChange, maybeCommit, applyRoster } from './roster_apply.js';

const goneSet = (run) => new Set(run.gone.keys());
// STATUS `gone`: the peers this device lost; the ones it convicted go in `convicted` (their own evidence)
const lostClaims = (run) => { const c = new Set(convictedIds(run)); return [...run.gone.keys()].filter((id) => !c.has(id)); };
const live = (run) => run.roster.filter((id) => !run.gone.has(id));
// the run is at its end's barrier and this device convicted nobody: only a conviction changes the
// roster now (a HALT, STATUS or plain ROSTER is not followed: a liar's must not remove anyone, and
// an honest member's conviction is this device's own too once it judged the same evidence)
export const ending = (run) => run.finishing && !convictedIds(run).length;

// ---- evidence ---------------------------------------------------------------------------------
// This device's own evidence that `id` left (confirmed: the peer said so itself).
export function evidence(ctl, run, id, why, confirmed = false) {
  if (!run || run.ended || id === ctl.selfId) return;
  if (confirmed) run.confirmed.add(id);
  if (ending(run) && !convictedIds(run).includes(id)) {
    // the run ends here (the end's barrier, loop.js): a departure changes no roster, its steps are
    // checked with every member's (audit_barriers.js checkEnd) and nobody waits for its FIN
    if (run.roster.includes(id) && !run.gone.has(id)) run.gone.set(id, why);
    ctl.poke();
    return;
  }
  run.joiners.delete(id);
  if (!run.roster.includes(id)) {
    // a joiner named by a planned change: the change is void (it would wait for its answer)
    if (run.change && run.change.msg.roster.includes(id)) voidChange(ctl, run, `${ctl.host.nameOf(id)} left before it joined`);
    return;
  }
  // (gone with no recovery under way: it left while the run ended, or a Stop cut its recovery short)
  if (run.gone.has(id)) { if (run.recovery) tryFinish(ctl, run); else beginRecovery(ctl, run); return; }
  run.gone.set(id, why);
  checkDeparture(ctl, run, id);   // a barrier: its unaudited steps are checked before the roster drops it
  beginRecovery(ctl, run);
}

// Whether this device can vouch that `id` is here: its link is up, it has no evidence against it,
// and it heard from it within a deadline (reachMs).
export const reachMs = (ctl, run) => ctl.t.reachMs ?? run.collective.deadlineMs;
export function reaches(ctl, run, id) {
  const heard = run.heard.get(id);
  return !run.gone.has(id) && ctl.mesh.isReady(id) && heard !== undefined && performance.now() - heard < reachMs(ctl, run);
}

// Another member acts on a departure this device has no evidence of: the peers senior to
// `upTo` that this device cannot vouch for become its own evidence (their silence is its own
// observation). -> false when it still reaches one of them (then it does not follow).
function adoptSilence(ctl, run, upTo, claimant) {
  const seniors = run.roster.slice(0, run.roster.indexOf(upTo)).filter((id) => !run.gone.has(id));
  if (seniors.includes(ctl.selfId) || seniors.some((id) => reaches(ctl, run, id))) return false;
  for (const id of seniors) run.gone.set(id, `silent here, and ${ctl.host.nameOf(claimant)} acts on its departure`);
  return true;
}

export function beginRecovery(ctl, run) {
  const h = ctl.host;
  const rec = run.recovery || (run.recovery = new Recovery(run.epoch + 1));
  // the step in flight and a planned roster change are void: the acting leader decides
  run.collective.fail(new ExchangeError('the roster is changing'));
  revealLast(ctl, run);           // the audits of the steps before a lie need every nonce
  judgeHalted(ctl, run);          // a non-finite gradient waiting for our own step's verdict
  voidChange(ctl, run, '');
  run.joiners.clear();            // joiners ask again once the group trains on
  rec.leader = actingLeader(run.roster, goneSet(run));
  // new evidence: this device's own proposal in the making is void (it will not commit it), and
  // so is one from a proposer this device now has evidence against (it cannot commit it any
  // more); a roster accepted from a proposer still here stays accepted until a later epoch
  // replaces it (its leader may commit it: dropping it here would leave this device behind)
  const proposer = rec.promised?.msg.roster[0];
  if (rec.promised && !rec.promised.committed && (proposer === ctl.selfId || run.gone.has(proposer))) {
    ctl.dispose(rec.promised.collective);
    clearTimeout(rec.promised.timer);
    rec.promised = null;
  }
  const names = [...run.gone].map(([id, why]) => `${h.nameOf(id)} (${why})`).join(', ');
  const local = run.cfg.local_steps > 1;       // (local steps: the round is redone from its start, docs/VERIFICATION.md "Local steps")
  h.show({ message: names
    ? `${names} left at step ${run.completed + 1}; the group recomputes ${local ? `the round from step ${position(run) + 1}` : 'that step'} without ${run.gone.size > 1 ? 'them' : 'it'}…`
    : `The group halted step ${run.completed + 1} to check its roster…` });
  if (rec.leader === ctl.selfId) halt(ctl, run, rec);
  else if (rec.parked) sendStatus(ctl, run);
  ctl.poke();
}

// the loop waits here (no step in flight) until the new roster applies or the run ends
export async function awaitRecovery(ctl, run) {
  const rec = run.recovery;
  if (!rec) return;
  rec.parked = true;
  if (rec.promised && rec.promised.committed) { applyRoster(ctl, run, rec.promised); return; }
  if (rec.leader === ctl.selfId) tryFinish(ctl, run);
  else sendStatus(ctl, run);
  if (run.recovery !== rec || run.ended) return;
  await new Promise((resolve) => rec.waiters.push(resolve));
}

// ---- acting leader ----------------------------------------------------------------------------
function halt(ctl, run, rec) {
  const gone = [...run.gone.keys()].sort();
  const key = gone.join(',');
  if (rec.halted === key && rec.timer) { tryFinish(ctl, run); return; }
  rec.halted = key;
  ctl.tellAll(run, TYPES.HALT, { runId: run.desc.runId, epoch: rec.epoch, gone }, live(run));
  // while the recovery lasts (a quorum may wait for the server's word), the HALT goes out again
  // now and then: the members keep hearing their leader, so a liar cannot pass it off as silent
  clearInterval(rec.keepAlive);
  rec.keepAlive = setInterval(() => {
    if (run.recovery !== rec || run.ended || rec.leader !== ctl.selfId) { clearInterval(rec.keepAlive); return; }
    ctl.tellAll(run, TYPES.HALT, { runId: run.desc.runId, epoch: rec.epoch, gone: [...run.gone.keys()].sort() }, live(run));
  }, run.collective.deadlineMs / 3);
  clearTimeout(rec.timer);
  rec.timer = setTimeout(() => statusTimeout(ctl, run, rec), run.collective.deadlineMs);
  tryFinish(ctl, run);
}

function statusTimeout(ctl, run, rec) {
  if (run.recovery !== rec || rec.leader !== ctl.selfId || run.ended) return;
  rec.timer = null;
  const missing = live(run).filter((id) => id !== ctl.selfId && !rec.statuses.has(id));
  for (const id of missing) run.gone.set(id, 'no answer while the group recovered');
  if (missing.length) beginRecovery(ctl, run);
}

// this device's position (STATUS) to `to`
function tellStatus(ctl, run, to) {
  ctl.mesh.sendJson(to, TYPES.STATUS, { runId: run.desc.runId, epoch: run.epoch, completed: position(run), hash: positionHash(run),
                                         gone: lostClaims(run), convicted: convictions(run) },
    { runId: run.desc.runId, slot: run.slot }).catch(() => {});
}

export function sendStatus(ctl, run) {
  const rec = run.recovery;
  tellStatus(ctl, run, rec.leader);
  clearTimeout(rec.timer);
  const leader = rec.leader;
  // while this device still judges (an audit's evidence, a departure's barrier: its STATUS names
  // them unsettled) the leader cannot propose either: the wait starts once this device is done
  if (convictions(run).some(([, back]) => back === null)) { rec.timer = null; return; }
  // the leader may wait for the server's word before it proposes: wait that long too
  rec.timer = setTimeout(() => {
    if (run.recovery === rec && rec.leader === leader && !(rec.promised && rec.promised.committed)) {
      evidence(ctl, run, leader, 'no new roster from it in time');
    }
  }, run.collective.deadlineMs + ctl.t.confirmWaitMs);
}

// the acting leader, once every member it counts (itself included, parked) told its position
export function tryFinish(ctl, run) {
  const rec = run?.recovery;
  if (!rec || rec.leader !== ctl.selfId || !rec.parked || rec.promised || run.ended) return;
  const h = ctl.host, survivors = live(run);
  const convicted = convictions(run);
  rec.statuses.set(ctl.selfId, { completed: position(run), hash: positionHash(run), epoch: run.epoch, convicted });
  if (!survivors.every((id) => rec.statuses.has(id))) return;
  // a member that says it lost a peer which answers this device: a partial partition or a lie.
  // Nobody is dropped on a member's word; the run stops with the alarm.
  for (const [id, lost] of rec.claims) {
    const alive = lost.filter((x) => x === ctl.selfId || survivors.includes(x));
    if (alive.length) {
      giveUp(ctl, run, rec, `${h.nameOf(id)} reports it lost ${alive.map((x) => h.nameOf(x)).join(', ')},`
        + ` who answer${alive.length > 1 ? '' : 's'} this device (a cut link or a lie; nobody is removed on a member's word)`);
      return;
    }
  }
  // a convicted peer's departure needs no quorum: every honest member convicts it on the same
  // evidence, recomputed by each (run/audits.js), and none can be convicted by a liar
  const confirmed = new Set([...run.confirmed, ...ctl.serverGone, ...convictedIds(run)]);
  if (!mayGoOn(run.roster, goneSet(run), confirmed)) {
    if (!rec.confirmTimer) {
      const waitingFor = [...run.gone.keys()].filter((id) => !confirmed.has(id)).map((id) => h.nameOf(id)).join(', ');
      h.show({ message: `Too few devices left for a quorum: waiting for the server to confirm that ${waitingFor} left`
        + ` (up to ${ctl.t.confirmWaitMs / 1000} s)…` });
      rec.confirmTimer = setTimeout(() => giveUp(ctl, run, rec, `lost ${[...run.gone.keys()].map((id) => h.nameOf(id)).join(', ')}:`
        + ' too many for a quorum, and the server did not confirm they left (going on could split the group in two)'), ctl.t.confirmWaitMs);
    }
    return;
  }
  clearTimeout(rec.confirmTimer);
  const at = survivors.map((id) => rec.statuses.get(id));
  if (at.some((x) => x.epoch !== run.epoch)) {
    giveUp(ctl, run, rec, 'the survivors are in different roster epochs (a change was under way)');
    return;
  }
  let from = Math.min(...at.map((x) => x.completed));
  const local = run.cfg.local_steps > 1;      // positions are round starts, at most one round apart
  if (!local && at.some((x) => x.completed > from + 1)) { giveUp(ctl, run, rec, 'the survivors are more than one step apart'); return; }
  if (local && at.some((x) => x.completed > roundEnd(run.cfg, from))) { giveUp(ctl, run, rec, 'the survivors are more than one round apart'); return; }
  // convictions: every survivor judged the same peers with the same rollback, from the same state
  // (one that judged otherwise, or this device before its own judgement: wait, then stop); a
  // leaver's lie at a step this roster undoes is moot (rollback.js standing)
  const gone = goneSet(run), mine = standing(convicted, from, gone), key = convictionsKey(mine);
  const otherwise = survivors.filter((id) => convictionsKey(standing(rec.statuses.get(id).convicted, from, gone)) !== key);
  if (otherwise.length || convicted.some(([, back]) => back === null)) {
    if (!rec.judgeTimer && !convicted.some(([, back]) => back === null)) {    // (not while this device still judges)
      // (long enough for the withheld-reveal wait of verdicts.js settle, then the word)
      rec.judgeTimer = setTimeout(() => giveUp(ctl, run, rec, otherwise.length
        ? `${otherwise.map((id) => h.nameOf(id)).join(', ')} judged the audit evidence otherwise than this device`
        : 'this device could not settle the rollback of its conviction'), run.collective.deadlineMs + ctl.t.confirmWaitMs);
    }
    return;
  }
  clearTimeout(rec.judgeTimer);
  if (mine.length) {
    if (mine.some(([, , hash]) => !hash)) { giveUp(ctl, run, rec, 'the state to go back to is no longer kept'); return; }
    from = rollbackTo(mine);
  } else {
    const atFrom = new Set(survivors.filter((id) => rec.statuses.get(id).completed === from).map((id) => rec.statuses.get(id).hash));
    if (!local && run.completed === from + 1) atFrom.add(run.undo && run.undo.step === from ? run.undo.hash : 'none');
    if (local && position(run) > from) atFrom.add(run.undoPrev && run.undoPrev.step === from ? run.undoPrev.hash : 'none');
    if (atFrom.size > 1) { giveUp(ctl, run, rec, `replicas disagree at step ${from}`, 'replica mismatch'); return; }
  }
  const left = run.roster.filter((id) => run.gone.has(id));
  const msg = { runId: run.desc.runId, epoch: rec.epoch, base: run.epoch, from, roster: survivors, left, joined: [],
                history: local ? scheduleLocal(run.history, from, run.roster.length, leftSlots(run.roster, survivors))
                  : scheduleWith(run.history, from, survivors.length),
                convicted: mine.map(([id, back]) => [id, back]),
                reason: left.map((id) => `${h.nameOf(id)}: ${run.gone.get(id) || 'gone'}`).join('; ').slice(0, 400) };
  rec.epoch += 1;                 // a later proposal (after more evidence) needs a new epoch
  const change = new RosterChange(msg, rosterDigest(msg), 'recovery',
    ctl.newCollective(run.desc.runId, msg.epoch, survivors, from, run.cfg, run.collective.deadlineMs));
  rec.promised = change;
  change.accepts.add(ctl.selfId);
  ctl.tellAll(run, TYPES.ROSTER, msg, survivors);
  clearTimeout(rec.timer);
  change.timer = setTimeout(() => answersTimeout(ctl, run, change), run.collective.deadlineMs + ctl.t.confirmWaitMs);
  maybeCommit(ctl, run, change);
}

export function answersTimeout(ctl, run, change) {
  if (run.ended || change.committed) return;
  const missing = change.msg.roster.filter((id) => !change.accepts.has(id));
  if (change.kind === 'recovery') {
    if (run.recovery?.promised !== change) return;
    run.recovery.promised = null;
    ctl.dispose(change.collective);
  } else if (run.change === change) voidChange(ctl, run, '');
  for (const id of missing) evidence(ctl, run, id, 'no answer to the new roster');
}

// No way on without risking a split: every survivor meets at the last step all completed.
export function giveUp(ctl, run, rec, why, error = 'split alarm') {
  if (run.recovery !== rec || run.ended) return;
  // members' positions within one step of this device's (honest ones are; a claimed position
  // further away is a lie and must not pull the stop out of everyone's reach)
  // (local steps: round starts within a round of this device's)
  const local = run.cfg.local_steps > 1, here = position(run);
  const at = [...rec.statuses.values()].map((x) => x.completed).filter((c) => Math.abs(c - here) <= (local ? run.cfg.local_steps : 1));
  const stopAfter = Math.min(here, ...at);
  const message = `The run stopped at step ${stopAfter}: ${why}.`;
  ctl.tellAll(run, TYPES.STOP, { runId: run.desc.runId, stopAfter, reason: message, by: ctl.selfId, alarm: error }, live(run));
  // at the run's end (a Stop, its last step) with a conviction of its own settled: nobody goes on,
  // so this device keeps the state before the lie (its judgement's rollback), not the lie
  const mine = convictions(run).filter(([, back, hash]) => back !== null && hash);
  if (run.completed >= (run.stopAfter ?? run.cfg.steps) && mine.length && goBack(ctl, run, rollbackTo(mine), mine.map(([id]) => id))) {
    ctl.host.note(`This device went back to step ${run.completed}, before the lie of ${mine.map(([id]) => ctl.host.nameOf(id)).join(', ')}.`);
  } else if (local && stopAfter < run.completed) toRoundStart(ctl, run, stopAfter);
  else if (stopAfter < run.completed) restoreUndo(ctl, run);
  end(ctl, run, 'stopped', `${message} Generate, download and resume still work on the state this device keeps.`, error);
}

// ---- frames: HALT, STATUS, LEAVE --------------------------------------------------------------
export function onHalt(ctl, from, m) {
  const run = ctl.at, d = m.json;
  if (d.runId !== run.desc.runId || !run.roster.includes(from) || !Array.isArray(d.gone) || !Number.isInteger(d.epoch)) {
    ctl.mesh.drop(from, m, 'HALT for no run of ours');
    return;
  }
  if (d.epoch <= run.epoch) return;                   // a recovery that already ended
  // the run's end: this device tells its position (so its judgement, still under way, is waited
  // for) and follows no recovery until it convicts someone itself
  if (ending(run)) { tellStatus(ctl, run, from); return; }
  const mine = run.recovery;
  if (mine && mine.leader === from) {
    // our leader's HALT (again: its keep-alive, heard in dispatch) asks for our position again:
    // a STATUS sent before the leader had its own evidence (it still reached a peer senior to it)
    // was dropped there, and it waits for one. Our deadline for its roster stays as it is.
    if (mine.parked && !mine.promised) tellStatus(ctl, run, from);
    return;
  }
  // Its `gone` is its claim. This device halts (a stall at most) and reports its position to the
  // sender; it follows the sender's lead only when it cannot vouch for any peer senior to it.
  adoptSilence(ctl, run, from, from);
  beginRecovery(ctl, run);
  const rec = run.recovery;
  if (rec.leader !== from) tellStatus(ctl, run, from);
}

export function onStatus(ctl, from, m) {
  const run = ctl.at, d = m.json, h = ctl.host;
  if (d.runId !== run.desc.runId || !run.roster.includes(from) || !Number.isInteger(d.completed) || !isHash(d.hash)
      || !Number.isInteger(d.epoch) || !Array.isArray(d.gone)) {
    ctl.mesh.drop(from, m, 'STATUS for no run of ours');
    return;
  }
  if (d.epoch < run.epoch || ending(run)) return;     // sent before the roster it asked for arrived; the run's end
  if (run.gone.has(from)) { ctl.mesh.drop(from, m, `STATUS from ${h.nameOf(from)}, which this device saw leave (${run.gone.get(from)})`); return; }
  if (actingLeader(run.roster, goneSet(run)) !== ctl.selfId && !adoptSilence(ctl, run, ctl.selfId, from)) {
    ctl.mesh.drop(from, m, `STATUS to a device that is not the acting leader`
      + ` (${h.nameOf(actingLeader(run.roster, goneSet(run)))} leads and still answers it)`);
    return;
  }
  const claims = d.gone.filter((id) => typeof id === 'string' && (run.roster.includes(id))).slice(0, 64);
  if (!run.recovery || run.recovery.leader !== ctl.selfId) beginRecovery(ctl, run);
  const rec = run.recovery;
  // (its judgement, compared in tryFinish: at most 64 entries of at most 4 values each)
  const convicted = Array.isArray(d.convicted) && d.convicted.length <= 64 ? d.convicted.map((c) => (Array.isArray(c) ? c.slice(0, 4) : c)) : [];
  rec.statuses.set(from, { completed: d.completed, hash: d.hash, epoch: d.epoch, convicted });
  if (claims.length) rec.claims.set(from, claims); else rec.claims.delete(from);
  tryFinish(ctl, run);
}

export function onLeave(ctl, from, m) {
  const run = ctl.at;
  if (m.json.runId !== run.desc.runId) { run.joiners.delete(from); return; }
  evidence(ctl, run, from, String(m.json.reason || 'it closed its page').slice(0, 200), true);
}
