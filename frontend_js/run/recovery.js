// Membership changes of a running group (docs/ARCHITECTURE.md "Membership", docs/PROTOCOL.md
// "One lying member"): the overview, and the one interface the loop and the controller's frame
// table use. Departures and failover are departures.js, the two-phase roster change
// roster_change.js (a member's and the proposer's side) and roster_apply.js (committed and
// applied, or void), the split alarm split_alarm.js.
//
// Evidence that a peer left is only ever THIS device's own: its link closed, its own deadline
// passed (no gradient, no STATUS, no roster in time), the peer's own LEAVE, or the signaling
// server's peer-left. What another member says (HALT's or STATUS's `gone`) is a claim: shown,
// compared, never acted on.
//
//   any survivor with evidence      acting leader (most senior not gone, in its own view)
//   halts its step, parks      ──►  HALT {epoch, gone}  to the members it still counts
//   STATUS {completed, hash,   ──►  every live member answered? claims agree with what it sees?
//           epoch, gone}            a quorum (roster.js mayGoOn)? positions one step apart?
//                              ◄──  ROSTER {epoch, base, from, roster, history}   (a proposal)
//   checks it against its own view: base = its epoch, sender = the roster's most senior, every
//   dropped peer one it cannot reach itself, the quorum on its own knowledge, the schedule
//                              ──►  ACCEPT {epoch, digest} | REFUSE {epoch, reason}
//                              ◄──  GO {epoch, digest}  once every member staying accepted
//   applies exactly that roster (undoing one step if it is one ahead)
//
// A planned change (joiners, join.js) is the same proposal, announced two steps ahead; it takes
// effect at its first step once committed. Anything that does not add up stops the run with an
// alarm naming the step and the peers: never a fork, never a peer dropped on another's word.
//
// The modules import downward only (no cycle): roster_apply.js <- departures.js <-
// roster_change.js <- this file; split_alarm.js stands alone.
export { evidence, awaitRecovery, onHalt, onStatus, onLeave } from './departures.js';
export { onRoster, onRosterAnswer, onCommit, awaitCommit, reportJudgement, onServerGone } from './roster_change.js';
export { checkForeignFrame } from './split_alarm.js';
