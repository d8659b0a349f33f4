// Barriers: nothing unaudited outlives a departure or the run's end (docs/PROTOCOL.md "Audited
// gradients"; run/audits.js has the overview). Before the roster drops a departing peer
// (checkDeparture) and before a run ends (checkEnd), this device recomputes that peer's (every
// other member's) contributions not covered by a settled pass and convicts the first that does
// not reproduce.
// Imports: audit_book.js (checkedFrom), audit_recompute.js, verdicts.js (convict). Exports:
// checkDeparture (departures.js), checkEnd (loop.js, through audits.js).
import { waitUntil } from '../page_clock.js';
import { checkStartState } from '../audit.js';
import { fromHex } from '../hashing.js';
import { GATE_LOOK_MS, checkedFrom, exchangeAt, heldState, roundMismatch } from './audit_book.js';
import { recompute } from './audit_recompute.js';
import { askRoundState } from './round_states.js';
import { convict } from './verdicts.js';

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
  if (b.span > 1) { departRounds(ctl, run, b, { id, slot, from }, upTo, void_); return; }
  (async () => {
    for (let u = from; u < upTo; u++) {
      const got = b.received.get(u);
      if (!got || !b.states.has(u)) { ctl.host.note(`Cannot check step ${u + 1} of ${ctl.host.nameOf(id)}, which left: its state is no longer kept here.`); continue; }
      const mine = await recompute(ctl, run, u, slot, null, null, true);
      if (mine === null || void_()) return;
      if (mine.hash !== got.inHashes[slot] || !Object.is(mine.loss, got.losses[slot])) {
        b.departing.delete(id);
        convict(ctl, run, id, u, `gradient from ${ctl.host.nameOf(id)} did not reproduce at step ${u + 1}: removed (checked when it left; received ${got.inHashes[slot].slice(0, 16)}, recomputed ${mine.hash.slice(0, 16)})`, true);
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
// whether `id` sent its FIN of this epoch and step: it is at the end's barrier (its audits run)
const finished = (run, id) => {
  const f = run.fins.get(id);
  return Boolean(f && f.epoch === run.epoch && f.step === run.completed);
};

export async function checkEnd(ctl, run) {
  const b = run.book;
  if (!b) return true;
  const epoch = run.epoch, void_ = () => run.ended || run.book !== b || run.epoch !== epoch || run.recovery !== null;
  // this device's judgements first (evidence it holds, a conviction's earlier audits)
  const judging = () => b.accused.size > 0 || b.checking !== null || b.evidence.some(({ ev }) => ev.step <= b.done);
  while (judging() && !void_()) await waitUntil(() => !judging() || void_(), GATE_LOOK_MS, (wake) => ctl.onPoke(wake));
  if (void_()) return false;
  // an auditor's FIN settles its passes, except at the steps it says it could not draw (a member's
  // commitment it lacked: it never ran that audit; CI's fuzz seed 300257098 kept a forged step so)
  const settledBy = (slot, t) => slot === run.slot || (finished(run, run.roster[slot]) && !run.fins.get(run.roster[slot]).undrawn.includes(t));
  for (const [key, p] of [...b.pending]) if (settledBy(p.auditor, p.t)) b.pending.delete(key);
  const others = run.roster.map((id, slot) => ({ id, slot, from: checkedFrom(run, id) })).filter(({ slot }) => slot !== run.slot);
  if (b.span > 1) {
    // a state this device holds with the member's committed hash (its own at the run's start, or
    // the one it recomputed as the auditor of the member's last pass), else the member's own answer:
    // a member at its barrier owes it at once (one withheld after its FIN convicts it); one still on
    // its way there is waited for twice the deadline (its own wait for its barrier is one)
    const ask = async (x) => (heldState(run, b, x) ?? askRoundState(ctl, run, b, exchangeAt(run.cfg, x.from), x.slot, x.slot, 2 * run.collective.deadlineMs)
      .then((adam) => adam ?? (finished(run, x.id) ? `it showed no Adam state of step ${x.from} in time` : null)));
    return (await recheckRounds(ctl, run, b, others, "at the run's end", void_, run.completed, ask)) === true;
  }
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


// ---- local steps: a barrier recomputes rounds forward (docs/VERIFICATION.md §13 "Rounds of local steps")
// For each member (`from`: the round start after its last settled pass), its Adam state at `from`
// (startOf(member) -> the state, checked here against the state hash the member committed to with
// the round before: the chain; or a reason it convicts; or null: not to be had, its rounds left
// unchecked and named), then every round from there whose exchange is before `upTo`, earliest first,
// slots in order at a round, each from the end state this device recomputed for the round before —
// never the member's own word (the reference's recheck). Each round's delta message and loss
// against what this device received, its end state against the member's commitment where its AUDIT
// came. The first that does not reproduce convicts its member at that round (an audit's
// rollback; `checked`: a departure's). -> true when all reproduced, false when one convicted, null
// when void
async function recheckRounds(ctl, run, b, members, where, void_, upTo, startOf, checked = false) {
  // (a round from u whose exchange is before upTo; exchangeAt clamps to the run's last step)
  const cfg = run.cfg, h = ctl.host, done = (u) => u < upTo && exchangeAt(cfg, u) < upTo;
  const todo = members.filter((x) => done(x.from));
  if (!todo.length) return void_() ? null : true;
  const words = (id, e, why) => `round of ${h.nameOf(id)} did not reproduce at step ${e + 1}: removed (checked ${where}; ${why})`;
  const convicts = (x, e, why) => { b.departing.delete(x.id); convict(ctl, run, x.id, e, words(x.id, e, why), checked); return false; };
  // each member's state at its first round to check (the asks go out at once)
  const starts = await Promise.all(todo.map((x) => startOf(x)));
  if (void_()) return null;
  const running = new Map();
  for (const [i, x] of todo.entries()) {
    const e = exchangeAt(cfg, x.from), chain = b.stateHashes.get(x.from - 1)?.[x.slot];
    const cannot = (why) => h.note(`Cannot check the rounds of ${h.nameOf(x.id)} from step ${x.from + 1} ${where}: ${why}.`);
    if (!chain) { cannot('the state hash they start from is no longer kept here'); continue; }
    if (starts[i] === null) { cannot('no Adam state of it to start from'); continue; }
    const why = typeof starts[i] === 'string' ? starts[i] : checkStartState(starts[i], fromHex(chain));
    if (why !== null) return convicts(x, e, why);
    running.set(x.slot, starts[i]);
  }
  for (let u = Math.min(...todo.map((x) => x.from)); done(u); u = exchangeAt(cfg, u) + 1) {
    const e = exchangeAt(cfg, u), got = b.received.get(e);
    for (const x of todo) {
      if (u < x.from || !running.has(x.slot)) continue;
      if (!got || !b.states.has(u)) { h.note(`Cannot check the round of ${h.nameOf(x.id)} ending at step ${e + 1} ${where}: its state is no longer kept here.`); running.delete(x.slot); continue; }
      const mine = await recompute(ctl, run, e, x.slot, null, null, true, running.get(x.slot));
      if (mine === null || void_()) return null;
      const why = roundMismatch(run, b, e, x.slot, mine, got);
      if (why !== null) return convicts(x, e, why);
      b.pending.delete(`${e}:${x.slot}`);
      running.set(x.slot, mine.adam);
    }
  }
  return void_() ? null : true;
}

// A departure's barrier of rounds: the leaver cannot be asked. Its state at `from` is a state this
// device holds with the hash the leaver committed to (its own kept state there, which at the run's
// start is everyone's), or the one the auditor of the leaver's pass at `from` recomputed (kept by
// that auditor, passedStates; asked of it, ROUND_STATE_ASK naming the leaver's slot), checked here
// against that hash first: a state that does not hash to it is the auditor's error, not the
// leaver's lie (those rounds are named on the panel and left unchecked)
function departRounds(ctl, run, b, member, upTo, void_) {
  const h = ctl.host;
  const start = async (x) => {
    const chain = b.stateHashes.get(x.from - 1)?.[x.slot], held = heldState(run, b, x);
    if (!chain || held) return held;
    const auditor = [...(b.passes.get(x.id) || [])].find(([a, steps]) => a !== null && steps.includes(x.from))?.[0];
    const k = auditor === undefined ? -1 : run.roster.indexOf(auditor);
    if (k < 0 || k === run.slot) return null;
    const adam = await askRoundState(ctl, run, b, exchangeAt(run.cfg, x.from), k, x.slot);
    if (adam && checkStartState(adam, fromHex(chain)) !== null) { h.note(`${h.nameOf(auditor)} gave a state of ${h.nameOf(x.id)} at step ${x.from} that is not the one it committed to.`); return null; }
    return adam;
  };
  recheckRounds(ctl, run, b, [member], 'when it left', void_, upTo, start, true).then((ok) => {
    if (ok !== true || void_()) return;
    b.departing.delete(member.id);
    ctl.judged(run);
  }).catch((err) => console.warn('daisy: checking a departure failed:', err));
}
