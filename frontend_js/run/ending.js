// How a run ends or steps back, shared by the protocol modules (loop.js, recovery.js, join.js
// only call these): end, the alarm, one step of undo, waking the parked loop, the panel's view.
import { TYPES } from '../mesh/frames.js';
import { ExchangeError } from '../mesh/mesh_collective.js';
import { cloneParams, isExchangeStep } from '../train.js';
import { keepChecked } from './kept_check.js';

export function runView(run) {
  return { id: run.desc.runId, roster: run.roster.slice(), topology: run.collective.topology, leader: run.roster[0],
           epoch: run.epoch, history: run.history.map((e) => e.slice()) };
}

// A split, a mismatch: this page stops now and says why; every member is told to stop too. The
// state kept is the last one this page completed (never a forked one: it stops before going on).
export function alarm(ctl, run, message, error) {
  if (run.ended) return;
  ctl.tellAll(run, TYPES.STOP, { runId: run.desc.runId, stopAfter: run.completed, reason: message, by: ctl.selfId, alarm: error });
  end(ctl, run, 'stopped', message, error);
}

export function wakeParked(ctl, run) {
  const rec = run.recovery;
  if (!rec) return;
  clearTimeout(rec.timer); clearTimeout(rec.confirmTimer); clearTimeout(rec.judgeTimer); clearInterval(rec.keepAlive);
  run.recovery = null;
  for (const w of rec.waiters) w();
  ctl.poke();
}

// ---- one step of undo -------------------------------------------------------------------------
// (local steps keep the states of this page's last two exchanges instead, run.undo and
// run.undoPrev: a member that left during an exchange may have reached some pages and not others,
// and the group meets again at the earlier round's start; docs/VERIFICATION.md "Local steps")
export function saveUndo(run) {
  const r = run.replica;
  if (r.anchor != null) { run.undoPrev = run.undo; run.undo = null; }     // local steps: a new snapshot, the last one kept
  if (!run.undo) run.undo = { params: cloneParams(r.params), m: cloneParams(r.adam.m), v: cloneParams(r.adam.v), t: r.adam.t, hash: run.hash, step: run.completed, anchor: null };
  else {
    for (const k of Object.keys(r.params)) { run.undo.params[k].set(r.params[k]); run.undo.m[k].set(r.adam.m[k]); run.undo.v[k].set(r.adam.v[k]); }
    run.undo.t = r.adam.t; run.undo.hash = run.hash; run.undo.step = run.completed;
  }
  if (r.anchor != null) run.undo.anchor = cloneParams(r.anchor);      // local steps: the group's weights too
}

// (local steps keep the state after the last exchange instead: it may lie several of this page's
// own steps back, and is restored whole)
export function restoreUndo(ctl, run) {
  const u = run.undo, r = run.replica;
  if (!u || (r.anchor == null ? u.step !== run.completed - 1 : u.step > run.completed)) return false;
  for (let st = u.step + 1; st <= run.completed; st++) run.hashLog.delete(st);
  for (const k of Object.keys(r.params)) { r.params[k].set(u.params[k]); r.adam.m[k].set(u.m[k]); r.adam.v[k].set(u.v[k]); }
  r.adam.t = u.t;
  if (u.anchor != null) r.anchor = cloneParams(u.anchor);
  run.completed = u.step; run.hash = u.hash;
  run.lastSent = Math.min(run.lastSent, u.step);
  run.curve = run.curve.filter(([st]) => st <= u.step);
  ctl.host.models.step = u.step;
  ctl.host.show({ step: u.step, hash: u.hash, curve: run.curve });
  ctl.host.emit('step-undone', { step: u.step, hash: u.hash });
  return true;
}

// ---- local steps: positions are round starts ----------------------------------------------------
// the steps completed once the first exchange at or after step index s is done (the next round start)
export function roundEnd(cfg, s) {
  let e = s;
  while (!isExchangeStep(cfg, e)) e++;
  return e + 1;
}

// where this device stands in a roster change: the steps it completed, or with local steps the
// last round start it holds (its last exchange: the state it goes back to), and the hash there
export const position = (run) => (run.cfg.local_steps > 1 && run.undo ? run.undo.step : run.completed);
export const positionHash = (run) => (run.cfg.local_steps > 1 && run.undo ? run.undo.hash : run.hash);
// the earlier round start it can still go back to (its exchange before the last), or -1
export const positionBack = (run) => run.undoPrev?.step ?? -1;

// local steps: back to the state at round start `step` (the last exchange's or the one before) -> whether it could
export function toRoundStart(ctl, run, step) {
  if (run.undoPrev && run.undoPrev.step === step && run.undo?.step !== step) { run.undo = run.undoPrev; run.undoPrev = null; }
  if (!run.undo || run.undo.step !== step) return false;
  return restoreUndo(ctl, run);
}

// The run ends here now (nothing more is sent or applied); the state it keeps is checked first
// unless the end's barrier passed (kept_check.js: an end before it may hold an unaudited forged
// step), meanwhile the phase is 'ending' and the panel says so; then the panel, the model store and
// the stored run see the state kept.
export function end(ctl, run, runState, message, error) {
  if (run.ended) return;
  const h = ctl.host;
  run.ended = true;
  run.collective.fail(new ExchangeError('the run ended'));
  run.sent.bytes += run.collective.bytesSent; run.sent.waitMs += run.collective.waitMs;
  ctl.dispose(run.collective);
  if (run.change) ctl.dispose(run.change.collective);
  if (run.recovery?.promised) ctl.dispose(run.recovery.promised.collective);
  if (run.recovery) wakeParked(ctl, run);
  ctl.lastRun = run;
  ctl.joinBackoffUntil = performance.now() + 3000;    // peers still finishing this run look 'training' a moment
  const check = run.book !== null && !run.barrierPassed;
  if (!check) { kept(ctl, run, runState, message, error); return; }
  if (ctl.at === run) ctl.enter('ending', run);
  h.show({ running: false, runState: 'checking', message: `${message} Checking the steps since the last audit before keeping them…` });
  keepChecked(ctl, run).then(
    (undone) => kept(ctl, run, runState, undone ? `${message} Checked before keeping: ${undone}.` : message, error),
    (err) => { console.warn('daisy: checking the kept steps failed:', err); kept(ctl, run, runState, `${message} (its last steps could not be checked: ${err.message || err})`, error); });
}

function kept(ctl, run, runState, message, error) {
  const h = ctl.host;
  if (ctl.at === run) ctl.enter('idle', null);
  h.models.step = run.completed;
  h.models.runEnded(run.replica, runState, error);
  h.show({ running: false, runState, message, error, step: run.completed, hash: run.hash,
           audits: { rate: run.book?.rate ?? 0, through: run.book ? run.book.done + 1 : 0, span: run.book?.span ?? 1 } });
  h.announce();
  h.emit('run-ended', { state: runState, step: run.completed, error, message, hash: run.hash, history: run.history.map((e) => e.slice()) });
  h.stored?.afterRun(run, { state: runState, error });   // stored_run.js
}
