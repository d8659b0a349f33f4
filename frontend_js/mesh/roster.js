// The run's roster rules (docs/ARCHITECTURE.md "Membership"): pure functions, so the run
// controller (frontend_js/run/) and the Node tests apply exactly the same ones.
//
// A run's roster is its peer ids in slot order: slot 0 is the leader, the others follow in
// order of entry into the run (seniority). The roster changes only at step boundaries, as a new
// epoch: departed peers are removed (the others keep their order and close up), admitted
// joiners are appended. Every step is computed by the roster of its epoch; since replicas are
// identical, the reference reproduces a run from its P schedule alone (`history`, the
// `--roster` schedule of python -m daisy.train).
import { jsSha } from '../hashing.js';

// Frames of epoch e of run r carry runId r + e in their header: a frame of an older epoch (a
// step computed by a roster that no longer holds) can never be taken for one of the current.
// Run ids are drawn below 2^31 so r + e never wraps or hits 0.

export const MAX_RUN_ID = 0x7fffffff;
export const epochKey = (runId, epoch) => (runId + epoch) >>> 0;

// the acting leader: the most senior peer of the roster not known to be gone
export function actingLeader(roster, gone) {
  return roster.find((id) => !gone.has(id)) ?? null;
}

// Whether survivors may go on without the peers in `gone`, with no risk that two sides both go
// on (a fork), even when ONE member lies to both sides (docs/PROTOCOL.md "One lying member"):
// the survivors are a quorum larger than (P + 1) / 2, so any two quorums share at least two
// members, one of them honest, and an honest member accepts one successor per epoch; or every
// removed peer is known to have left (its own goodbye, or the signaling server saw its
// connection end: a peer the server saw leave cannot go on either, it lost the server too and
// would need the same word about the others, which the server, seeing them connected, never
// gives).
export function mayGoOn(roster, gone, confirmed) {
  const survivors = roster.filter((id) => !gone.has(id));
  if (2 * survivors.length > roster.length + 1) return true;
  return roster.every((id) => !gone.has(id) || confirmed.has(id));
}

// The exact roster a change names: what every member staying checks and accepts, and what the
// leader's GO commits. A canonical JSON of the fields that decide the run's future, hashed.
export function rosterDigest(msg) {
  const { runId, epoch, base, from, roster, history } = msg;
  return jsSha.hexOf([new TextEncoder().encode(JSON.stringify([runId, epoch, base, from, roster, history]))]);
}

// the P schedule after a roster of P peers takes effect at step `from` (a 0-based step index):
// entries after `from` are undone (a recomputed step), one at `from` is replaced
export function scheduleWith(history, from, P) {
  const h = history.filter(([f]) => f < from);
  if (!h.length || h[h.length - 1][1] !== P) h.push([from, P]);
  return h;
}

// A run of local steps (docs/VERIFICATION.md "Local steps"): the P schedule after the slots `left`
// of the current roster (P peers) leave and `joined` joiners are appended at round start `from`.
// Each replica's Adam state is its own, so an entry names the slots that left ([from, P', slots]:
// --roster STEP:PEERS:SLOTS; P' above the slots that stay: joiners after them). A change at that
// same round start that is redone (a departure before the round's exchange) is folded in: its
// slots and these, counted in the roster before it (a joiner of it that leaves is one joiner
// less). At the run's start every replica holds the same state: no slots.
export function scheduleLocal(history, from, P, left, joined = 0) {
  const h = history.filter(([f]) => f < from).map((e) => e.slice());
  const next = P - left.length + joined;
  if (!h.length) return [[from, next]];
  const at = history.find(([f]) => f === from);
  const before = at ? h[h.length - 1][1] : P;                  // the roster the slots are counted in
  const redone = at && at.length === 3 ? at[2] : [];
  const stayed = [...Array(before).keys()].filter((i) => !redone.includes(i));   // then that change's joiners
  const slots = [...redone, ...left.filter((j) => j < stayed.length).map((j) => stayed[j])].sort((x, y) => x - y);
  if (slots.length) h.push([from, next, slots]);
  else if (h[h.length - 1][1] !== next) h.push([from, next]);
  return h;
}

// the slots of `roster` whose ids `next` drops
export const leftSlots = (roster, next) => roster.map((id, i) => (next.includes(id) ? -1 : i)).filter((i) => i >= 0);

// the --roster argument of python -m daisy.train for a history
export const scheduleString = (history) => history.map((e) => (e.length === 3 ? `${e[0]}:${e[1]}:${e[2].join('.')}` : `${e[0]}:${e[1]}`)).join(',');

// Whether a roster names a device this device keeps out (keptOut: id -> why) -> null or why not:
// a page whose user said "don't train with this device" (or whose room host removed it) neither
// proposes nor accepts a roster with it (docs/PROTOCOL.md "One lying member" 6).
export function keptOutOf(roster, keptOut, nameOf = (id) => id) {
  const id = (roster || []).find((x) => keptOut && keptOut.has(x));
  return id === undefined ? null : `it includes ${nameOf(id)}, which this device keeps out (${keptOut.get(id)})`;
}

// Checks a ROSTER message {epoch, from, roster} against what this peer knows; -> null or why not.
//   current: {roster, epoch, completed, selfId, keptOut?, back?, round?}; sender: the peer it came from.
// A planned change (joiners admitted) keeps every current member and appends; it starts one to
// three steps after this peer's completed count (announced two steps ahead, so that every member
// has accepted it and seen the GO before it applies). A recovery removes departed peers only and restarts at completed or completed - 1
// (this peer then undoes its last step); with local steps `completed` is the round start this peer
// holds and `back` the one before it (a peer one round ahead goes back a round), and joiners
// enter at one of the next three round starts (`round` = H): the leader proposes the round start
// after its next from its exchange, while a member may still hold the round start before (it
// applies that exchange after its audits' share: the per-step rule's completed + 3, in rounds).
export function checkRoster(msg, current, sender) {
  const { roster, epoch, from } = msg;
  if (!Array.isArray(roster) || !roster.length || roster.length > 64 || !roster.every((x) => typeof x === 'string' && x.length <= 64)
      || new Set(roster).size !== roster.length) return 'a malformed roster';
  if (!Number.isInteger(epoch) || epoch <= current.epoch || epoch > current.epoch + 1000) return `epoch ${epoch} is not after this peer's ${current.epoch}`;
  if (!Number.isInteger(from)) return 'no start step';
  if (roster[0] !== sender) return 'the sender is not the new roster\'s leader';
  if (!roster.includes(current.selfId)) return 'the roster drops this device, which is here';
  const out = keptOutOf(roster, current.keptOut);
  if (out) return out;
  const kept = current.roster.filter((id) => roster.includes(id));
  const added = roster.filter((id) => !current.roster.includes(id));
  if (kept.some((id, i) => roster[i] !== id)) return 'the roster reorders its members';
  // the sender is the most senior of the current roster still in it
  if (current.roster.indexOf(sender) < 0 || current.roster.slice(0, current.roster.indexOf(sender)).some((id) => roster.includes(id))) {
    return 'the sender is not the most senior member';
  }
  if (added.length && kept.length !== current.roster.length) return 'a roster both adds and removes peers';
  if (added.length) {
    // (local steps, current.round = H: at a round start within the next three, this peer's position a round start)
    const H = current.round ?? 1;
    const early = H > 1 ? from % H !== 0 || from <= current.completed || from > current.completed + 3 * H
      : from < current.completed + 1 || from > current.completed + 3;
    if (early) return `joiners from step ${from + 1}, this peer is at ${current.completed}`;
  } else if (from !== current.completed && from !== (current.back ?? current.completed - 1)) {
    return `a recovery from step ${from + 1}, this peer is at ${current.completed}`;
  }
  return null;
}
