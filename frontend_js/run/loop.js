// The step loop (docs/ARCHITECTURE.md "A group run"): per step s, every peer: batch (seed, s,
// slot), local step, the MeshCollective exchange (its frames carry the sender's hash after step
// s-1: the sync guard), Adam, hash. After the last step FIN {hash}: every peer checks every final
// hash. Stopping: STOP {stopAfter} from any member; every peer ends after exactly stopAfter steps
// and relays it once, so the whole run stops at one step; the panel names who stopped it.
import { TYPES } from '../mesh/frames.js';
import { ExchangeError } from '../mesh/mesh_collective.js';
import { checkLoss, isExchangeStep, withLocalState, cloneParams } from '../train.js';
import { flattenGrads, unflatten } from '../collective.js';
import { paramShapes } from '../model.js';
import { forge } from '../attack.js';
import { StepArena } from '../arena.js';
import { yieldToPage, waitUntil } from '../page_clock.js';
import { Run, HASH_LOG, RATE_WINDOW, MAX_CURVE, MAX_UNDRAWN, short, isHash } from './record.js';
import * as recovery from './recovery.js';
import * as join from './join.js';
import * as audits from './audits.js';
import { end, alarm, saveUndo, restoreUndo, runView, wakeParked, roundEnd, toRoundStart, position } from './ending.js';
import { groupSpeed } from './speed.js';

// opts: {resumed, collective} for a run that starts; a joiner also passes {roster, epoch,
// history, completed, hash, trainer, batches} of the run it enters
export function begin(ctl, desc, replica, cfg, opts) {
  const h = ctl.host;
  const roster = opts.roster || desc.roster;
  const completed = opts.completed ?? desc.startStep;
  const batches = opts.batches || h.batches(cfg, desc.dataId);
  const hash = opts.hash || desc.initHash;
  if (cfg.local_steps > 1) withLocalState(replica);      // the anchor: the group's weights at the start
  const run = new Run({
    desc, cfg, batches, replica, collective: opts.collective, roster, epoch: opts.epoch || 0,
    trainer: opts.trainer || h.trainer(cfg, replica, batches), arena: h.backend()?.newArena() ?? new StepArena(),
    history: opts.history || [[desc.startStep, roster.length]], completed, hash,
    extra: desc.extra && typeof desc.extra === 'object' ? desc.extra : { data: desc.dataId.startsWith('builtin') ? 'builtin' : 'fineweb-edu', data_id: desc.dataId },
  });
  run.slot = run.roster.indexOf(ctl.selfId);
  if (cfg.local_steps > 1) saveUndo(run);                // the state a late STOP of the first round goes back to
  audits.openBook(run, desc.auditRate ?? 0, Boolean(opts.joined));
  ctl.enter('running', run);
  h.models.adopt(cfg, replica, completed, run.extra);
  const others = roster.length - 1;
  const topology = run.collective.topology;
  h.show({ running: true, runState: 'training', leader: roster[0], config: cfg, step: completed,
           totalSteps: cfg.steps, loss: null, hash: run.hash, curve: [], tokensPerS: null, speed: null, sync: null,
           replicas: { count: roster.length, agree: true, step: completed },
           run: runView(run), peerHashes: Object.fromEntries(run.peerHashes), error: '',
           message: (opts.joined ? `Synced in: training from step ${completed + 1}` : opts.resumed ? `Resuming from step ${completed}` : 'Training')
             + (others ? ` with ${others} other device(s) (${topology === 'allgather' ? 'all-gather' : 'reduce-scatter + all-gather'}).` : ' on this device alone.') });
  h.announce();
  h.emit('run-started', { config: { ...cfg }, roster: roster.slice(), runId: desc.runId, leader: roster[0], joined: Boolean(opts.joined) });
  loop(ctl, run).catch((err) => {
    console.warn('daisy: the run failed:', err);
    end(ctl, run, 'failed', `The run stopped: ${err.message || err}`, err.message || String(err));
  });
}

async function loop(ctl, run) {
  const { cfg } = run, h = ctl.host;
  for (;;) {
    await steps(ctl, run);
    if (run.ended) return;
    // a STOP that arrived while this device applied the step past it: that step is undone
    if (run.stopAfter !== null && run.completed === run.stopAfter + 1) restoreUndo(ctl, run);
    else if (run.stopAfter !== null && cfg.local_steps > 1 && run.completed > run.stopAfter) toRoundStart(ctl, run, run.stopAfter);
    const stopped = run.stopAfter !== null && run.completed < cfg.steps;
    // the run's end (a Stop, its last step) is a barrier: nothing unaudited outlives it; a
    // conviction there goes back, the loop computes the steps again and ends through it again
    if ((run.book || !stopped) && !(await finishBarrier(ctl, run))) { if (run.ended) return; continue; }
    if (stopped) {
      // local steps stopped between exchanges: this page keeps the group's weights (the anchor), not its own
      if (run.replica.anchor != null) run.replica.params = cloneParams(run.replica.anchor);
      const by = run.stopBy && run.stopBy !== ctl.selfId ? ` by ${h.nameOf(run.stopBy)}` : '';
      end(ctl, run, 'stopped', `Stopped at step ${run.completed}${by}${run.stopReason ? ` (${run.stopReason})` : ''}.`, run.stopAlarm);
      return;
    }
    finishRun(ctl, run);
    return;
  }
}

// the steps until the run's end or its stop (returns then, or when it ended)
async function steps(ctl, run) {
  const { cfg } = run, h = ctl.host;
  let chunkStart = performance.now();
  for (;;) {
    if (run.ended) return;
    // local steps: a roster changes at a round's start; this page waits at its last one (docs/VERIFICATION.md "Local steps")
    if (run.recovery && cfg.local_steps > 1 && run.completed > run.undo.step) restoreUndo(ctl, run);
    if (run.recovery) { await recovery.awaitRecovery(ctl, run); continue; }
    const s = run.completed;
    if (s >= cfg.steps) break;
    if (run.stopAfter !== null && s >= run.stopAfter) break;
    if (run.change && run.change.msg.from === s) {
      // a planned roster takes effect here, once committed (GO) everywhere
      if (!(await recovery.awaitCommit(ctl, run))) continue;
    }
    run.arena.reset();
    const slot = run.slot;
    // a GPU result that failed its audit: the engine is on the CPU by then; redo the local step
    // the GRAD's parts go out as the backward pass finalizes them (docs/PROTOCOL.md "Streamed GRAD")
    const forging = ctl.faults.forge !== null && s >= ctl.faults.forge.from;    // the fault plan's forger
    const sink = ctl.t.streamGrads && !forging && cfg.local_steps === 1 ? run.collective.beginStep(s) : null;
    let ownMs = 0;           // this device's own compute of the step (timed inside `exclusive`: an audit's turn is not ours)
    const local = await audits.exclusive(run, () => timed((ms) => { ownMs = ms; }, () => (h.gpu ? h.gpu.withGpuFallback(run.trainer.backend.engine, () => run.trainer.localStep(s, slot, run.arena, sink))
      : run.trainer.localStep(s, slot, run.arena, sink))));
    if (forging && cfg.local_steps === 1) local.grads = forged(ctl, run, s, local.grads);
    audits.ownStep(ctl, run, s, local);
    if (run.ended) return;
    if (run.recovery) continue;                     // a departure while we computed: recompute
    if (run.stopAfter !== null && s >= run.stopAfter) break;
    if (cfg.local_steps > 1) {
      // local steps (docs/VERIFICATION.md "Local steps"): this device's own Adam step; every H
      // steps its weight delta goes out as the step's GRAD message and the group averages them
      await audits.exclusive(run, () => timed((ms) => { ownMs += ms; }, async () => run.trainer.localApply(local.grads)));
      if (run.ended) return;
      run.lastSent = s;
      if (!isExchangeStep(cfg, s)) {
        stepDone(ctl, run, s, local.loss, run.hash, ownMs);        // the anchor (run.hash) moves only at exchanges
        if (performance.now() - chunkStart > ctl.t.chunkMs) { await yieldToPage(); chunkStart = performance.now(); }
        continue;
      }
      local.grads = run.trainer.delta();
      // the fault plan's forger of rounds (attack_rounds.js contribute): its delta forged, or (moments)
      // its Adam m negated at the round's end, committed to as it is and started from (unchained: below)
      if (forging && ctl.faults.forge.kind === 'moments') negateMoments(run.replica.adam);
      else if (forging && ctl.faults.forge.kind !== 'unchained') local.grads = forged(ctl, run, s, local.grads);
    }
    if (run.roster[0] === ctl.selfId) await join.admitJoiners(ctl, run, s);
    run.lastSent = s;
    audits.idle(ctl, run);                          // the audits this device owes, beside the transfer
    let out;
    try {
      // the trainer's own message of its gradient (the resident step's, from the GPU), unless the
      // gradient sent is not the one it encoded (a forger's, a round's delta)
      const encoded = cfg.local_steps === 1 && !forging ? local.encoded ?? null : null;
      out = await run.collective.exchange(s, run.roster, slot, local.loss, local.grads, run.hash, encoded);
    } catch (err) {
      if (!(err instanceof ExchangeError)) throw err;
      if (run.ended) return;
      if (!run.recovery && run.stopAfter !== null && s >= run.stopAfter) break;   // stopped by a peer mid-exchange
      if (err.peer) recovery.evidence(ctl, run, err.peer, err.message);
      if (!run.recovery) throw err;
      continue;                                       // parks in awaitRecovery, then recomputes
    }
    if (run.ended) return;
    if (run.stopAfter !== null && s >= run.stopAfter) break;      // a STOP came while the last frames did: not applied
    if (run.recovery) continue;
    // the sync guard: every peer's hash after step s (s steps done) must equal ours
    const bad = out.hashes.map((x, i) => [run.roster[i], x]).filter(([, x]) => x !== run.hash);
    for (const [i, x] of out.hashes.entries()) run.peerHashes.set(run.roster[i], x);
    if (bad.length) {
      const who = [[ctl.selfId, run.hash], ...bad].map(([id, x]) => `${h.nameOf(id)} has ${short(x)}`).join(', ');
      alarm(ctl, run, `Replicas disagree after step ${s}: ${who}. Stopped (never fork).`, 'replica mismatch');
      return;
    }
    // the audits: this step's commitment out, the audits of step s-2 (a conviction goes back)
    if (!(await audits.afterExchange(ctl, run, s, out, local.loss))) { if (run.ended) return; continue; }
    // the fault plan's `unchained` forger: committed to its state, it goes on from another (m negated)
    if (forging && cfg.local_steps > 1 && ctl.faults.forge.kind === 'unchained') negateMoments(run.replica.adam);
    await audits.payShare(ctl, run, s);             // this step's share of the audit work, then the gate shuts
    if (run.ended) return;
    if (run.recovery) continue;
    if (run.stopAfter !== null && s >= run.stopAfter) break;
    if (cfg.local_steps === 1) saveUndo(run);          // (local steps keep the state after each exchange instead)
    const applied = await audits.exclusive(run, () => timed((ms) => { ownMs += ms; },
      () => (cfg.local_steps > 1 ? run.trainer.outer(out.grads) : run.trainer.apply(out.grads))));
    if (run.ended) return;
    stepDone(ctl, run, s, out.loss, applied.hash, ownMs);
    if (cfg.local_steps > 1) saveUndo(run);             // local steps: a late STOP goes back to the last exchange
    if (run.roster[0] === ctl.selfId && run.joiners.size) join.forwardToJoiners(ctl, run, s, out.flat);
    // the deadline follows the group's pace: a slow group (big settings, phones) is not "gone"
    const t = run.stepTimes, n = t.length;
    if (n > 2) run.collective.deadlineMs = Math.max(ctl.t.deadlineMs, ctl.t.deadlineSteps * (t[n - 1] - t[0]) / (n - 1));
    if (performance.now() - chunkStart > ctl.t.chunkMs) { await yieldToPage(); chunkStart = performance.now(); }
  }
}

// step s is done: its hash (the weights', or with local steps the group's anchor), the panel
function stepDone(ctl, run, s, loss, hash, ownMs) {
  checkLoss(loss, s + 1);
  run.completed = s + 1;
  run.hash = hash;
  run.hashLog.set(s + 1, hash);
  run.hashLog.delete(s + 1 - HASH_LOG);
  run.peerHashes.set(ctl.selfId, hash);
  audits.keepState(run);
  run.ownMs.push(ownMs);
  if (run.ownMs.length > RATE_WINDOW) run.ownMs.shift();
  report(ctl, run, s + 1, loss);
  ctl.host.stored?.afterStep(run);          // the leader stores the group's run (stored_run.js)
}

// f() timed: its milliseconds to done(ms), then its result
async function timed(done, f) {
  const t0 = performance.now();
  const out = await f();
  done(performance.now() - t0);
  return out;
}

// the fault plan's forged gradient (attack.js forge), from the honest one
function forged(ctl, run, s, grads) {
  const { kind, factor = 1 } = ctl.faults.forge;
  const shapes = paramShapes(run.cfg);
  const flat = flattenGrads(grads, shapes.map(([n]) => n));
  return unflatten(forge(kind, factor, flat, run.cfg.seed, s, run.slot), shapes);
}

function negateMoments(adam) {
  for (const m of Object.values(adam.m)) for (let i = 0; i < m.length; i++) m[i] = -m[i];
}

function report(ctl, run, step, loss) {
  const h = ctl.host;
  const now = performance.now();
  run.stepTimes.push(now);
  if (run.stepTimes.length > RATE_WINDOW) run.stepTimes.shift();
  const n = run.stepTimes.length, P = run.roster.length;
  const speed = groupSpeed({ stepTimes: run.stepTimes, ownMs: run.ownMs, tokensPerDevice: run.cfg.batch * run.cfg.seq_len, P });
  const rate = n > 1 ? speed.tokensPerS : null;
  run.curve.push([step, loss]);
  if (run.curve.length > MAX_CURVE) run.curve = run.curve.filter((_, i) => i % 2 === 0 || i === run.curve.length - 1);
  run.loss = loss;
  h.models.step = step;
  // peers' hashes arrive one step late (with the next step's frames): agreement is at step-1
  h.show({ step, loss, hash: run.hash, tokensPerS: rate, speed, peerHashes: Object.fromEntries(run.peerHashes), curve: run.curve,
           replicas: { count: P, agree: true, agreeing: P, step: P > 1 ? step - 1 : step },
           audits: { rate: run.book?.rate ?? 0, through: run.book ? run.book.done + 1 : 0, span: run.book?.span ?? 1 } });
  h.emit('step', { step, loss, hash: run.hash, peers: P });
}

// The run's end is a barrier (docs/PROTOCOL.md "Audited gradients"): this device runs every audit
// it owes, then FIN {epoch, step, hash} tells every member it did (and where it ends); once every
// member still here said so (or finWaitMs passed), every contribution not covered by a passed
// audit is recomputed here (audit_barriers.js checkEnd). Meanwhile a departure changes no roster (the run
// ends anyway; its steps are checked with the others'); only a conviction does: -> false then
// (the recovery goes back, the loop computes the steps again and ends through here again)
async function finishBarrier(ctl, run) {
  run.finishing = true;
  const passed = await barrier(ctl, run);
  if (!passed) run.finishing = false;
  run.barrierPassed = passed && !run.ended;
  return run.barrierPassed;
}

async function barrier(ctl, run) {
  // a conviction whose recovery a Stop cut short goes on first: the end keeps no lie
  for (const id of audits.convictedIds(run)) if (!run.recovery) ctl.convicted(run, id, `${ctl.host.nameOf(id)} was convicted before the run ended`);
  if (run.recovery) return false;
  if (!(await audits.flush(ctl, run))) return false;
  const others = run.roster.filter((id) => id !== ctl.selfId);
  // (undrawn: the steps whose audits this device could not draw: a pass of them it was drawn for
  // elsewhere is no pass, checkEnd)
  const undrawn = run.book ? [...run.book.undrawn].filter((t) => t > run.completed - MAX_UNDRAWN).sort((x, y) => x - y) : [];
  const fin = { runId: run.desc.runId, epoch: run.epoch, step: run.completed, hash: run.hash, undrawn };
  run.fins.set(ctl.selfId, fin);
  await Promise.all(others.map((id) => ctl.mesh.sendJson(id, TYPES.FIN, fin, { runId: run.desc.runId, slot: run.slot }).catch(() => {})));
  await waitUntil(() => run.ended || run.recovery !== null || others.every((id) => finOf(run, id) !== null || run.gone.has(id)), ctl.t.finWaitMs,
    (wake) => ctl.mesh.on(TYPES.FIN, wake), (wake) => ctl.onEnded(wake), (wake) => ctl.onPoke(wake));
  if (run.ended || run.recovery) return false;
  return audits.checkEnd(ctl, run);
}

// a member's FIN of this epoch and step: its final hash, or null
export function finOf(run, id) {
  const f = run.fins.get(id);
  return f && f.epoch === run.epoch && f.step === run.completed ? f.hash : null;
}

// after the last step, the barrier passed: every final hash must agree. A FIN that disagrees is an
// alarm on this page (it says whose), never a reason to drop anyone.
function finishRun(ctl, run) {
  const h = ctl.host;
  const others = run.roster.filter((id) => id !== ctl.selfId);
  const missing = others.filter((id) => finOf(run, id) === null);
  const bad = others.filter((id) => finOf(run, id) !== null && finOf(run, id) !== run.hash);
  for (const id of others) if (finOf(run, id) !== null) run.peerHashes.set(id, finOf(run, id));
  h.show({ peerHashes: Object.fromEntries(run.peerHashes),
           replicas: { count: run.roster.length, agree: !bad.length, agreeing: run.roster.length - bad.length - missing.length, step: run.completed } });
  if (bad.length) {
    // the sync guard already checked every hash up to the last step: a wrong FIN is one peer's word
    end(ctl, run, 'done', `Run finished: ${run.completed} steps; ${bad.map((id) => `${h.nameOf(id)} reports the final hash ${short(finOf(run, id))}`).join(', ')}, this device ${short(run.hash)} (every step before was checked by the sync guard).`, '');
    return;
  }
  const note = missing.length ? ` (no final hash from ${missing.map((id) => h.nameOf(id)).join(', ')})` : '';
  const loss = run.loss === null ? '' : `, loss ${run.loss.toFixed(4)}`;
  end(ctl, run, 'done', `Run finished: ${run.completed} steps${loss}${run.roster.length > 1 ? `, ${run.roster.length - missing.length} replicas agree` : ''}${note}.`, '');
}

// run: the running one, or the one that just ended here (a member's FIN may come after this page
// passed the barrier without it: that member is still owed one state at the end's barrier,
// round_states.js onRoundStateAsk, and asks for it after its FIN)
export function onFin(ctl, from, m, run = ctl.at) {
  const d = m.json;
  if (d.runId !== run.desc.runId || !run.roster.includes(from) || !isHash(d.hash) || !Number.isInteger(d.epoch) || !Number.isInteger(d.step)) { ctl.mesh.drop(from, m, 'FIN for no run of ours'); return; }
  if (!Array.isArray(d.undrawn) || d.undrawn.length > MAX_UNDRAWN || !d.undrawn.every(Number.isInteger)) { ctl.mesh.drop(from, m, `FIN without its undrawn steps (at most ${MAX_UNDRAWN} integers)`); return; }
  // its first of an epoch and step (a rollback ends again, in a new epoch)
  const had = run.fins.get(from);
  if (!had || had.epoch !== d.epoch || had.step !== d.step) run.fins.set(from, { epoch: d.epoch, step: d.step, hash: d.hash, undrawn: d.undrawn.slice() });
  ctl.poke();                    // (an ask of this device's state at the end's barrier may wait for it)
}

// ---- stopping ---------------------------------------------------------------------------------
// The user's Stop: every peer ends after the steps this device has sent gradients for.
export function stop(ctl, reason = '') {
  const run = ctl.run;
  if (!run || run.ended) return false;
  // (local steps: after the round's exchange, which no page has passed yet; every page stops on the group's weights)
  const stopAfter = run.recovery ? position(run) : run.cfg.local_steps > 1 ? roundEnd(run.cfg, run.completed) : run.lastSent + 1;
  setStop(ctl, run, stopAfter, ctl.selfId, reason || `stopped on ${ctl.host.nameOf(ctl.selfId)}`);
  ctl.host.show({ message: 'Stopping after the current step…' });
  return true;
}

// every member ends after stopAfter steps; the first word of it is relayed to every member (so
// a STOP sent to one page stops the run everywhere at one step, never splits it)
export function setStop(ctl, run, stopAfter, by, reason, alarmed = '') {
  if (run.stopAfter !== null && run.stopAfter <= stopAfter) return;
  run.stopAfter = stopAfter;
  run.stopBy = by;
  run.stopReason = reason;
  run.stopAlarm = alarmed;
  ctl.tellAll(run, TYPES.STOP, { runId: run.desc.runId, stopAfter, reason, by, ...(alarmed ? { alarm: alarmed } : {}) });
  // an exchange of a step past the stop can never complete: end it now
  if (run.lastSent >= run.stopAfter) run.collective.fail(new ExchangeError('stopped'));
  if (run.recovery) wakeParked(ctl, run);
}

export function onStop(ctl, from, m) {
  const run = ctl.at, d = m.json;
  if (d.runId !== run.desc.runId || !run.roster.includes(from) || !Number.isInteger(d.stopAfter)) { ctl.mesh.drop(from, m, 'STOP for no run of ours'); return; }
  // at the end's barrier this device's steps are final: a STOP before them comes too late
  if (run.finishing && d.stopAfter < run.completed) { ctl.mesh.drop(from, m, `STOP after step ${d.stopAfter}: this device's run ends at step ${run.completed} (its end's barrier)`); return; }
  const local = run.cfg.local_steps > 1;
  const low = local ? Math.min(run.undoPrev?.step ?? run.undo?.step ?? run.completed, run.completed) : run.completed - 1;
  if (d.stopAfter < low || d.stopAfter > run.lastSent + 1 + run.cfg.local_steps) { ctl.mesh.drop(from, m, `STOP after step ${d.stopAfter}, this device is at ${run.completed}`); return; }
  const reason = String(d.reason || '').slice(0, 400);
  // who stopped it is what this device saw: the frame's sender. A member it names (`by`, a
  // relay's) is the sender's claim and is shown as one; the reason is the sender's words too
  const claimed = typeof d.by === 'string' && d.by !== from && run.roster.includes(d.by) ? d.by : null;
  const says = claimed ? `which says ${ctl.host.nameOf(claimed)} asked: ` : '';
  if (d.stopAfter < run.completed && (!(local ? toRoundStart(ctl, run, d.stopAfter) : restoreUndo(ctl, run)) || run.completed !== d.stopAfter)) {
    end(ctl, run, 'stopped', `${reason} — stopped by ${ctl.host.nameOf(from)}${claimed ? `, ${says.slice(0, -2)}` : ''}; this device could not step back to ${d.stopAfter}`, 'cannot meet the group');
    return;
  }
  // an alarm it reports is its word: the run stops (any member may stop it), nobody is removed
  const alarmed = ALARMS.has(d.alarm) ? d.alarm : d.mismatch === true ? 'replica mismatch' : '';
  setStop(ctl, run, d.stopAfter, from, `${says}${reason || 'stopped'}`, alarmed);
}

const ALARMS = new Set(['replica mismatch', 'split alarm']);
