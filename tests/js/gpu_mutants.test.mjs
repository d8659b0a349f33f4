// The GPU bug corpus's patches (tests/gpu/mutants.js) against the kernels as they are now, without a
// GPU: every edit of every mutant finds its text exactly once in its kernel, so the browser tests
// (tests/test_webgpu.py, tests/test_webgpu_f64.py) run each mutant on today's kernel; and a kernel
// that changed under a patch is refused loudly, naming the mutant.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { GEMM_MUTANTS, F64_MUTANTS, RESIDENT_MUTANTS, StaleMutant, applyMutant } from '../gpu/mutants.js';

const kernel = (name) => readFileSync(new URL(`../../kernels/${name}`, import.meta.url), 'utf8');

test('every mutant applies to its live kernel and changes it', () => {
  const mutants = [...GEMM_MUTANTS, ...F64_MUTANTS, ...RESIDENT_MUTANTS];
  assert.equal(new Set(mutants.map((m) => m.id)).size, mutants.length, 'mutant ids are unique');
  for (const m of mutants) {
    const text = kernel(m.kernel), out = applyMutant(m, text);
    assert.ok(m.failure && m.mustFail && m.edits.length >= 1, m.id);
    for (const [find, replace] of m.edits) {
      assert.notEqual(find, replace, `${m.id}: an edit that changes nothing`);
      if (replace) assert.ok(out.includes(replace), `${m.id}: the replacement is not in the mutated kernel`);
    }
    assert.notEqual(out.slice(out.indexOf('\n') + 1), text, `${m.id} left kernels/${m.kernel} unchanged`);
  }
});

test('a kernel that changed under a patch is refused, naming the mutant', () => {
  const m = GEMM_MUTANTS.find((x) => x.id === 'unsigned_dot');
  const changed = kernel(m.kernel).replace('dot4I8Packed(a[i], w[j])', 'dot4I8Packed(w[j], a[i])');
  assert.throws(() => applyMutant(m, changed), (e) => e instanceof StaleMutant && /mutant unsigned_dot: edit 1 .* occurs nowhere in kernels\/gemm_packed\.wgsl/.test(e.message));
  const twice = kernel(m.kernel) + '\n// acc[i * MAX_R + j] += dot4I8Packed(a[i], w[j]);\n';
  assert.throws(() => applyMutant(m, twice), /occurs more than once/);
});
