// The share: audits spread over steps and idle time (docs/VERIFICATION.md §13 "The schedule";
// run/audits.js has the overview). The recomputations this device owes run one at a time through
// a gated backend (audit_recompute.js): a unit (one INT8 matmul with its quantization) runs only
// while the gate is open. It is open while the loop waits for the exchange (idle: the transfer
// hides the work), while a recovery parks the loop or the run finishes, and after each exchange
// until this step's share is done (payShare). The loop then computes its own step with the gate
// shut.
// Imports: audit_book.js, verdicts.js (work: the queue's worker). Exports: idle, payShare,
// shareUnits (bench/bench_audit_schedule.mjs).
import { waitUntil } from '../page_clock.js';
import { AUDIT_WINDOW } from '../audit.js';
import { GATE_LOOK_MS } from './audit_book.js';
import { work } from './verdicts.js';

// the loop waits for the exchange: audits may run
export function idle(ctl, run) {
  const b = run.book;
  if (!b) return;
  b.gateOpen = true;
  ctl.poke();
  work(ctl, run, b);
}

// after the exchange of step s (afterExchange queued the audits of s - 2): this exchange's share of
// the audit work is done before the loop applies s, then the gate shuts. The share: the
// earliest-deadline rate (every queued audit done by the exchange before its deadline t + W rounds),
// at least `rate` audited units per unit (a step, or a round) while work is queued, less what ran
// while the loop was idle.
export async function payShare(ctl, run, s) {
  const b = run.book;
  if (!b) return;
  b.gateOpen = true;
  ctl.poke();
  work(ctl, run, b);
  const need = shareUnits(b, s) - b.units.sinceShare;
  if (need > 0) {
    const target = b.units.done + need;
    const paid = () => b.units.done >= target || !b.queued.some((a) => a.stateReady) || run.ended || run.recovery || run.book !== b;
    while (!paid()) await waitUntil(paid, GATE_LOOK_MS, (wake) => ctl.onPoke(wake));
  }
  b.gateOpen = false;
  b.units.sinceShare = 0;
}

// units this exchange owes: max over the queue (deadline order) of ceil(work up to k / exchanges
// left to k's deadline), and at least rate x one unit's work while any is queued. Local steps: an
// audit is a round (span local steps of U units), due W rounds after its exchange, and the share is
// paid once per round, at its exchange: so both count rounds (bench/bench_audit_schedule.mjs: a
// round's share is the per-step rule's share of a step). Only audits whose round state is here
// count: the loop never waits for the network in its share (the worker takes those first, verdicts.js work)
export function shareUnits(b, s) {
  const U = b.units.perStep;
  let cum = 0, need = 0;
  for (const a of b.queued) {
    if (!a.stateReady) continue;
    cum += Math.max(0, U * b.span - a.done);
    need = Math.max(need, Math.ceil(cum / Math.max(1, Math.ceil((a.t + AUDIT_WINDOW * b.span - s) / b.span))));
  }
  return cum ? Math.min(cum, Math.max(need, Math.ceil(b.rate * U * b.span))) : 0;
}
