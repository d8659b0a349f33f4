// What a run that ends without its end's barrier keeps (issue 27: a forged step kept by leaving
// right after it). A lost quorum, an alarm, a failure or a cut round ends a run before the barrier
// (audit_barriers.js checkEnd) ran; the state this device then keeps may hold contributions no
// audit covered yet. Before keeping it, this device alone (nobody else is asked: the group is gone)
// recomputes every other member's contributions since that member's last settled pass, earliest
// step first, slots in order at a step, against the bytes and loss it received, and keeps the
// state before the first that does not reproduce (or that it cannot check). Local steps: rounds,
// each member's from a state this device holds with the member's committed hash (heldState: at
// the run's start everyone's; or the one it recomputed as the auditor of the member's last pass),
// forward as the end's barrier rechecks them (audit_barriers.js recheckRounds; nobody is asked
// for a state here). Cost: what the end's barrier costs, about (P - 1) / rate local steps, once per
// such end.
// Imports: audit_book.js (checkedFrom, rounds' rules), audit_recompute.js (recompute), rollback.js (goBack).
// Exports: keepChecked (ending.js end).
import { checkedFrom, exchangeAt, heldState, roundMismatch } from './audit_book.js';
import { recompute } from './audit_recompute.js';
import { goBack } from './rollback.js';

// -> null (every contribution reproduced: the state is kept as it is), or the words saying which
// step this device went back before and why
export async function keepChecked(ctl, run) {
  const b = run.book, h = ctl.host;
  if (!b) return null;
  const others = run.roster.map((id, slot) => ({ id, slot, from: checkedFrom(run, id) })).filter(({ slot }) => slot !== run.slot);
  const end = run.completed;
  if (b.span > 1) return keepCheckedRounds(ctl, run, b, others, end);
  for (let u = Math.min(end, ...others.map((x) => x.from)); u < end; u++) {
    const got = b.received.get(u);
    for (const { id, slot, from } of others) {
      if (u < from) continue;
      const mine = got ? await recompute(ctl, run, u, slot, null, null, true) : null;
      const why = !mine ? `the gradient of ${h.nameOf(id)} at step ${u + 1} could not be checked here`
        : mine.hash !== got.inHashes[slot] || !Object.is(mine.loss, got.losses[slot]) ? `the gradient of ${h.nameOf(id)} at step ${u + 1} did not reproduce`
          : null;
      if (why) return goBackBefore(ctl, run, u, why);
    }
  }
  return null;
}

// local steps: round by round (u: its start, e: its exchange) from the earliest member's `from`,
// slots in order; the first round that does not reproduce, or that this device cannot recompute
// (no state of the member to start from, its frames or this device's own state there no longer
// here), sends it back to that round's start
async function keepCheckedRounds(ctl, run, b, others, end) {
  const h = ctl.host, running = new Map();          // slot -> its Adam state at u, recomputed here
  for (let u = Math.min(end, ...others.map((x) => x.from)); u < end && exchangeAt(run.cfg, u) < end; u = exchangeAt(run.cfg, u) + 1) {
    const e = exchangeAt(run.cfg, u), got = b.received.get(e);
    for (const x of others) {
      if (u < x.from) continue;
      const adam = u === x.from ? heldState(run, b, x) : running.get(x.slot);
      const round = `the round of ${h.nameOf(x.id)} ending at step ${e + 1}`;
      if (!adam) return goBackBefore(ctl, run, u, `${round} could not be checked here (no Adam state of it to start from)`);
      const mine = got && b.states.has(u) ? await recompute(ctl, run, e, x.slot, null, null, true, adam) : null;
      if (!mine) return goBackBefore(ctl, run, u, `${round} could not be checked here`);
      const why = roundMismatch(run, b, e, x.slot, mine, got);
      if (why !== null) return goBackBefore(ctl, run, u, `${round} did not reproduce (${why})`);
      running.set(x.slot, mine.adam);
    }
  }
  return null;
}

// the latest kept state at or before step u (the state after u steps, before the contribution);
// none kept that far back: the state stays and the words say it is unchecked
function goBackBefore(ctl, run, u, why) {
  const back = Math.max(-1, ...[...run.book.states.keys()].filter((t) => t <= u));
  if (back < 0 || !goBack(ctl, run, back, [])) return `${why}, and no earlier state is kept here: the state after step ${run.completed} is kept unchecked`;
  return `${why}: this device keeps the state after step ${back}`;
}
