// The split alarm (docs/PROTOCOL.md "One lying member"; run/recovery.js has the overview): a
// gradient frame of this run from a member, for an epoch or a roster this device never accepted,
// stops the run with an alarm naming the step and the peer. Never a silent drop, never a fork.
// Imports: ending.js (alarm). Exports: checkForeignFrame (the controller's dispatch).
import { alarm } from './ending.js';

// ---- the split alarm --------------------------------------------------------------------------
// A gradient frame of THIS run (run id + epoch in its header) from a member, for an epoch or a
// roster this device never accepted: the group split. Never a silent drop. -> true if handled.
export function checkForeignFrame(ctl, run, from, m, collective) {
  const h = ctl.host;
  const epoch = (m.runId - run.desc.runId) >>> 0;
  if (epoch > run.epoch + 1000) return false;                    // not this run
  if (!run.roster.includes(from) && !(collective && collective.roster.includes(from))) return false;
  if (collective) {
    if (collective.roster.includes(from)) return false;          // ours: the collective checks the rest
    alarm(ctl, run, `Split alarm at step ${m.step + 1}: ${h.nameOf(from)} sends epoch ${epoch} frames,`
      + ` but this device's roster of epoch ${epoch} does not hold it. Stopped (never fork).`, 'split alarm');
    return true;
  }
  if (epoch < run.epoch) {
    const next = run.epochFrom.get(epoch + 1);
    if (next === undefined || m.step <= next + 1) { ctl.mesh.drop(from, m, `a late frame of epoch ${epoch}`); return true; }
  }
  alarm(ctl, run, `Split alarm at step ${m.step + 1}: ${h.nameOf(from)} trains epoch ${epoch} of this run`
    + ` (this device: epoch ${run.epoch}, roster ${run.roster.map((id) => h.nameOf(id)).join(', ')}),`
    + ' a roster this device never accepted. Stopped (never fork).', 'split alarm');
  return true;
}
