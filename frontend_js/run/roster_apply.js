// A roster change taking effect (docs/ARCHITECTURE.md "Membership"; run/recovery.js has the
// overview): committed once every member staying accepted (maybeCommit: GO), then applied (a
// recovery's roster: a conviction's rollback or one step undone, the new collective, the new
// roster), or void (voidChange: a planned change dropped).
// Imports: ending.js, audit_book.js (restartBook), rollback.js (goBack). Exports:
// voidChange, maybeCommit, switchCollective, applyRoster, setRoster.
import { TYPES } from '../mesh/frames.js';
import { end, restoreUndo, runView, wakeParked, toRoundStart, saveUndo } from './ending.js';
import { restartBook, rechain } from './audit_book.js';
import { goBack } from './rollback.js';

export function voidChange(ctl, run, why) {
  const ch = run.change;
  if (!ch) return;
  clearTimeout(ch.timer);
  ctl.dispose(ch.collective);
  run.change = null;
  for (const [, j] of run.joiners) j.admitted = null;
  ctl.poke();
  if (why) ctl.host.note(`The planned roster change was dropped: ${why}.`);
}

export function maybeCommit(ctl, run, change) {
  if (change.committed || !change.msg.roster.every((id) => change.accepts.has(id))) return;
  change.committed = true;
  clearTimeout(change.timer);
  ctl.tellAll(run, TYPES.GO, { runId: run.desc.runId, epoch: change.msg.epoch, digest: change.digest }, change.msg.roster);
  if (change.kind === 'recovery') applyRoster(ctl, run, change);
  ctl.poke();
}

export function switchCollective(ctl, run, change) {
  run.sent.bytes += run.collective.bytesSent; run.sent.waitMs += run.collective.waitMs;
  const deadlineMs = run.collective.deadlineMs;
  ctl.dispose(run.collective);
  run.collective = change.collective;
  run.collective.deadlineMs = deadlineMs;
}

// the committed recovery roster: undo a step if this device is one ahead (local steps: back to the
// round's start), then the new epoch
export function applyRoster(ctl, run, change) {
  const d = change.msg;
  const convicted = Array.isArray(d.convicted) ? d.convicted.map(([id]) => id) : [];
  // this device's convictions the roster leaves out: a leaver's lie at a step it undoes (moot)
  for (const [id, c] of run.book ? [...run.book.convicted] : []) {
    if (convicted.includes(id) || d.roster.includes(id)) continue;
    ctl.host.note(`${ctl.host.nameOf(id)}'s lie at step ${c.step + 1} is moot: not every device completed that step, `
      + `so the group undoes it and goes on without ${ctl.host.nameOf(id)}, which left.`);
    ctl.host.emit('conviction-moot', { peer: id, step: c.step + 1 });
  }
  if (convicted.length && !goBack(ctl, run, d.from, convicted)) {
    end(ctl, run, 'stopped', `The run stopped: this device no longer keeps the state after step ${d.from} to go back to.`, 'cannot meet the group');
    return;
  }
  // local steps: back to the round start it names (this device's last exchange, or the one before;
  // a conviction's: its own state there, restored by goBack, is the round start it holds now)
  if (run.cfg.local_steps > 1 && convicted.length) {
    run.undoPrev = null;
    saveUndo(run);
  } else if (run.cfg.local_steps > 1) {
    if (!toRoundStart(ctl, run, d.from)) {
      end(ctl, run, 'stopped', `The run stopped: this device cannot go back to step ${d.from} to meet the group.`, 'cannot meet the group');
      return;
    }
    run.undoPrev = null;                      // (the new roster's rounds start here)
  } else if (run.completed === d.from + 1 && !restoreUndo(ctl, run)) {
    end(ctl, run, 'stopped', `The run stopped: this device cannot step back to step ${d.from} to meet the group.`, 'cannot meet the group');
    return;
  }
  if (run.completed !== d.from) {
    end(ctl, run, 'stopped', `The run stopped: the group restarts at step ${d.from + 1}, this device is at ${run.completed + 1}.`,
      'cannot meet the group');
    return;
  }
  const left = run.roster.filter((id) => !d.roster.includes(id)), before = run.roster, epochBefore = run.epoch;
  switchCollective(ctl, run, change);
  run.gone.clear();
  for (const id of left) run.heard.delete(id);
  setRoster(ctl, run, d, [], left);
  if (!convicted.length) restartBook(run, before, epochBefore);      // a departure: the audits start over from here
  else rechain(run, before);                    // (local steps: the survivors' state hashes at `from`, in their new slots)
  wakeParked(ctl, run);
}


export function setRoster(ctl, run, d, joined, left) {
  const h = ctl.host;
  const wasLeader = run.roster[0];
  run.roster = d.roster.slice();
  run.epoch = d.epoch;
  run.epochFrom.set(d.epoch, d.from);
  run.slot = run.roster.indexOf(ctl.selfId);
  run.history = d.history.map((e) => e.slice());
  for (const id of left) run.peerHashes.delete(id);
  for (const id of joined) run.peerHashes.set(id, run.hash);
  const P = run.roster.length;
  const what = [joined.length ? `${joined.map((id) => h.nameOf(id)).join(', ')} joined` : '',
                left.length ? `${left.map((id) => h.nameOf(id)).join(', ')} left` : ''].filter(Boolean).join('; ');
  const newLeader = run.roster[0] !== wasLeader ? ` ${h.nameOf(run.roster[0])} leads the run now.` : '';
  h.show({ run: runView(run), leader: run.roster[0], peerHashes: Object.fromEntries(run.peerHashes),
           replicas: { count: P, agree: true, agreeing: P, step: run.completed },
           message: `${what}: ${P} device(s) train from step ${d.from + 1}`
             + `${left.length ? ' (that step recomputed without them)' : ''}.${newLeader}` });
  if (run.roster[0] !== wasLeader) h.announce();
  h.emit('roster-changed', { epoch: run.epoch, from: d.from, roster: run.roster.slice(), joined, left, history: run.history.map((e) => e.slice()) });
}
