// Audited rounds of local steps over the mesh (docs/VERIFICATION.md §13 "Rounds of local steps",
// "Pages (open)"; frontend_js/run/audits.js): run controllers over the in-memory transport
// (run_harness.mjs), local_steps H = 4, every page drawing the reference run's nonces, the fault
// plan's test hook auditRounds lifting the pages' refusal of audits with local steps. Each honest
// page must end with exactly the reference run (frontend_js/attack_rounds.js RoundAuditedRun,
// itself tested equal to python -m daisy.train --local-steps 4 --attack), hash for hash.
//   1. nobody lies, every round of every slot audited (rate 1): the plain run of local steps, and
//      the pages ran exactly the reference's audits (each auditor got the audited slot's state at
//      the round's start, ROUND_STATE, and its round reproduced)
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Group, SETTINGS, BACKEND, firstOffReference } from './run_harness.mjs';
import { attackedRun } from './attack_runs.mjs';

const STEPS = 100;          // the shortest run a config allows
const H = 4;

// -> {nodes, g}: a group of `peers`, slot `liar` with `faults`, all with the reference's nonces
async function audited(peers, liar, faults, settings) {
  const g = new Group({ seed: 21 });
  const nodes = [];
  for (let i = 0; i < peers; i++) nodes.push(...g.add(1, { faults: { referenceNonces: true, auditRounds: true, ...(i === liar ? faults : {}) } }));
  await g.linked();
  await nodes[0].ctl.start({ ...SETTINGS, steps: STEPS, local_steps: H, ...settings });
  return { g, nodes };
}

const convictions = (n) => n.events.filter(([e]) => e === 'convicted').map(([, p]) => p);

test('an honest audited run of local steps (P = 3, H = 4, every round audited) = the plain run, with the reference\'s audits', async () => {
  const { run: ref } = await attackedRun({ settings: { ...SETTINGS, steps: STEPS, local_steps: H }, peers: 3, attack: null, rate: 1, steps: STEPS, backend: BACKEND });
  const { g, nodes } = await audited(3, -1, {}, { auditRate: 1 });
  try {
    await g.ended(nodes, 90_000);
    for (const n of nodes) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.equal(n.completed, STEPS);
      assert.deepEqual(convictions(n), [], `${n.id} convicted nobody`);
      assert.equal(await firstOffReference(n), null);
      assert.deepEqual(n.run.history, [[0, 3]]);
    }
    const audits = nodes.reduce((x, n) => x + n.run.book.audits, 0);
    assert.equal(audits, ref.audits, `the pages ran ${audits} audits, the reference ${ref.audits}`);
    assert.ok(audits >= 3 * (STEPS / H) - 3, `every round of every slot audited: ${audits}`);
  } finally { await g.close(); }
});
