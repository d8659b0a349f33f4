// A slot's Adam state at a round's start, for the audit of that round (docs/VERIFICATION.md §13
// "Rounds of local steps"; run/audits.js has the overview): a round of local steps is a pure
// function of the anchor (the same on every replica), the batches and the slot's own Adam state,
// which no other device holds. Its auditor (or a judge of evidence against that round) asks the
// slot for it (ROUND_STATE_ASK), receives exactly stateTranscriptBytes(N) (ROUND_STATE, the mesh's
// limit) and checks it against the state hash the slot committed to with its round before
// (verdicts.js). This device answers from its own state kept at that round's start, only where the
// protocol owes it (transcripts.js transcriptOwed, as a shard owner's transcript).
// Imports: audit_book.js, transcripts.js (transcriptOwed). Exports: askRoundState,
// roundStateLimit, encodeRoundState, decodeRoundState and the frame handlers onRoundState,
// onRoundStateAsk.
import { TYPES } from '../mesh/frames.js';
import { waitUntil } from '../page_clock.js';
import { stateTranscriptBytes } from '../audit.js';
import { roundStart, GATE_LOOK_MS } from './audit_book.js';
import { transcriptOwed } from './transcripts.js';

// N: the model's values (every parameter tensor's length)
const valuesOf = (run) => Object.values(run.replica.params).reduce((n, a) => n + a.length, 0);

// {t, m, v} (m, v: name -> Float64Array, param order) -> t u32le, every m tensor's float64le
// bytes, then every v tensor's: the bytes adamStateHash hashes after its tag
export function encodeRoundState(adam) {
  const names = Object.keys(adam.m);
  const N = names.reduce((n, k) => n + adam.m[k].length, 0);
  const out = new Uint8Array(stateTranscriptBytes(N)), dv = new DataView(out.buffer);
  dv.setUint32(0, adam.t, true);
  let at = 4;
  for (const part of [adam.m, adam.v]) {
    for (const k of names) {
      const a = part[k];
      for (let i = 0; i < a.length; i++, at += 8) dv.setFloat64(at, a[i], true);
    }
  }
  return out;
}

// the bytes back into {t, m, v} shaped like `like` (this device's own params); the caller checked the size
export function decodeRoundState(bytes, like) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const names = Object.keys(like), out = { t: dv.getUint32(0, true), m: {}, v: {} };
  let at = 4;
  for (const part of [out.m, out.v]) {
    for (const k of names) {
      const a = new Float64Array(like[k].length);
      for (let i = 0; i < a.length; i++, at += 8) a[i] = dv.getFloat64(at, true);
      part[k] = a;
    }
  }
  return out;
}

// -> the Adam state the slot in `k` started its round ending at t from ({t, m, v}), or null when
// none came within the deadline; this device's own (kept) when it is that slot. Asked once per
// slot and round: the audit and any judgement share the answer (the slot answers one ask each).
// of: the slot whose state is asked for, when it is not k's own: a departed member's state after
// its last passed audit, asked of the auditor that recomputed it (a departure's barrier). One ask
// to k per round at a time (its ROUND_STATE names only k and the round: asks of it are answered in turn)
// waitMs: how long to wait for it: ms (the exchange deadline unless given), or a predicate that says
// when to give up (an audit's: verdicts.js auditStateWait, then the exchange deadline). Counted from
// the ask or from the last frame of a ROUND_STATE that came from k: a state on its way is waited for
// (26.5 MB at the largest settings take 21 s behind a 10 Mbit/s uplink, and a member at the end's
// barrier sends one to each other member)
export function askRoundState(ctl, run, b, t, k, of = k, waitMs = run.collective.deadlineMs) {
  if (k === run.slot && of === k) {
    const st = b.states.get(roundStart(run.cfg, t));
    return Promise.resolve(st ? { t: st.t, m: st.m, v: st.v } : null);
  }
  const key = `${run.epoch}:${t}:${of}:${k}`, wire = `${run.epoch}:${t}:${k}`;
  if (!b.stateAsked.has(key)) b.stateAsked.set(key, (async () => {
    for (let before; (before = b.stateAsked.get(b.stateAsking.get(wire))) !== undefined;) await before;   // (an ask pruned meanwhile: none)
    b.stateAsking.set(wire, key);
    ctl.mesh.sendJson(run.roster[k], TYPES.ROUND_STATE_ASK, { runId: run.desc.runId, epoch: run.epoch, step: t, ...(of !== k ? { of } : {}) }, { runId: run.desc.runId, slot: run.slot }).catch(() => {});
    const here = () => b.roundStates.has(key) || run.ended || run.book !== b;
    let last = performance.now();
    const off = ctl.mesh.on('progress', (e) => { if (e.peer === run.roster[k] && e.type === TYPES.ROUND_STATE) last = performance.now(); });
    const quiet = (ms) => performance.now() - last >= ms;
    const late = typeof waitMs === 'number' ? () => quiet(waitMs) : () => waitMs() && quiet(run.collective.deadlineMs);
    try {
      while (!here() && !late()) await waitUntil(here, GATE_LOOK_MS, (wake) => ctl.onPoke(wake));
    } finally { off(); }
    b.stateAsking.delete(wire);
  })());
  return b.stateAsked.get(key).then(() => b.roundStates.get(key) ?? null);
}

// the mesh's limit for a ROUND_STATE: only from a slot this device asked, at exactly stateTranscriptBytes(N)
export function roundStateLimit(ctl, hd) {
  const run = ctl.run, b = run?.book;
  if (!b || b.span === 1 || hd.runId !== run.desc.runId) return 'ROUND_STATE for no audit of ours';
  if (!b.stateAsking.has(`${run.epoch}:${hd.step}:${hd.slot}`)) return `ROUND_STATE of step ${hd.step} from slot ${hd.slot}, not asked for`;
  return stateTranscriptBytes(valuesOf(run));
}

// a state this device asked for (the mesh checked its size against roundStateLimit); a second one
// of the same ask is a bad frame
export function onRoundState(ctl, from, m) {
  const run = ctl.at, b = run.book, slot = run.roster.indexOf(from);
  const key = b && b.span > 1 && slot >= 0 && m.slot === slot ? b.stateAsking.get(`${run.epoch}:${m.step}:${slot}`) : undefined;
  if (key === undefined || m.payload.length !== stateTranscriptBytes(valuesOf(run))) { ctl.mesh.drop(from, m, 'ROUND_STATE not asked for, or of another size'); return; }
  if (b.roundStates.has(key)) { ctl.mesh.drop(from, m, `a second ROUND_STATE of step ${m.step}`); return; }
  b.roundStates.set(key, decodeRoundState(m.payload, run.replica.params));
  ctl.poke();
}

// an auditor or a judge asks this device for its state at the start of its round ending at `step`.
// Sent only where the protocol owes it: the auditor the beacon named for this device's slot at that
// round, or a member judging evidence against it (transcriptOwed), once per asker and round, while
// kept; an ask not owed yet waits for it up to the exchange deadline (this device drawing that
// round's pairs itself once their frames are here: waitOwed, verdicts.js owedOnceDrawn); one never
// owed, a repeat, or one of a round not kept is a bad frame. At the run's end's barrier every member
// recomputes the others' rounds forward from a round start after their last settled pass, as it
// counts them, so each member is owed one state of this device there: at any round start it keeps
// (its own kept states reach back to its last pass that every member counts settled: audit_book.js
// pruneStates), whether or not this device is still at its own (its barrier may
// have convicted someone already: a member still at its barrier needs the state to judge alike).
// One per asker and epoch, asked after the asker's FIN (it asks at its barrier), so the bytes a
// member can make it send at the end are one state's. Also answered from the run that just ended here.
// `of` (another slot): a departed member's state after its last passed audit, which this device
// recomputed as that audit's auditor (passedStates): owed to a member while that member is gone here
export async function onRoundStateAsk(ctl, from, m, waitOwed) {
  const run = ctl.phase === 'running' ? ctl.at : ctl.lastRun, d = m.json, b = run?.book;
  const ok = b && b.span > 1 && d.runId === run.desc.runId && d.epoch === run.epoch && run.roster.includes(from) && Number.isInteger(d.step)
    && (d.of === undefined || (Number.isInteger(d.of) && d.of >= 0 && d.of < run.roster.length && d.of !== run.slot));
  const member = ok && d.of !== undefined ? run.roster[d.of] : null;
  // (an asker at its barrier sent its FIN of this epoch first, on the same ordered link; looked at
  // while the ask waits: the in-memory test links reorder frames, and a FIN records itself late)
  const finFirst = () => Boolean(ok) && run.fins.get(from)?.epoch === d.epoch;
  const kept = () => {
    if (!ok) return null;
    if (member === null) return b.states.get(roundStart(run.cfg, d.step));
    const p = b.passedStates.get(member);
    return p && p.at === roundStart(run.cfg, d.step) ? p.adam : null;
  };
  if (!kept()) { ctl.mesh.drop(from, m, `ROUND_STATE_ASK of step ${d.step}: no state of that round kept here`); return; }
  const key = `${from}:${d.epoch}:${d.of ?? run.slot}:${d.step}`, endKey = `${from}:${d.epoch}:end`;
  if (b.stateAnswered.has(key)) { ctl.mesh.drop(from, m, `a second ROUND_STATE_ASK of step ${d.step}`); return; }
  b.stateAnswered.add(key);                  // a repeat while this one waits is a second ask too
  const byAudit = () => (member !== null ? run.gone.has(member) || b.departing.has(member)
    : transcriptOwed(run, b, run.roster.indexOf(from), d.epoch, d.step, true));
  const atEnd = () => member === null && finFirst() && !b.stateAnswered.has(endKey);
  const owed = () => run.book === b && (byAudit() || atEnd());
  if (!(await waitOwed(ctl, run, b, d.step, owed, run.collective.deadlineMs))) {
    if (run.book === b) ctl.mesh.drop(from, m, `ROUND_STATE_ASK of step ${d.step}: not this round's auditor of this device, nor judging it`);
    return;
  }
  if (!byAudit()) {                          // the end's barrier: one state per member
    if (!atEnd()) { ctl.mesh.drop(from, m, `a second ROUND_STATE_ASK at the run's end (step ${d.step})`); return; }
    b.stateAnswered.add(endKey);
  }
  const st = kept();
  if (st) ctl.mesh.send(from, { type: TYPES.ROUND_STATE, slot: run.slot, runId: run.desc.runId, step: d.step, payload: encodeRoundState(st) }).catch(() => {});
}
