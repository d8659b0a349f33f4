// A reduce-scatter shard owner's transcript (docs/VERIFICATION.md §13 "A shard owner's reduced
// shard"; run/audits.js has the overview): asked for once per owner and step (TRANSCRIPT_ASK),
// received at its exact size (TRANSCRIPT, the mesh's limit), checked against the commitments and
// the REDUCED this device got (ownerVerdict); and this device's own, sent as an owner only where
// the protocol owes it (transcriptOwed).
// Imports: audit_book.js, the rules (audit.js checkReducedShard). Exports: askTranscript,
// ownerVerdict, ownerWords, noTranscript, transcriptLimit, transcriptOwed (round_states.js too) and
// the frame handlers onTranscript, onTranscriptAsk.
import { TYPES } from '../mesh/frames.js';
import { waitUntil } from '../page_clock.js';
import { checkReducedShard } from '../audit.js';
import { CodecError } from '../exchange_codec.js';
import { fromHex } from '../hashing.js';
import { sha256Hex, VERDICT_STEPS } from './audit_book.js';

// a transcript of shard k: the P slots' messages of it, each of the shard's message size
const transcriptBytes = (run, k) => run.roster.length * run.collective.codec.messageBytes(run.collective.shardValues(k));

const concat = (parts) => {
  if (!parts) return null;
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
};

// -> the transcript of step t from the owner of shard k (its P messages, concatenated), or null
// when none came within the deadline; this device's own when it is that owner
// The owner answers one ask per asker and step (a repeat is a bad frame there), so this device asks
// once: the audit, a judgement of reduce evidence and a conviction's earlier audits share the answer
export function askTranscript(ctl, run, b, t, k) {
  if (k === run.slot) return Promise.resolve(concat(b.received.get(t)?.transcript));
  const key = `${run.epoch}:${t}:${k}`;
  if (!b.asked.has(key)) b.asked.set(key, (async () => {
    b.asking.add(key);
    ctl.mesh.sendJson(run.roster[k], TYPES.TRANSCRIPT_ASK, { runId: run.desc.runId, epoch: run.epoch, step: t }, { runId: run.desc.runId, slot: run.slot }).catch(() => {});
    await waitUntil(() => b.transcripts.has(key) || run.ended || run.book !== b, run.collective.deadlineMs, (wake) => ctl.onPoke(wake));
    b.asking.delete(key);
  })());
  return b.asked.get(key).then(() => b.transcripts.get(key) ?? null);
}

// the mesh's limit for a TRANSCRIPT: only from an owner this device asked, at its exact size
export function transcriptLimit(ctl, hd) {
  const run = ctl.run, b = run?.book;
  if (!b || run.collective.topology !== 'rsag' || hd.runId !== run.desc.runId) return 'TRANSCRIPT for no audit of ours';
  if (!b.asking.has(`${run.epoch}:${hd.step}:${hd.slot}`)) return `TRANSCRIPT of step ${hd.step} from slot ${hd.slot}, not asked for`;
  return transcriptBytes(run, hd.slot);
}

// a transcript this device asked for (the mesh checked its size against transcriptLimit); a second
// one of the same ask is a bad frame
export function onTranscript(ctl, from, m) {
  const run = ctl.at, b = run.book, slot = run.roster.indexOf(from);
  const key = `${run.epoch}:${m.step}:${slot}`;
  const want = b && slot >= 0 && m.slot === slot && b.asking.has(key) ? transcriptBytes(run, slot) : -1;
  if (m.payload.length !== want) { ctl.mesh.drop(from, m, 'TRANSCRIPT not asked for, or of another size'); return; }
  if (b.transcripts.has(key)) { ctl.mesh.drop(from, m, `a second TRANSCRIPT of step ${m.step}`); return; }
  b.transcripts.set(key, m.payload);
  ctl.poke();
}

// the owner's transcript of step t against the commitments and the REDUCED this device got ->
// {reason (null: it reproduces), committed: SHA-256 of that REDUCED, recomputed: of the transcript}
export function ownerVerdict(run, b, t, k, transcript) {
  const c = run.collective, codec = c.codec, P = run.roster.length;
  const n = c.shardValues(k), size = transcriptBytes(run, k) / P;
  const slices = Array.from({ length: P }, (_, s) => transcript.subarray(s * size, (s + 1) * size));
  const committed = b.shardHashes.get(t).map((hashes) => fromHex(hashes[k]));
  const reduced = b.received.get(t).reduced[k];
  let reason;
  try {
    reason = checkReducedShard(slices, committed, codec.decode(reduced, n), n, codec, run.cfg.seed, t, c.bounds[k]);
  } catch (err) {
    if (!(err instanceof CodecError)) throw err;
    reason = null;                // a committed slice that does not decode: its sender's lie, not the owner's
  }
  return { reason, committed: sha256Hex(reduced), recomputed: sha256Hex(transcript) };
}

export function ownerWords(ctl, run, owner, t, reason, accuser) {
  return `reduced shard from ${ctl.host.nameOf(owner)} did not reproduce at step ${t + 1}: removed (${reason}; audited by ${ctl.host.nameOf(run.roster[accuser])})`;
}

// an owner that does not show its transcript in time is gone (this device's own evidence)
export function noTranscript(ctl, run, owner, t) {
  ctl.host.note(`No transcript of step ${t + 1} from ${ctl.host.nameOf(owner)} in time.`);
  ctl.peerGone(owner, `no transcript of step ${t + 1} in time`);
}

// whether the member in slot `asker` is owed this device's transcript of step t: the pairs of t name
// it this device's auditor; or an EVIDENCE of kind 'reduce' against this device's slot at t is here;
// or this device was audited at t and an EVIDENCE naming it (accused or accuser) at a later step
// within the verdict window is here: every member that convicts on it checks this device's audits
// before that step whose verdicts may still come, its reduce included (checkingEarlier). Pending or
// judged, or sent by this device: evidenceSeen's keys (and reproduced's) are epoch:step:slot:accuser.
// round: the state of a round of local steps (round_states.js): evidence of any kind against this
// device's round at t owes it, as evidence against its reduce owes the transcript
export function transcriptOwed(run, b, asker, epoch, t, round = false) {
  if (asker < 0) return false;
  const pairs = b.pairs.get(t);
  if (pairs?.some(([auditor, audited]) => auditor === asker && audited === run.slot)) return true;
  const audited = Boolean(pairs?.some(([, d]) => d === run.slot));
  const owes = ({ e, step, slot, accuser, reduce }) => e === epoch && (
    (reduce && step === t && slot === run.slot)
    || (audited && step > t && step - t <= VERDICT_STEPS * b.span && (slot === run.slot || accuser === run.slot)));
  if (b.evidence.some(({ ev }) => owes({ e: ev.epoch, step: ev.step, slot: ev.slot, accuser: ev.accuser, reduce: round || ev.kind === 'reduce' }))) return true;
  for (const k of [...b.evidenceSeen, ...b.reproduced.keys()]) {
    const [e, step, slot, accuser] = k.split(':').map(Number);
    if (owes({ e, step, slot, accuser, reduce: slot === run.slot && step === t })) return true;
  }
  return false;
}

// an auditor or a judge asks this device, the owner of a shard, for its transcript of a step. Sent
// only where the protocol owes it: to the auditor the beacon named for this device's slot at that
// step, or to a member judging an EVIDENCE of this device's reduce at that step; once per asker and
// step, while kept. An ask not owed yet (this device has not drawn that step's pairs: it draws them once their
// frames are here; or the evidence is still on its way) waits for it up to the exchange deadline; one never owed is a bad
// frame (counted toward the flood limit), as is a repeated one. So a member makes this device send
// a transcript only where the run would anyway (docs/PROTOCOL.md "Mesh limits"). Also answered
// from the run that just ended here (idle): a member still auditing the last steps may ask then.
// waitOwed: (ctl, run, b, step, owed, ms) -> whether owed() held within ms (verdicts.js owedOnceDrawn, handed in by audits.js)
export async function onTranscriptAsk(ctl, from, m, waitOwed) {
  const run = ctl.phase === 'running' ? ctl.at : ctl.lastRun, d = m.json, b = run?.book;
  const ok = b && d.runId === run.desc.runId && d.epoch === run.epoch && run.roster.includes(from) && Number.isInteger(d.step);
  const parts = ok ? b.received.get(d.step)?.transcript : null;
  if (!parts) { ctl.mesh.drop(from, m, `TRANSCRIPT_ASK of step ${d.step}: no transcript of it kept here`); return; }
  const key = `${from}:${d.epoch}:${d.step}`;
  if (b.answered.has(key)) { ctl.mesh.drop(from, m, `a second TRANSCRIPT_ASK of step ${d.step}`); return; }
  b.answered.add(key);                       // a repeat while this one waits is a second ask too
  const owed = () => run.book === b && transcriptOwed(run, b, run.roster.indexOf(from), d.epoch, d.step);
  if (!(await waitOwed(ctl, run, b, d.step, owed, run.collective.deadlineMs))) {
    if (run.book === b) ctl.mesh.drop(from, m, `TRANSCRIPT_ASK of step ${d.step}: not this step's auditor of this device, nor judging its reduce`);
    return;
  }
  const kept = b.received.get(d.step)?.transcript;
  if (kept) ctl.mesh.send(from, { type: TYPES.TRANSCRIPT, slot: run.slot, runId: run.desc.runId, step: d.step, payload: concat(kept) }).catch(() => {});
}
