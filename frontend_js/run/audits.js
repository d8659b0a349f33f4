// Audited gradients in a page run (docs/VERIFICATION.md §13 is the contract; docs/PROTOCOL.md
// "Audited gradients" the frames): the overview, and the one interface the loop, the controller's
// frame table and the run's start/join use. The rules are audit.js's (the reference's twin, the
// same names); the modules below are their use over the mesh, lagging the step loop so no step
// waits for an audit, and spreading each audit's recomputation over up to W = AUDIT_WINDOW steps
// so no page pays more than its share (about `rate` local steps per step):
//
//   after exchange s   AUDIT {epoch, step s, hashes, loss, nonceHash = SHA-256(n_s), reveal n_{s-1},
//                      beacon of s-2} to every member. The hashes are of the messages this device
//                      sent; every receiver checks the one it got (a mismatch: the split alarm).
//                      (commitments.js)
//   step t = s-2       once every slot's AUDIT of t and of t+1 (its reveal) is here: digests,
//                      beacon, the pairs (auditPairs, the auditors' loads balanced over the last W
//                      steps). Each audit is recorded as a pass of the audited peer (trusted
//                      points, kept states: audit_book.js), pending until its verdict; the auditor
//                      recomputes the audited slot from its kept state after t steps
//                      (audit_recompute.js), in slices (a unit at a time) while its loop waits for
//                      the exchange, plus its share per step (payShare: the earliest-deadline rate,
//                      at least `rate` local steps; audit_schedule.js), done by step t + W, and
//                      compares digests (verdicts.js).
//   a failed audit     EVIDENCE {epoch, step, slot, accuser, committed, recomputed} to every member.
//                      Each member recomputes itself (judge): the audited peer or the accuser is
//                      convicted on this device's own evidence and the evidence is passed on.
//                      (evidence.js, verdicts.js)
//   a shard owner      (reduce-scatter) an audit of slot k also audits k's reduce: the auditor asks
//                      k for its transcript (TRANSCRIPT_ASK -> TRANSCRIPT: the P messages of shard k it
//                      reduced), checks each against its sender's commitment and recomputes the
//                      reduce against the REDUCED k sent; a mismatch is EVIDENCE {kind: 'reduce'},
//                      which every member judges by asking k itself (no answer in time: k is gone)
//                      (transcripts.js)
//   a cheap check      a gradient not finite or of the wrong size (mesh_collective.js): convicted
//                      at once by every receiver (evidence.js)
//   a conviction       the peer is gone (departures.js) with a rollback: the roster drops it from
//                      `back` = rollbackStep over this device's passes, every replica restores its
//                      kept state after `back` steps and the steps from there are recomputed
//                      (verdicts.js convict, rollback.js).
//   a barrier          a departure or the run's end: the contributions not covered by a settled
//                      pass are recomputed first (audit_barriers.js)
//
// Every honest replica computes the same pairs, passes and `back`, so the run the group keeps is
// `python -m daisy.train --attack` with that removal (tests/js/audit_mesh.test.mjs). Audits and
// rollbacks never reach before the book's floor: the run's start, or its last join or departure.
//
// The modules import downward only (no cycle): audit_book.js <- audit_recompute.js, transcripts.js,
// rollback.js <- verdicts.js <- commitments.js, audit_schedule.js, evidence.js, audit_barriers.js
// <- this file. The membership modules (departures.js, roster_change.js, roster_apply.js) import
// the parts they need directly.
export { validAuditRate, openBook, keepState } from './audit_book.js';
export { exclusive } from './audit_recompute.js';
export { afterExchange, flush, onAudit } from './commitments.js';
export { idle, payShare } from './audit_schedule.js';
export { onEvidence, onLie, ownStep } from './evidence.js';
export { onTranscript, transcriptLimit } from './transcripts.js';
export { onRoundState, roundStateLimit } from './round_states.js';
import { onTranscriptAsk as transcriptAsk } from './transcripts.js';
import { onRoundStateAsk as roundStateAsk } from './round_states.js';
import { owedOnceDrawn } from './verdicts.js';
// an ask of this device's transcript or round state waits until it is owed, this device drawing the
// asked step's pairs itself once their frames are here (verdicts.js owedOnceDrawn; the two modules
// sit below verdicts.js, so it is handed to them here)
export const onTranscriptAsk = (ctl, from, m) => transcriptAsk(ctl, from, m, owedOnceDrawn);
export const onRoundStateAsk = (ctl, from, m) => roundStateAsk(ctl, from, m, owedOnceDrawn);
export { convictedIds } from './rollback.js';
export { checkEnd } from './audit_barriers.js';
