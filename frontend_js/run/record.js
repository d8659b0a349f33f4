// The records of a group run (docs/ARCHITECTURE.md "The run controller"): every field of a run,
// a recovery, a roster change and a joiner, declared once here with what it means. The protocol
// modules (start.js, loop.js, recovery.js, join.js) change these fields; nothing adds others.
import { MAX_RUN_ID } from '../mesh/roster.js';

// The controller's timings (ms). Node tests pass shorter ones (tests/js/run_harness.mjs).
export const TIMING = Object.freeze({
  linkWaitMs: 8_000,        // Start, and a joiner before asking, wait this long for links still connecting
  acceptWaitMs: 15_000,     // the leader's bound on the members' answers to RUN
  goWaitMs: 20_000,         // a member's bound on the leader's GO
  finWaitMs: 10_000,        // bound on the final hashes
  deadlineMs: 7_000,        // no frame from a needed peer for this long: it is gone (this device's own evidence)
  deadlineSteps: 5,         // ... or for this many of the run's recent step times, if longer
  reachMs: null,            // heard from within this long, a peer is one this device reaches (null: the deadline)
  confirmWaitMs: 10_000,    // too few survivors for a quorum: wait this long for the server's word
  joinWaitMs: 6_000,        // a joiner asks again when the leader's SYNC or STATE stalls this long
  refusedWaitMs: 30_000,    // ... and this long after the leader refused it, its SYNC was refused or its join could not begin
  syncDeadlineMs: 60_000,   // a joiner not in the roster this long after its state was sent is dropped
  resyncIntervalMs: 5_000,  // at most one state transfer to the same joiner this often (times STALL_FACTOR per stalled sync)
  firstAckMs: 3_000,        // a joiner confirms (SYNCED) its first forwarded step this long after its state's send completed,
  ackMs: 1_000,             // and each later one this long after the one before, or is dropped once FWD_WINDOW behind
  chunkMs: 25,              // train at most this long before yielding to the page
  streamGrads: true,        // send the GRAD in parts during the backward pass (MeshCollective.beginStep)
});

// The injected fault plan: test hooks, never read from globals by the controller.
export const NO_FAULTS = Object.freeze({
  corruptNextSync: false,   // this joiner's state goes wrong after its checks (the leader must catch its hash)
  noJoin: false,            // an outsider that never asks to join
  forge: null,              // {from, kind, factor, colluders}: this page sends a forged gradient from step index
                            // `from` (attack.js forge: scale, nan, noise, const, mismatch; local steps: its round's
                            // delta, or `moments`: its Adam m negated at each round's end; `unchained`: negated right
                            // after its honest commitment, so its next round starts from another state), committed to honestly,
                            // and as an auditor passes the peers named in colluders (ids) unchecked
  liarAuditor: null,        // {from, reduce}: from step index `from`, this page accuses every peer it audits
                            // (reduce: in reduce-scatter, of a reduce its transcript clears, not of its gradient)
  liarOwner: null,          // {from}: from step index `from`, this page's REDUCED shard (reduce-scatter) is
                            // forged, the same to every peer (attack.js forgeReduced)
  referenceNonces: false,   // audit nonces are referenceNonce(seed, step, slot): the reference run's audit choice
  refuseRosters: false,     // this page refuses every roster change proposed to it (stalls every recovery and join)
  withholdAudits: null,     // {from}: from step index `from`, this page sends no AUDIT frame (commitments and reveals withheld)
});

export const MAX_JOINERS = 8;       // devices being synced in at once
export const HASH_LOG = 64;         // the leader's recent hashes, to check joiners' reports
export const MAX_RESYNCS = 3;       // a joiner that reports a wrong hash this often is refused
export const RATE_WINDOW = 20;      // steps in the tokens/s window
export const MAX_CURVE = 2000;      // loss points kept for the plot (older ones thinned)
export const MAX_UNDRAWN = 64;     // steps a FIN may name as undrawn (its last steps, the end's missing commitments)
export const MAX_FWD_QUEUED = 64;   // forwarded gradients queued to one joiner before it is dropped
export const FWD_WINDOW = 8;        // forwarded steps a joiner may be behind on its SYNCED reports (and TIMING's ack waits)
export const STALL_FACTOR = 4;      // each stalled sync of a device multiplies its wait for the next transfer by this,
export const MAX_STALL_WAITS = 3;   // up to STALL_FACTOR ** 3 (5 s, 20 s, 80 s, 320 s at the default resync interval)
export const MAX_FWD_HELD = 256;    // forwarded gradients a joiner holds unapplied before it asks again
export const KEPT_RING = 5;         // audits: the states after the last few steps, always kept (run/audits.js)
export const MAX_KEPT_STATES = 48;  // audits: states kept in all (trusted points beyond the ring and the audits
                                    // whose verdict may still come go oldest first)

// A hash as messages show it (the one rule lives in ../hashing.js)
export { short } from '../hashing.js';
export const isHash = (h) => typeof h === 'string' && /^[0-9a-f]{64}$/.test(h);
export const isRunId = (x) => Number.isInteger(x) && x > 0 && x <= MAX_RUN_ID;

export function newRunId() {
  const a = new Uint32Array(1);
  do crypto.getRandomValues(a); while ((a[0] & MAX_RUN_ID) === 0 || (a[0] & MAX_RUN_ID) > MAX_RUN_ID - 100_000);
  return a[0] & MAX_RUN_ID;               // below 2^31 - 1e5: run id + epoch never wraps (roster.js)
}

// a replicated P schedule [[fromStep, P], ...]: strictly increasing steps, P in 1..64; an entry of a
// run of local steps may name the slots that left, [fromStep, P, slots] (increasing slots of the
// P before it; P above the ones that stay: joiners after them; the --roster form STEP:PEERS:SLOTS)
export function validHistory(h, from, P) {
  if (!Array.isArray(h) || !h.length || h.length > 4096) return false;
  let last = -1, lastP = 0;
  for (const e of h) {
    if (!Array.isArray(e) || (e.length !== 2 && e.length !== 3) || !Number.isInteger(e[0]) || !Number.isInteger(e[1]) || e[0] <= last || e[1] < 1 || e[1] > 64) return false;
    if (e.length === 3 && !validSlots(e[2], lastP, e[1])) return false;
    last = e[0]; lastP = e[1];
  }
  const tail = h[h.length - 1];
  return from === undefined || (tail[0] <= from && tail[1] === P);
}

const validSlots = (slots, before, P) => Array.isArray(slots) && slots.length >= before - P && slots.length > 0
  && slots.every((x, i) => Number.isInteger(x) && x >= 0 && x < before && (i === 0 || x > slots[i - 1]));

// Leader, start: the proposal waiting for every member's ACCEPT.
export class Proposal {
  constructor(desc) {
    this.desc = desc;
    this.answers = new Set();   // members that accepted
    this.resolve = null; this.reject = null;
  }
}

// Member, start: a RUN accepted, waiting for the STATE (resuming) and GO.
export class Acceptance {
  constructor(desc, from) {
    this.desc = desc; this.from = from;
    this.cfg = null; this.collective = null;   // once the RUN checked out
    this.early = null;          // the leader's STATE, when it arrived before the RUN checked out
    this.replica = null;        // the start weights, once built or received and checked
    this.timer = null;          // GO_WAIT
  }
}

// A roster change in progress: proposed by the (acting) leader, accepted by every member staying,
// committed by GO. kind: 'join' (joiners appended, planned ahead) | 'recovery' (departed removed).
export class RosterChange {
  constructor(msg, digest, kind, collective) {
    this.msg = msg;             // {runId, epoch, base, from, roster, joined, left, history, reason}
    this.digest = digest;       // rosterDigest(msg): what ACCEPT and GO name
    this.kind = kind;
    this.collective = collective; // the new epoch's MeshCollective, registered before anyone may use it
    this.accepts = new Set();   // leader: stayers that accepted (itself included)
    this.committed = false;     // GO sent (leader) or received (member)
    this.timer = null;          // leader: the stayers' answers' deadline
  }
}

// A recovery: the step in flight halted after evidence that a peer left.
export class Recovery {
  constructor(epoch) {
    this.epoch = epoch;         // the epoch the new roster will have
    this.leader = null;         // the acting leader in this device's view
    this.statuses = new Map();  // acting leader: id -> {completed, hash, epoch}
    this.claims = new Map();    // acting leader: id -> the peers it says it lost (claims, not evidence)
    this.parked = false;        // the loop waits in awaitRecovery (no step in flight)
    this.waiters = [];          // resolvers of the parked loop
    this.halted = '';           // acting leader: the gone set its last HALT named
    this.timer = null;          // statuses (leader) or the roster (member) not in time
    this.confirmTimer = null;   // too few survivors: the wait for the server's word
    this.judgeTimer = null;     // acting leader: survivors judged audit evidence otherwise: the wait for agreement
    this.keepAlive = null;      // acting leader: the HALT repeated while the recovery lasts
    this.promised = null;       // member: the RosterChange this device accepted (one per epoch)
    this.deferred = null;       // member: a proposal waiting for the server's word on a departure
  }
}

// Leader: a device being synced in.
export class Joiner {
  constructor(resyncs = 0) {
    this.stage = 'snapshot';    // 'snapshot' (state at the next boundary) | 'syncing' (state sent, FWD flowing)
    this.verified = null;       // the latest step its SYNCED hash matched ours
    this.admitted = null;       // the step it contributes from, once a roster naming it is committed
    this.resyncs = resyncs;     // wrong hashes reported so far
    this.sentAt = 0;            // when its state transfer was sent (the sync deadline runs from it)
    this.stateStep = 0;         // the step count of that state: FWDs run ahead of max(it, verified) by FWD_WINDOW at most
    this.ackedAt = Infinity;    // when it last confirmed a step (SYNCED matching), or its state's send completed
    this.chain = Promise.resolve();   // its sends, in order
    this.queued = 0;            // sends queued on the chain
    this.dropped = false;       // dropped (gone, stalled, past its deadline): its queued sends are skipped
  }
}

// Joiner: this idle device asking a running group to sync it in.
export class JoinAttempt {
  constructor(asked) {
    this.asked = asked;         // the training peers it sent JOIN to
    this.from = null;           // the leader that answered with SYNC
    this.timer = null;
    this.refused = false;
    this.desc = null; this.cfg = null;   // the run, once SYNC checked out
    this.roster = null; this.epoch = 0; this.history = null;
    this.snap = 0; this.hash = null;                   // the state's step and hash (SYNC's word)
    this.replica = null; this.trainer = null; this.batches = null;
    this.completed = null; this.hashNow = null;        // caught up to, by forwarded gradients
    this.fwd = new Map();       // step -> the group's G of that step
    this.change = null;         // the RosterChange naming this device (accepted, then committed)
    this.draining = null;       // the running drain of fwd
    this.early = null;          // a STATE that came before its SYNC ({from, m}: links deliver in order, the in-memory test transport does not)
    this.earlyFwd = [];         // FWDs that came before its SYNC ([{from, m}]: at most MAX_FWD_HELD, one state body's bytes), for the same reason
  }
}

// The audits of a run (run/audits.js; docs/VERIFICATION.md §13). Steps are 0-based step indexes;
// "epoch:step" keys hold frames of a roster epoch (slots are that epoch's).
// With local steps (H > 1) the audited unit is a slot's round (docs/VERIFICATION.md §13 "Rounds of
// local steps"): frames, pairs, digests, pending audits and evidence are keyed by the round's
// exchange step e; kept states are this device's own at round starts; `assigned` by round index.
export class AuditBook {
  constructor(rate, floor, unitsPerStep, span = 1) {
    this.rate = rate;            // the chance that a slot's contribution to a step is audited (auditRate, 0..1]
    this.floor = floor;          // the first step audited: the run's start or its last join or departure
    this.span = span;            // steps per audited unit: 1, or H (a round of local steps); windows of W units are W x span steps
    this.done = floor - 1;       // the last step whose audits ran here
    this.undrawn = new Set();    // steps at the run's end whose pairs this device could not draw (a member's
                                 // commitment missing): its FIN names them, so no one counts its pass there
    this.nonces = new Map();     // step -> this device's secret nonce of it (32 bytes)
    this.received = new Map();   // step -> {inHashes, losses, transcript, reduced}: what this device got in that
                                 // exchange (the last two: reduce-scatter's, MeshCollective.exchange; kept KEPT_RING steps)
    this.shardHashes = new Map();// step -> each slot's committed message hashes (hex, message order): a transcript's check
    this.stateHashes = new Map();// local steps: exchange step e -> each slot's committed Adam state hash after its round ending
                                 // at e (hex); key floor - 1: the states at the floor, which every device knows
    this.chainEpoch = null;      // local steps, after a roster change: the epoch before it, whose AUDIT of the exchange before the
                                 // floor (late here) still fills in a survivor's state hash at the floor (audit_book.js carryChain)
    this.stateAsking = new Map();// local steps: "epoch:e:k" (the slot asked) -> "epoch:e:of:k" (of: the slot whose round-start
                                 // state it is: k's own, or a departed member's its auditor k holds): the ask waited on (ROUND_STATE_ASK)
    this.roundStates = new Map();// "epoch:e:of:k" -> the state that came ({t, m, v}, decoded)
    this.stateAsked = new Map(); // the same keys -> the one ask's wait (the audit and a judgement share its answer)
    this.stateAnswered = new Set(); // "asker:epoch:of:e": states this device sent (one per asker, member and round); "asker:epoch:end": the one of the run's end's barrier
    this.passedStates = new Map(); // local steps: audited id -> {at, adam}: the state at round start `at` this device recomputed
                                 // as the auditor of its last passed round (a departure's barrier starts from it)
    this.asking = new Set();     // "epoch:step:owner slot": transcripts this device asked for and waits on
    this.transcripts = new Map();// the same keys -> the transcript that came (the owner's P messages, concatenated)
    this.asked = new Map();      // the same keys -> the one ask's wait (every check of that step shares its answer)
    this.answered = new Set();   // "asker:epoch:step": transcripts this device sent (one per asker and step)
    this.commits = new Map();    // "epoch:step" -> Map slot -> {hashes, loss, nonceHash} (AUDIT; ours included)
    this.reveals = new Map();    // "epoch:step" -> Map slot -> nonce hex (the next step's AUDIT)
    this.claimedBeacons = new Map(); // "epoch:step" -> Map slot -> the beacon a member computed
    this.tailSent = new Set();   // "epoch:step" of the tail AUDITs sent (the last step's nonce)
    this.beacons = new Map();    // step -> our beacon (hex)
    this.pairs = new Map();      // step -> [[auditor slot, audited slot]]
    this.assigned = new Map();   // step -> its audits' auditor slots, since the book opened or the last rollback (auditLoad)
    this.pending = new Map();    // "step:slot" -> {t, slot, auditor, committed}: another auditor's audit whose verdict may still
                                 // come (its pass counts for a rollback once this device checked it, or W steps passed)
    this.digests = new Map();    // step -> each slot's digest (hex)
    this.passes = new Map();     // audited id -> auditor id -> the steps after its last few audits (ascending)
    this.states = new Map();     // completed steps -> {params, m, v, t, hash}: kept states (local steps: at round starts,
                                 // params = the anchor, m, v, t this device's own)
    this.spare = [];             // states no longer kept, their arrays reused by the next (at most 2)
    this.reading = new Set();    // states a recomputation is reading (never reused meanwhile)
    this.accused = new Map();    // id -> {step, why, checked}: convicted here, its rollback not settled yet (audits before step to run);
                                 // checked: by a departure's barrier (each of its contributions before step reproduced here)
    this.skipTimer = null;       // the wait for reveals the accused withhold
    this.convicted = new Map();  // id -> {step, why, back, hash, checked}: convicted on this device's evidence, not yet rolled back
    this.excludedFrom = new Map(); // id -> the step from which the kept run leaves it out (convictions rolled back)
    this.evidence = [];          // [{from, ev}] waiting until this device ran that step's audits
    this.evidenceSeen = new Set(); // "epoch:step:slot:accuser" judged already (one recomputation each)
    this.reproduced = new Map(); // the same keys -> the digest recomputed for a relayed accusation that reproduced:
                                 // only the accuser's own frame convicts it (no second recomputation then)
    this.queued = [];            // [{t, audited, committed, epoch, batch, done, release, admitting, inflight, end}]: this
                                 // device's audits to recompute, in deadline order (done: units of it run so far;
                                 // release: lets go of the backend; admitting: the gate being passed; inflight: units;
                                 // end: local steps, the Adam state its recomputation ended with)
    this.working = null;         // the queue's worker while it runs (run/verdicts.js work)
    this.checking = null;        // an accused's earlier audits being checked here before its rollback settles
    this.departing = new Map();  // id -> {from, upTo}: a departed peer whose steps since its last settled pass this
                                 // device is checking before the roster drops it (the barrier, checkDeparture)
    this.since = floor;          // the first step of the roster since the last rollback (a departure's barrier starts here at the earliest)
    this.gateOpen = false;       // the gated recomputation's units may run (the loop waits or owes its share)
    this.units = { perStep: unitsPerStep, done: 0, sinceShare: 0 };   // units (INT8 matmuls): of a local step, run
                                 // in all, run since the last share was paid
    this.arena = null;           // the owed recomputations' arena (made on the first)
    this.judgeArena = null;      // the arena of the checks this device makes as a judge
    this.audits = 0;             // audits this device ran
  }
}

// The active run. Every field is here; see the protocol modules for who changes it.
export class Run {
  constructor({ desc, cfg, batches, trainer, replica, arena, collective, roster, epoch, history, completed, hash, extra }) {
    this.desc = desc;           // the run's descriptor (RUN): runId, config, dataId, startStep, initHash, ...
    this.cfg = cfg;             // its config
    this.batches = batches; this.trainer = trainer; this.replica = replica; this.arena = arena;
    this.collective = collective;               // the current epoch's MeshCollective
    this.roster = roster.slice();               // peer ids in slot order; slot 0 leads
    this.epoch = epoch;
    this.epochFrom = new Map([[epoch, completed]]);   // epoch -> its first step (split checks on late frames)
    this.slot = -1;             // this device's slot (set by the controller)
    this.history = history.map((e) => e.slice());     // the P schedule [[fromStep, P], ...] ([fromStep, P, slots that left] with local steps)
    this.completed = completed; // steps completed
    this.lastSent = completed - 1;              // the last step whose gradient this device sent
    this.hash = hash;           // weight hash after `completed` steps
    this.hashLog = new Map([[completed, hash]]);
    this.peerHashes = new Map(roster.map((id) => [id, hash]));
    this.extra = extra;         // what the model is trained on (kept in files)
    this.stopAfter = null; this.stopReason = ''; this.stopBy = null;   // a STOP: after which step, why, who
    this.stopAlarm = '';        // the alarm a STOP reported ('replica mismatch' | 'split alarm'), or ''
    this.fins = new Map();      // id -> its FIN {epoch, step, hash} (its first of that epoch and step): it ran every audit it owes up to there
    this.undo = null;           // one step of undo {params, m, v, t, hash, step}
    this.undoPrev = null;       // local steps: the state at the exchange before undo's (a page one round ahead goes back to it)
    this.ended = false;
    this.finishing = false;     // the end's barrier (a Stop, the last step): departures change no roster meanwhile
    this.barrierPassed = false; // every contribution it keeps is checked (else kept_check.js checks them at its end)
    this.gone = new Map();      // id -> why: THIS device's own evidence that the peer left
    this.confirmed = new Set(); // peers whose departure is confirmed (their own LEAVE)
    this.heard = new Map();     // id -> when this device last received a frame of this run from it
    this.recovery = null;       // a Recovery while the step in flight is halted
    this.change = null;         // a RosterChange proposed/accepted/committed, not yet in effect
    this.joiners = new Map();   // leader: id -> Joiner
    this.transfers = new Map(); // leader: id -> when its last state transfer was sent (outlives the Joiner)
    this.stalls = new Map();    // leader: id -> its syncs that stalled (fell FWD_WINDOW behind), until one finishes
    this.sent = { bytes: 0, waitMs: 0 };        // over the epochs' collectives already closed
    this.stepTimes = [];        // the recent steps' times (rate, pace of the deadline)
    this.ownMs = [];            // this device's own compute of each recent step (local step + apply), ms: its speed alone (speed.js)
    this.curve = [];            // [step, loss] for the plot
    this.loss = null;
    this.book = null;           // the AuditBook (null: the run is not audited, auditRate 0)
    this.ownFinite = null;      // {step, finite}: whether this device's own last local step was finite
    this.lies = [];             // [{id, step, why}]: non-finite gradients waiting for our own step's verdict
    this.computing = Promise.resolve();   // the compute backend's queue (run/audit_recompute.js exclusive)
  }
}
