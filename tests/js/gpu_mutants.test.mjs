// The GPU bug corpus's patches (tests/gpu/mutants.js) against the kernels as they are now, without a
// GPU: every edit of every mutant finds its text exactly once in its kernel, so the browser tests
// (tests/test_webgpu.py, tests/test_webgpu_f64.py) run each mutant on today's kernel; and a kernel
// that changed under a patch is refused loudly, naming the mutant.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { GEMM_MUTANTS, F64_MUTANTS, RESIDENT_MUTANTS, StaleMutant, applyMutant } from '../gpu/mutants.js';
import { GEMM_BODY, GEMM_KERNELS } from '../../frontend_js/gpu/gemm_kernel.js';

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
  const changed = kernel(m.kernel).replace('dot4I8Packed(a, b)', 'dot4I8Packed(b, a)');
  assert.throws(() => applyMutant(m, changed), (e) => e instanceof StaleMutant && /mutant unsigned_dot: edit 1 .* occurs nowhere in kernels\/dot4_packed\.wgsl/.test(e.message));
  const twice = kernel(m.kernel) + '\n// return dot4I8Packed(a, b);\n';
  assert.throws(() => applyMutant(m, twice), /occurs more than once/);
});

test('the GEMM variants are one body: each dot4 file defines dot4 alone, the body calls it and every GEMM mutant runs with a variant', () => {
  const body = kernel(GEMM_BODY);
  assert.ok(body.includes('dot4(a[i], w[j])') && !/fn (dot4|lane)\b/.test(body), 'kernels/gemm_int8.wgsl calls dot4 and defines none');
  for (const spec of GEMM_KERNELS) {
    const dot = kernel(spec.file);
    assert.ok(/fn dot4\(a: u32, b: u32\) -> i32/.test(dot) && !dot.includes('@compute'), `${spec.file}: a dot4, no kernel`);
  }
  const files = new Set(GEMM_KERNELS.map((k) => k.file));
  for (const m of GEMM_MUTANTS) assert.ok(files.has(m.dot) && (m.kernel === m.dot || m.kernel === GEMM_BODY), m.id);
});
