// The audit schedule's counts (bench/bench_audit_schedule.mjs, deterministic; docs/VERIFICATION.md
// §13 "The schedule", "Rounds of local steps"): per step (H = 1) they are the table TEST_RESULTS.md
// published before rounds were counted ("The audit schedule"), and a round of H local steps, its
// share counted in rounds, costs the same per step while every verdict comes within W rounds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AUDIT_WINDOW } from '../../frontend_js/audit.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const bench = (...args) => JSON.parse(execFileSync(process.execPath, ['bench/bench_audit_schedule.mjs', ...args, '--json'], { cwd: ROOT, encoding: 'utf8' }));

test('audit schedule counts: H = 1 is the published table; rounds of 4 cost the same per step, verdicts within W rounds', () => {
  const { rows } = bench('--rates', '0.1', '--local-steps', '1,4');
  const of = (H) => rows.filter((r) => r.H === H);
  // q = 0.1, P = 2..8: the ratios TEST_RESULTS.md "The audit schedule" printed from the per-step bench
  assert.deepEqual(of(1).map((r) => r.ratio.toFixed(3)), ['0.881', '0.880', '0.880', '0.878', '0.881', '0.874', '0.877']);
  for (const [one, four] of of(1).map((r, i) => [r, of(4)[i]])) {
    assert.equal(four.P, one.P);
    assert.ok(Math.abs(four.ratio - one.ratio) <= 0.01, `P ${one.P}: H 4 keeps ${four.ratio}, H 1 ${one.ratio}`);
    assert.ok(four.ratio >= 0.85, `P ${four.P}: ratio ${four.ratio} < 0.85`);
    assert.ok(four.lagMax < AUDIT_WINDOW, `P ${four.P}: a verdict ${four.lagMax} rounds after its round`);
    assert.ok(Math.abs(four.perPage - 0.1) < 0.01, `P ${four.P}: a page's mean share ${four.perPage} local steps per step`);
  }
});

// the pages call shareUnits once per round, at its exchange, with a book of span H (run/loop.js
// payShare): counting its deadlines and its least share in rounds, it pays what the rounds model pays
test('audit schedule counts: the share as the pages pay it (span H, once per round) = the share counted in rounds', () => {
  const rounds = bench('--rates', '0.1', '--local-steps', '4,16').rows, pages = bench('--rates', '0.1', '--local-steps', '4,16', '--share', 'pages').rows;
  assert.equal(pages.length, rounds.length);
  for (const [i, r] of rounds.entries()) {
    const p = pages[i];
    assert.deepEqual([p.H, p.P, p.ratio, p.perPage, p.lagMax], [r.H, r.P, r.ratio, r.perPage, r.lagMax], `H ${r.H} P ${r.P}`);
  }
});
