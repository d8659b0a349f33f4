// A small WebAssembly assembler, the one way the page's wasm kernels (wasm_gemm.js,
// wasm_float.js, hashing.js) are written. Instructions go by their text-format names
// (`i32.add`, `f64x2.pmin`, `local.get(L.x)`), so a kernel reads like a .wat file; a Module
// numbers its types, functions and exports itself, and a call names the function it calls,
// so adding a function renumbers nothing by hand. Why an assembler in JS rather than .wat files
// and a compiler: docs/ARCHITECTURE.md, "WebAssembly from source".
//
// Code is nested arrays of bytes (flattened when the module is built): an instruction without
// immediates is an array (`i32.add`), one with immediates a function (`i32.const(5)`,
// `f64.load()`, `i8x16.shuffle(...)`). Memory instructions take an optional offset and always
// use the natural alignment. Branch targets are relative depths, as in the binary format.
// `if_` and `return_` end in an underscore because `if` and `return` are JS keywords.
// Encoding: WebAssembly core spec 2.0, section 5 (binary format), SIMD included.

// --- encodings ----------------------------------------------------------------------------------
export const uleb = (n) => { const o = []; do { let b = n & 0x7f; n >>>= 7; if (n) b |= 0x80; o.push(b); } while (n); return o; };
// signed LEB128 of a 32-bit integer (i32.const; i64.const of values that fit 32 bits)
export const sleb = (n) => {
  const o = [];
  for (;;) { const b = n & 0x7f; n >>= 7; if ((n === 0 && !(b & 0x40)) || (n === -1 && (b & 0x40))) { o.push(b); return o; } o.push(b | 0x80); }
};
const name = (s) => [...uleb(s.length), ...[...s].map((c) => c.charCodeAt(0))];
const vec = (items) => [...uleb(items.length), ...items.flat()];
const section = (id, body) => [id, ...uleb(body.length), ...body];
const f64Bytes = (x) => { const b = new Uint8Array(8); new DataView(b.buffer).setFloat64(0, x, true); return [...b]; };

export const TYPES = { i32: 0x7f, i64: 0x7e, f32: 0x7d, f64: 0x7c, v128: 0x7b };

// --- instructions -------------------------------------------------------------------------------
const EMPTY = 0x40;                                   // block type: no result
const mem = (op, log2Align) => (offset = 0) => [op, log2Align, ...uleb(offset)];
const simd = (op, ...imm) => [0xfd, ...uleb(op), ...imm];
const simdMem = (op, log2Align) => (offset = 0) => simd(op, log2Align, ...uleb(offset));
const simdLane = (op, log2Align) => (lane, offset = 0) => simd(op, log2Align, ...uleb(offset), lane);

export const local = {
  get: (l) => [0x20, ...uleb(l)], set: (l) => [0x21, ...uleb(l)], tee: (l) => [0x22, ...uleb(l)],
};
export const block = (...body) => [0x02, EMPTY, body, 0x0b];
export const loop = (...body) => [0x03, EMPTY, body, 0x0b];
// if_(then) or if_(then, else): then and else are code arrays; the condition is on the stack
export const if_ = (then, otherwise) => [0x04, EMPTY, then, otherwise ? [0x05, otherwise] : [], 0x0b];
export const br = (depth) => [0x0c, ...uleb(depth)];
export const br_if = (depth) => [0x0d, ...uleb(depth)];
export const return_ = [0x0f];
export const select = [0x1b];
// call(fn): fn is the handle Module.func returned; its index is known when the module is built
export const call = (fn) => [0x10, ...uleb(fn.index)];

export const i32 = {
  load: mem(0x28, 2), store: mem(0x36, 2), store16: mem(0x3b, 1), const: (v) => [0x41, ...sleb(v)],
  eqz: [0x45], lt_u: [0x49], gt_s: [0x4a], gt_u: [0x4b], ge_u: [0x4f],
  add: [0x6a], sub: [0x6b], mul: [0x6c], rem_u: [0x70], and: [0x71], or: [0x72], xor: [0x73],
  shl: [0x74], shr_u: [0x76], rotl: [0x77], rotr: [0x78],
  trunc_sat_f64_s: [0xfc, 0x02],
};
export const i64 = { const: (v) => [0x42, ...sleb(v)] };
export const f64 = {
  load: mem(0x2b, 3), store: mem(0x39, 3), const: (x) => [0x44, ...f64Bytes(x)],
  ne: [0x62], lt: [0x63], gt: [0x64],
  abs: [0x99], nearest: [0x9e], sqrt: [0x9f], add: [0xa0], mul: [0xa2], div: [0xa3], min: [0xa4], max: [0xa5],
  convert_i32_s: [0xb7], convert_i32_u: [0xb8],
};
export const v128 = {
  load: simdMem(0x00, 4), store: simdMem(0x0b, 4),
  const: (...bytes16) => simd(0x0c, ...bytes16),
  and: simd(0x4e), or: simd(0x50), bitselect: simd(0x52), any_true: simd(0x53),
  store16_lane: simdLane(0x59, 1), store32_lane: simdLane(0x5a, 2), store64_lane: simdLane(0x5b, 3),
  load32_zero: simdMem(0x5c, 2), load64_zero: simdMem(0x5d, 3),
};
export const V128_ZERO = v128.const(...new Array(16).fill(0));
export const i8x16 = {
  shuffle: (...lanes16) => simd(0x0d, ...lanes16),
  narrow_i16x8_s: simd(0x65),
};
export const i16x8 = {
  extract_lane_s: (lane) => simd(0x18, lane), replace_lane: (lane) => simd(0x1a, lane),
  narrow_i32x4_s: simd(0x85),
};
export const i32x4 = {
  extend_low_i16x8_s: simd(0xa7), add: simd(0xae), dot_i16x8_s: simd(0xba),
  trunc_sat_f64x2_s_zero: simd(0xfc),
};
export const i64x2 = {
  splat: simd(0x12), extend_low_i32x4_s: simd(0xc7), shl: simd(0xcb), add: simd(0xce),
};
export const f64x2 = {
  splat: simd(0x14), extract_lane: (lane) => simd(0x21, lane),
  ne: simd(0x48), lt: simd(0x49), gt: simd(0x4a), le: simd(0x4b), ge: simd(0x4c),
  nearest: simd(0x94), abs: simd(0xec), sqrt: simd(0xef),
  add: simd(0xf0), sub: simd(0xf1), mul: simd(0xf2), div: simd(0xf3), pmin: simd(0xf6), pmax: simd(0xf7),
  convert_low_i32x4_s: simd(0xfe),
};

// --- loop idioms shared by the kernels ----------------------------------------------------------
// while (i + step <= limit) { body; i += step }, i starting where it is (i, limit: i32 locals)
export const whileStep = (i, step, limit, body) => block(loop(
  local.get(i), i32.const(step), i32.add, local.get(limit), i32.gt_u, br_if(1),
  body, local.get(i), i32.const(step), i32.add, local.set(i), br(0)));
// for (i = 0; i < limit; i++) body
export const forRange = (i, limit, body) => [i32.const(0), local.set(i), whileStep(i, 1, limit, body)];
// base + idx * 8: the address of f64 element idx
export const addr8 = (base, idx) => [local.get(base), local.get(idx), i32.const(3), i32.shl, i32.add];

// --- modules ------------------------------------------------------------------------------------
// nested code arrays -> their bytes appended to out, in order
const emit = (out, code) => {
  if (typeof code === 'number') out.push(code);
  else for (const c of code) emit(out, c);
  return out;
};

// "a b scale:f64 c" -> [[name, type byte], ...] (a bare name is an i32)
const parseVars = (spec) => (spec ? spec.trim().split(/\s+/) : []).map((v) => {
  const [n, t = 'i32'] = v.split(':');
  if (!(t in TYPES)) throw new Error(`unknown wasm type ${t} of ${n}`);
  return [n, TYPES[t]];
});

// One module: memory 0 (exported as 'mem'), functions added in order, exports named by the
// functions themselves. bytes() assembles it: function i is the i-th added; types are the
// distinct signatures in order of first use; exports are the memory, then the exported
// functions in the order added. bytes({ sharedMaxPages }) assembles the same code over an
// imported shared memory instead (import "env" "mem", limits shared, minPages..sharedMaxPages,
// re-exported as 'mem'): the form worker threads instantiate over one memory (cpu/threads.js).
export class Module {
  constructor({ minPages = 1 } = {}) {
    this.minPages = minPages;
    this.funcs = [];
  }

  // func(exportName or null, {params, result, locals}, build) -> the function's handle.
  // params and locals: "name name:f64 ..." (i32 unless typed); result: a type name or omitted.
  // build(L) -> code, with L mapping each param and local name to its index; it runs in bytes(),
  // when every function of the module has its index, so a body may call one added after it.
  func(exportName, { params = '', result, locals = '' }, build) {
    if (result && !(result in TYPES)) throw new Error(`unknown wasm type ${result} of ${exportName}'s result`);
    const handle = { index: this.funcs.length, exportName, params: parseVars(params), locals: parseVars(locals),
      result: result ? [TYPES[result]] : [], build };
    const seen = new Set();
    for (const [n] of [...handle.params, ...handle.locals]) {
      if (seen.has(n)) throw new Error(`wasm function ${exportName}: ${n} declared twice`);
      seen.add(n);
    }
    this.funcs.push(handle);
    return handle;
  }

  bytes({ sharedMaxPages = 0 } = {}) {
    const types = [], typeIndex = new Map();
    const typeOf = (f) => {
      const t = [0x60, ...vec(f.params.map(([, ty]) => [ty])), ...vec(f.result.map((ty) => [ty]))];
      const key = t.join(',');
      if (!typeIndex.has(key)) { typeIndex.set(key, types.length); types.push(t); }
      return typeIndex.get(key);
    };
    const funcTypes = this.funcs.map((f) => uleb(typeOf(f)));
    const bodies = this.funcs.map((f) => {
      const index = new Map([...f.params, ...f.locals].map(([n], i) => [n, i]));
      const L = new Proxy({}, { get: (_, n) => {            // a misspelt name must not read as local 0
        if (!index.has(n)) throw new Error(`wasm function ${f.exportName}: no param or local ${String(n)}`);
        return index.get(n);
      } });
      const groups = [];                               // runs of one type: (count, type)
      for (const [, ty] of f.locals) {
        if (groups.length && groups[groups.length - 1][1] === ty) groups[groups.length - 1][0]++;
        else groups.push([1, ty]);
      }
      const body = emit(vec(groups.map(([n, ty]) => [...uleb(n), ty])), [f.build(L), 0x0b]);
      return [uleb(body.length), body];
    });
    const exports = [[...name('mem'), 0x02, 0x00],
      ...this.funcs.filter((f) => f.exportName).map((f) => [...name(f.exportName), 0x00, ...uleb(f.index)])];
    const code = emit([], [uleb(bodies.length), bodies]);
    return new Uint8Array(emit([], [
      0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,   // magic, version 1
      section(1, vec(types)),
      sharedMaxPages ? section(2, vec([[...name('env'), ...name('mem'), 0x02, 0x03, ...uleb(this.minPages), ...uleb(sharedMaxPages)]])) : [],
      section(3, vec(funcTypes)),
      sharedMaxPages ? [] : section(5, vec([[0x00, ...uleb(this.minPages)]])),
      section(7, vec(exports)),
      section(10, code),
    ]));
  }
}
