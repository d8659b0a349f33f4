// The WebAssembly assembler (frontend_js/wasm_asm.js): its encodings, its numbering of types,
// functions and exports, and the three kernel modules it builds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';

import { Module, uleb, sleb, local, call, i32, f64 } from '../../frontend_js/wasm_asm.js';
import { GEMM_WASM } from '../../frontend_js/wasm_gemm.js';
import { floatWasm } from '../../frontend_js/wasm_float.js';
import { shaWasmBytes } from '../../frontend_js/hashing.js';

test('LEB128 encodings at their edges', () => {
  for (const [n, bytes] of [[0, [0]], [127, [0x7f]], [128, [0x80, 0x01]], [624485, [0xe5, 0x8e, 0x26]],
    [2 ** 32 - 1, [0xff, 0xff, 0xff, 0xff, 0x0f]]]) assert.deepEqual(uleb(n), bytes, `uleb(${n})`);
  for (const [n, bytes] of [[0, [0]], [63, [0x3f]], [64, [0xc0, 0x00]], [-1, [0x7f]], [-64, [0x40]], [-65, [0xbf, 0x7f]],
    [-123456, [0xc0, 0xbb, 0x78]], [2 ** 31 - 1, [0xff, 0xff, 0xff, 0xff, 0x07]], [-(2 ** 31), [0x80, 0x80, 0x80, 0x80, 0x78]]]) {
    assert.deepEqual(sleb(n), bytes, `sleb(${n})`);
  }
});

// a module whose first function calls one added after it, with an unexported function between
function twoStepModule(withExtra) {
  const m = new Module();
  let square;
  m.func('sumSquares', { params: 'a b', result: 'i32' }, (L) => [
    local.get(L.a), call(square), local.get(L.b), call(square), i32.add]);
  if (withExtra) m.func(null, { params: 'x:f64', result: 'f64' }, (L) => [local.get(L.x), local.get(L.x), f64.add]);
  square = m.func('square', { params: 'x', result: 'i32', locals: 'y' }, (L) => [
    local.get(L.x), local.tee(L.y), local.get(L.y), i32.mul]);
  return new WebAssembly.Instance(new WebAssembly.Module(m.bytes()), {}).exports;
}

test('calls and exports follow the functions, not hand-counted indices', () => {
  for (const withExtra of [false, true]) {
    const ex = twoStepModule(withExtra);
    assert.deepEqual(Object.keys(ex), ['mem', 'sumSquares', 'square']);
    assert.equal(ex.sumSquares(3, 4), 25);
    assert.equal(ex.square(-7), 49);
  }
  assert.throws(() => new Module().func('f', { params: 'a a' }, () => []), /declared twice/);
  assert.throws(() => new Module().func('f', { params: 'a:f16' }, () => []), /unknown wasm type/);
  const misspelt = new Module();
  misspelt.func('f', { params: 'count' }, (L) => [local.get(L.cuont)]);
  assert.throws(() => misspelt.bytes(), /no param or local cuont/);
});

// The SHA-256 of each kernel module's bytes. They are the bytes of the hand-assembled arrays the
// assembler replaced (commit fbfb110), so the rewrite changed no kernel. A kernel change moves
// its hash: the gates (each kernel against its JS twin) and the fixture tests decide whether it
// keeps the bits; then update the hash here, saying why in the commit.
const KERNEL_MODULES = {
  gemm: ['e98da1104aa3e209f707a56d9de2b87698d9273c86a70f045e5c80423d6654de', () => GEMM_WASM,
    ['mem', 'gemm', 'qrows', 'qcols', 'epi', 'audit', 'pack8', 'qcolsLd']],
  float: ['3e503d883554ba6db3e6e24bc4a2cb355e90ceec26f48f96a94f20918cbdb3a2', floatWasm,
    ['mem', 'softmaxRows', 'adamStep', 'rmsnormRows', 'rmsnormBackRows', 'softmaxBackRows', 'relu', 'reluBack']],
  sha: ['e1af2c7fbe7d60812c1bc0089dea1ea0fd5714b75820afb2f38212d97fd07c14', shaWasmBytes, ['mem', 'sha']],
};

test('the kernel modules validate, export their functions and have their pinned bytes', () => {
  for (const [what, [hash, bytesOf, exportNames]] of Object.entries(KERNEL_MODULES)) {
    const bytes = bytesOf();
    assert.ok(WebAssembly.validate(bytes), `${what} module does not validate`);
    assert.deepEqual(WebAssembly.Module.exports(new WebAssembly.Module(bytes)).map((e) => e.name), exportNames, what);
    assert.equal(createHash('sha256').update(bytes).digest('hex'), hash, `${what} module bytes changed`);
  }
});
