// The two-phase roster change, as a member and as the proposer (docs/PROTOCOL.md "One lying
// member"; run/recovery.js has the overview): a proposed roster (ROSTER, a recovery's or a planned
// join's) is accepted only when it adds up in this device's own view, else refused or deferred a
// moment (ACCEPT / REFUSE); the proposer collects the answers and commits (GO); a planned change
// takes effect at its first step (awaitCommit). A deferred proposal is checked again when this
// device's judgement changes (reportJudgement) or the server confirms a departure (onServerGone).
// Imports: departures.js, roster_apply.js, rollback.js, audit_book.js. Exports: onRoster,
// onRosterAnswer, onCommit, awaitCommit, reportJudgement, onServerGone.
import { TYPES } from '../mesh/frames.js';
import { mayGoOn, scheduleWith, scheduleLocal, leftSlots, checkRoster, rosterDigest, scheduleString } from '../mesh/roster.js';
import { waitUntil } from '../page_clock.js';
import { RosterChange, validHistory } from './record.js';
import { alarm, position, positionBack } from './ending.js';
import { restartBook } from './audit_book.js';
import { convictions, standing, convictionsKey, convictedIds, rollbackTo } from './rollback.js';
import { ending, evidence, reachMs, reaches, beginRecovery, sendStatus, tryFinish, answersTimeout, giveUp } from './departures.js';
import { maybeCommit, switchCollective, applyRoster, setRoster } from './roster_apply.js';

// ---- the roster change: proposal, answers, commit ---------------------------------------------
// A member: a proposed roster (recovery or planned join). Accepted only when it adds up in this
// device's own view; a refusal says why to the sender and on this panel. A proposal that drops a
// peer this device still hears from, or that lacks a quorum on its own knowledge, waits a moment
// first (a crashed peer's link takes a moment to close; the server's word may be on its way).
export function onRoster(ctl, from, m, final = false) {
  const run = ctl.at, d = m.json, h = ctl.host;
  if (d.runId !== run.desc.runId) { ctl.mesh.drop(from, m, 'ROSTER for no run of ours'); return; }
  const rec = run.recovery;
  // one roster accepted per epoch: a later proposal needs a later epoch
  const floor = Math.max(rec ? rec.epoch : run.epoch + 1, run.change ? run.change.msg.epoch + 1 : 0);
  const dropped = Array.isArray(d.roster) ? run.roster.filter((id) => !d.roster.includes(id)) : [];
  const joined = Array.isArray(d.roster) ? d.roster.filter((id) => !run.roster.includes(id)) : [];
  let why = d.base !== run.epoch ? `it changes epoch ${d.base}, this device is in epoch ${run.epoch}` : null;
  if (!why && Number.isInteger(d.epoch) && d.epoch < floor) why = `this device already accepted a roster for epoch ${floor - 1}`;
  // a conviction's roster names the peers convicted and goes back to where this device's own
  // judgement goes (run/audits.js): the same peers, the same step, or it waits / refuses. One it
  // leaves out must be moot: a leaver's lie at a step this roster undoes (rollback.js standing;
  // `from` is checked against this device's position below)
  const named = new Set((Array.isArray(d.convicted) ? d.convicted : []).map((c) => (Array.isArray(c) ? c[0] : null)));
  const gone = new Set(run.gone.keys());
  const mine = convictions(run).filter((c) => named.has(c[0]) || standing([c], d.from, gone).length).map(([id, back]) => [id, back]);
  let wait = null;
  if (!why && convictionsKey(mine) !== convictionsKey(Array.isArray(d.convicted) ? d.convicted : [])) {
    const says = (list) => list.map(([id, back]) => `${h.nameOf(id)} back to step ${back}`).join(', ') || 'none';
    why = `its convictions (${says(Array.isArray(d.convicted) ? d.convicted : [])}) are not this device's own judgement (${says(mine)})`;
    wait = run.collective.deadlineMs + ctl.t.confirmWaitMs;     // this device's own judgement may be on its way (verdicts.js settle)
  }
  // (local steps: the round start this device holds, and the one before it: docs/VERIFICATION.md "Local steps")
  const local = run.cfg.local_steps > 1;
  const completed = mine.length ? rollbackTo(mine) : local ? position(run) : run.completed;
  if (!why && mine.length && d.from !== completed) why = `it goes back to step ${d.from}, this device's judgement to ${completed}`;
  if (!why && ctl.faults.refuseRosters) why = 'the fault plan refuses every roster';
  if (!why && ending(run)) why = `this device ends the run at step ${run.completed} (only a conviction changes its roster now)`;
  if (!why) why = checkRoster(d, { roster: run.roster, epoch: run.epoch, completed, selfId: ctl.selfId, keptOut: ctl.keptOut, ...(local ? { back: positionBack(run), round: run.cfg.local_steps } : {}) }, from);
  if (!why && (!validHistory(d.history, d.from, d.roster.length)
      || scheduleString(d.history) !== scheduleString(local ? scheduleLocal(run.history, d.from, run.roster.length, leftSlots(run.roster, d.roster), joined.length)
        : scheduleWith(run.history, d.from, d.roster.length)))) {
    why = 'its P schedule is not this run\'s';
  }
  if (!why && joined.length && from !== run.roster[0]) why = 'only the run\'s leader admits joiners';
  if (!why && joined.some((id) => !ctl.mesh.isReady(id))) {
    why = `this device has no link to ${joined.filter((id) => !ctl.mesh.isReady(id)).map((id) => h.nameOf(id)).join(', ')}`;
  }
  if (!why && dropped.length) {
    const reached = dropped.filter((id) => reaches(ctl, run, id));
    const confirmed = new Set([...run.confirmed, ...ctl.serverGone, ...convictedIds(run)]);
    if (reached.length) {
      why = `it drops ${reached.map((id) => h.nameOf(id)).join(', ')}, who this device still reaches`;
      wait = reachMs(ctl, run) / 2;
    } else if (!mayGoOn(run.roster, new Set(dropped), confirmed)) {
      why = 'too few devices stay for a quorum and the server did not confirm the others left';
      wait = ctl.t.confirmWaitMs;
    }
  }
  if (!why && joined.length === 0 && !rec) beginRecovery(ctl, run);
  if (why && wait !== null && !final) {
    if (!run.recovery) beginRecovery(ctl, run);
    const r = run.recovery;
    if (r.deferred) clearTimeout(r.deferred.timer);
    r.deferred = { from, m, timer: setTimeout(() => {
      if (run.recovery !== r || r.deferred?.m !== m || run.ended) return;
      r.deferred = null;
      onRoster(ctl, from, m, true);
    }, wait) };
    return;
  }
  if (why) { refuseRoster(ctl, run, from, d, why); ctl.mesh.drop(from, m, `ROSTER refused: ${why}`); return; }
  const change = new RosterChange(d, rosterDigest(d), joined.length ? 'join' : 'recovery',
    ctl.newCollective(run.desc.runId, d.epoch, d.roster, d.from, run.cfg, run.collective.deadlineMs));
  if (change.kind === 'recovery') {
    const r = run.recovery;
    if (r.promised) ctl.dispose(r.promised.collective);
    r.promised = change;
    r.leader = from;
    r.epoch = d.epoch + 1;
  } else {
    if (run.change) ctl.dispose(run.change.collective);
    run.change = change;
  }
  ctl.mesh.sendJson(from, TYPES.ACCEPT, { runId: run.desc.runId, epoch: d.epoch, digest: change.digest },
    { runId: run.desc.runId, slot: run.slot }).catch(() => {});
}

function refuseRoster(ctl, run, from, d, why) {
  const epoch = Number.isInteger(d.epoch) ? d.epoch : 0;
  ctl.mesh.sendJson(from, TYPES.REFUSE, { runId: run.desc.runId, epoch, reason: why }, { runId: run.desc.runId, slot: run.slot }).catch(() => {});
  ctl.host.note(`Refused a new roster from ${ctl.host.nameOf(from)}: ${why}.`);
}

// the proposer: a member's ACCEPT or REFUSE of our roster
export function onRosterAnswer(ctl, from, m, yes) {
  const run = ctl.at, d = m.json, h = ctl.host;
  const change = [run.recovery?.promised, run.change].find((c) => c && c.msg.epoch === d.epoch && c.msg.roster[0] === ctl.selfId);
  if (!change || !change.msg.roster.includes(from) || change.committed) { ctl.mesh.drop(from, m, 'an answer to no roster of ours'); return; }
  if (!yes || d.digest !== change.digest) {
    const why = yes ? 'it accepted another roster (digest)' : String(d.reason || 'no reason').slice(0, 300);
    if (change.kind === 'recovery') {
      giveUp(ctl, run, run.recovery, `${h.nameOf(from)} refused the new roster: ${why}`);
    } else {
      alarm(ctl, run, `The run stopped at step ${run.completed}: ${h.nameOf(from)} refused the roster admitting`
        + ` ${change.msg.joined.map((id) => h.nameOf(id)).join(', ')}: ${why}.`, 'split alarm');
    }
    return;
  }
  change.accepts.add(from);
  maybeCommit(ctl, run, change);
}

// a member: GO for the roster it accepted
export function onCommit(ctl, from, m) {
  const run = ctl.at, d = m.json;
  const change = [run.recovery?.promised, run.change].find((c) => c && c.msg.epoch === d.epoch);
  if (!change || from !== change.msg.roster[0] || d.digest !== change.digest) {
    ctl.mesh.drop(from, m, 'GO for no roster this device accepted');
    return;
  }
  change.committed = true;
  if (change.kind === 'recovery' && run.recovery?.parked) applyRoster(ctl, run, change);
  ctl.poke();
}

// the loop at a planned change's first step: -> true once it took effect
export async function awaitCommit(ctl, run) {
  const change = run.change;
  await waitUntil(() => change.committed || run.ended || run.recovery || run.change !== change, run.collective.deadlineMs,
    (wake) => ctl.onPoke(wake));
  if (run.ended || run.recovery || run.change !== change) return false;
  if (!change.committed) {
    if (change.msg.roster[0] === ctl.selfId) answersTimeout(ctl, run, change);
    else evidence(ctl, run, change.msg.roster[0], 'no GO for the roster it announced');
    return false;
  }
  run.change = null;
  const joined = change.msg.roster.filter((id) => !run.roster.includes(id)), before = run.roster, epochBefore = run.epoch;
  switchCollective(ctl, run, change);
  setRoster(ctl, run, change.msg, joined, []);
  restartBook(run, before, epochBefore);        // a join: the audits start over from here
  return true;
}

// this device's judgement of the audit evidence changed (audits.js): the acting leader tries
// again, a parked member tells it
export function reportJudgement(ctl, run) {
  const rec = run.recovery;
  if (!rec || run.ended) return;
  const deferred = rec.deferred;       // a proposal that waited for this judgement is checked again
  if (deferred) { rec.deferred = null; clearTimeout(deferred.timer); onRoster(ctl, deferred.from, deferred.m, false); }
  if (run.recovery !== rec) return;
  if (rec.leader === ctl.selfId) tryFinish(ctl, run);
  else if (rec.parked) sendStatus(ctl, run);
}

// the server's word that a peer left: a departure it confirms may let the survivors go on
export function onServerGone(ctl, run, id) {
  if (run.gone.has(id)) tryFinish(ctl, run);
  const deferred = run.recovery?.deferred;
  if (deferred) { run.recovery.deferred = null; clearTimeout(deferred.timer); onRoster(ctl, deferred.from, deferred.m, false); }
}
