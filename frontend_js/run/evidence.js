// Evidence as it arrives (run/audits.js has the overview): a member's EVIDENCE frame, queued for
// judging once this device ran that step's audits itself (verdicts.js drainEvidence), and the
// cheap checks of a gradient on arrival (mesh_collective.js): wrong size or malformed convicts at
// once, non-finite only against this device's own finite gradient of that step.
// Imports: verdicts.js. Exports: onEvidence, onLie, judgeHalted, ownStep.
import { isHash } from './record.js';
import { evidenceKey, drainEvidence, convict, advance } from './verdicts.js';

// a member's evidence: checked once this device ran that step's audits itself. Its sender is the
// accuser (its own word) or relays another member's (docs/PROTOCOL.md "Audited gradients"): a
// relay is checked against the same pairs and commitments this device holds, and convicts only
// what this device recomputes itself (the accused, when its contribution does not reproduce); a
// relayed accusation that reproduces convicts nobody (only the accuser's own frame names it) and
// is a bad frame, as is one naming no audit. A relay of evidence judged here already is dropped
// without counting (every honest member relays it once).
export function onEvidence(ctl, from, m) {
  const run = ctl.at, d = m.json, b = run.book;
  const sender = run.roster.indexOf(from);
  if (b && d.runId === run.desc.runId && Number.isInteger(d.epoch) && d.epoch < run.epoch) return;   // a late frame of an epoch this device left
  if (!b || d.runId !== run.desc.runId || sender < 0 || !Number.isInteger(d.accuser) || d.accuser < 0 || d.accuser >= run.roster.length
      || !Number.isInteger(d.step) || !Number.isInteger(d.slot)
      || !isHash(d.committed) || !isHash(d.recomputed) || d.epoch !== run.epoch || (d.kind !== undefined && d.kind !== 'reduce')) { ctl.mesh.drop(from, m, 'EVIDENCE for no audited run of ours'); return; }
  if (d.accuser !== sender && b.evidenceSeen.has(evidenceKey(run.epoch, d))) return;      // a relay of evidence judged here
  if (b.evidence.length >= run.roster.length * 2) { ctl.mesh.drop(from, m, 'too much evidence at once'); return; }
  b.evidence.push({ from, ev: d });
  (run.recovery ? advance(ctl, run) : drainEvidence(ctl, run)).catch((err) => console.warn('daisy: checking evidence failed:', err));
}

// ---- cheap checks (mesh_collective.js, on arrival) ------------------------------------------------
// A gradient of the wrong size or malformed convicts its sender at once; a non-finite one only
// when this device's own gradient of that step is finite (an honest run that diverged lies to
// nobody), so it waits for our local step when it came first.
export function onLie(ctl, collective, slot, step, lie) {
  const run = ctl.run;
  if (!run || run.collective !== collective) return;
  const id = collective.roster[slot];
  const why = `gradient from ${ctl.host.nameOf(id)} ${lie.why} at step ${step + 1}: removed`;
  if (!lie.nonFinite || run.ownFinite?.step === step) {
    if (!lie.nonFinite || run.ownFinite.finite) convict(ctl, run, id, step, why);
    return;
  }
  if (run.lies.length < run.roster.length) run.lies.push({ id, step, why });
  if (run.recovery) judgeHalted(ctl, run);
}

// a recovery halts the loop before our own local step of the lie's step: nothing will tell, so
// the lie counts (our replica is finite: it completed the steps before)
export function judgeHalted(ctl, run) {
  const lies = run.lies;
  run.lies = [];
  for (const x of lies) convict(ctl, run, x.id, x.step, x.why);
}

// the loop's local step of `step` is done: the verdict on non-finite gradients that came first
export function ownStep(ctl, run, step, local) {
  let finite = Number.isFinite(local.loss);
  for (const g of Object.values(local.grads)) {
    if (!finite) break;
    for (let i = 0; i < g.length; i++) if (!Number.isFinite(g[i])) { finite = false; break; }
  }
  run.ownFinite = { step, finite };
  const now = run.lies.filter((x) => x.step === step);
  run.lies = run.lies.filter((x) => x.step > step);
  if (finite) for (const x of now) convict(ctl, run, x.id, x.step, x.why);
}
