// Shared by tests/js/attacks.test.mjs and bench/bench_audit.mjs: an audited run under attack in
// process (frontend_js/attack.js), its kept timeline, the reference run of its roster schedule
// (frontend_js/train.js Group, resized per step as daisy.train --roster does), and the steps each
// attack took to be caught. Not a test file itself.
import { makeConfig } from '../../frontend_js/config.js';
import { Group, peersAt } from '../../frontend_js/train.js';
import { AuditedRun, parseAttack } from '../../frontend_js/attack.js';
import { RoundAuditedRun } from '../../frontend_js/attack_rounds.js';
import { DEFAULT_AUDIT_RATE } from '../../frontend_js/audit.js';
import { stream } from './group_runs.mjs';

// a Printer that keeps what it is told
class Recorder {
  constructor() {
    this.steps = new Map();       // step number -> {loss, hashes}: the last computed (the kept timeline)
    this.events = [];             // {step, peer, why, back} per removal
    this.computed = 0;            // steps computed, recomputed ones included
    this.agree = true;
  }

  step(step, loss, hashes) {
    this.agree = this.agree && new Set(hashes).size === 1;
    this.steps.set(step, { loss, hashes });
    this.computed++;
  }

  left(step, peer) {
    this.events.push({ step, peer, left: true });
  }

  removed(step, peer, why, back) {
    this.events.push({ step, peer, why, back });
    for (const t of [...this.steps.keys()]) if (t > back) this.steps.delete(t);
  }
}

// -> {rec, run, cfg}: `steps` steps of an audited run of `peers` peers under `attack` (a spec string
// or null) on `backend` (engines.js; the JS mirror by default); `until(rec)` may end it early.
// With settings.local_steps > 1 the audited run of rounds (attack_rounds.js)
export async function attackedRun({ settings, peers, attack, rate = DEFAULT_AUDIT_RATE, steps, until = () => false, backend = undefined }) {
  const cfg = makeConfig({ steps: 100, ...settings });
  const group = new Group(cfg, peers, stream, backend);
  const Runner = cfg.local_steps > 1 ? RoundAuditedRun : AuditedRun;
  const run = new Runner(cfg, group, attack === null ? null : parseAttack(attack), rate);
  const rec = new Recorder();
  // (a run that reaches `steps` ends through the end's barrier, AuditedRun.finish, as the CLI's does)
  for (;;) {
    while (run.group.replicas[0].step < steps && !until(rec)) await run.step(rec);
    if (until(rec) || !(await run.finish(steps, rec))) break;
  }
  return { rec, run, cfg };
}

// "0:3,38:2" -> the Group run of that schedule: Map step number -> {loss, hashes}
export async function rosterRun(cfg, roster, steps, backend = undefined) {
  const schedule = roster.split(',').map((e) => e.split(':').map(Number));
  const g = new Group(cfg, schedule[0][1], stream, backend);
  const out = new Map();
  for (let s = 0; s < steps; s++) {
    g.resize(peersAt(schedule, s));
    const r = await g.step();
    out.set(r.step, { loss: r.loss, hashes: r.hashes });
  }
  return out;
}

// the attacked steps it took to remove `peer` (the detecting step counts): conviction step - from,
// or null if it was never removed
export function stepsToDetection(rec, peer, from) {
  const e = rec.events.find((ev) => ev.peer === peer);
  return e ? e.step - from : null;
}

export const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
