// The GPU bug corpus as patches of the live kernels: each mutant is {id, kernel, edits: [[find,
// replace], ...], failure (the class of bug it models), mustFail (how the tests must catch it)},
// applied to the kernel as it is now when a test runs, so a mutant always tests today's kernel.
// Each `find` must occur exactly once in the kernel (after the edits before it): a kernel that
// changed under a mutant fails the test that uses it, naming the mutant and the text it looks for
// (tests/js/gpu_mutants.test.mjs checks every patch without a GPU). Test-only: the app never
// serves this file.
import { loadText } from '../../frontend_js/gpu/device.js';

const MAX_STORE = 'if (r < P.M && c < P.N) { C[((sp * P.batch + b) * P.M + r) * P.N + c] = acc[i * MAX_R + j]; }';
const SUM = 'acc[i * MAX_R + j] += dot4(a[i], w[j]);';
// a float accumulator in the portable kernel: its declaration and its store (the sum between differs)
const FLOAT_ACC = ['var acc: array<i32, MAX_R * MAX_R>;', 'var acc: array<f32, MAX_R * MAX_R>;   // BUG: float accumulator'];
const FLOAT_STORE = ['= acc[i * MAX_R + j]; }', '= i32(acc[i * MAX_R + j]); }'];
// an edit that deletes one whole line
const deleteLine = (line) => [`${line}\n`, ''];

// the GEMM kernel's mutants (tests/gpu/gpu_bugs.js runs them through the boot gates and audits):
// `kernel` the file patched (the body kernels/gemm_int8.wgsl or a dot4), `dot` the variant's dot4
// file it runs with (prepended to the body as frontend_js/gpu/gemm_kernel.js gemmSource does)
const BODY = 'gemm_int8.wgsl', PACKED = 'dot4_packed.wgsl', PORTABLE = 'dot4_portable.wgsl';
export const GEMM_MUTANTS = [
  { id: 'sign_extension', kernel: PORTABLE, dot: PORTABLE, failure: 'sign extension lost when unpacking int8',
    mustFail: 'the gate (any negative value: lane() masks the byte, -1 reads as 255)',
    edits: [['fn lane(w: u32, l: u32) -> i32 { return bitcast<i32>(w << (24u - 8u * l)) >> 24u; }',
      'fn lane(w: u32, l: u32) -> i32 { return i32((w >> (8u * l)) & 0xffu); }   // BUG: zero-extends']] },
  { id: 'unsigned_dot', kernel: PACKED, dot: PACKED, failure: 'signedness lost in the packed path (dot4U8Packed)',
    mustFail: 'the gate (any negative value)',
    edits: [['return dot4I8Packed(a, b);', 'return i32(dot4U8Packed(a, b)); /* BUG: unsigned lanes */']] },
  { id: 'ragged_edge', kernel: BODY, dot: PACKED, failure: 'wrong tile edge on ragged shapes (store guard misses c < N)',
    mustFail: 'the gate (ragged N: columns past N of a ragged tile overwrite the next row)',
    edits: [[MAX_STORE, 'if (r < P.M) { C[(b * P.M + r) * P.N + c] = acc[i * MAX_R + j]; }   // BUG: no column guard']] },
  { id: 'missing_barrier', kernel: BODY, dot: PACKED, failure: 'missing workgroupBarrier after staging tiles',
    mustFail: 'the gate (any shape; SwiftShader runs a workgroup\'s lanes in groups that reach the reads early)',
    edits: [['    workgroupBarrier();\n    for (var kw = 0u; kw < TK; kw++) {',
      '    // BUG: workgroupBarrier() missing: threads read tiles others have not written yet\n    for (var kw = 0u; kw < TK; kw++) {']] },
  { id: 'int16_saturation', kernel: BODY, dot: PACKED, failure: 'integer saturation in a narrow (int16) accumulator',
    mustFail: 'the gate (extreme values: 3*127^2 > 32767)',
    edits: [[SUM, 'acc[i * MAX_R + j] = clamp(acc[i * MAX_R + j] + dot4(a[i], w[j]), -32768, 32767);   // BUG: int16 saturation']] },
  { id: 'f32_accumulate', kernel: BODY, dot: PORTABLE, failure: 'float accumulation, exact only below 2^24',
    mustFail: 'the gate (K=4096 at +-127: |acc| = 66,064,384 > 2^24)',
    edits: [FLOAT_ACC, [SUM, 'acc[i * MAX_R + j] += f32(dot4(a[i], w[j]));'], FLOAT_STORE] },
  { id: 'fma_accumulate', kernel: BODY, dot: PORTABLE, failure: 'FMA contraction in a float path',
    mustFail: 'the gate (K=4096 at +-127; fused on the H200, unfused on SwiftShader, inexact above 2^24 either way)',
    edits: [FLOAT_ACC, [SUM,
      'for (var l = 0u; l < 4u; l++) { acc[i * MAX_R + j] = fma(f32(lane(a[i], l)), f32(lane(w[j], l)), acc[i * MAX_R + j]); }   // BUG: fma'],
    FLOAT_STORE] },
  { id: 'subnormal_flush', kernel: BODY, dot: PACKED, failure: 'subnormal flush to zero (int bits through an f32 op)',
    mustFail: 'the gate (small positive sums flush to 0 where the GPU flushes subnormals: SwiftShader, the H200)',
    edits: [[MAX_STORE, 'if (r < P.M && c < P.N) { C[((sp * P.batch + b) * P.M + r) * P.N + c] = bitcast<i32>(bitcast<f32>(acc[i * MAX_R + j]) + f32(P.K4 >> 31u)); }   // BUG: int bits through an f32 add']] },
  { id: 'k_off_by_one', kernel: BODY, dot: PACKED, failure: 'off-by-one in the K loop',
    mustFail: 'the gate (any shape with K > 0: the guard k < K4 - 1 drops the last K word of every row of A)',
    edits: [['if (row0 + r < P.M && k0 + kw < kHi) { v = A[', 'if (row0 + r < P.M && k0 + kw + 1u < kHi) { v = A[']] },
  { id: 'bad_after_n', kernel: BODY, dot: PACKED, failure: 'goes bad only after N dispatches', stateful: true,
    mustFail: 'an audit during training (it passes the boot gates by construction: from dispatch BAD_AFTER on, every output is off by one)',
    edits: [['@group(0) @binding(3) var<uniform> P: Params;\n',
      '@group(0) @binding(3) var<uniform> P: Params;\n@group(0) @binding(4) var<storage, read_write> S: array<atomic<u32>>;   // dispatch counter\n'
      + 'override BAD_AFTER: u32 = 40u;   // dispatches before it goes bad (more than the gates run)\n'],
      ['var acc: array<i32, MAX_R * MAX_R>;     // zero-initialised\n', 'var acc: array<i32, MAX_R * MAX_R>;     // zero-initialised\n  let dispatches = atomicLoad(&S[0]);\n'],
      [`      ${MAX_STORE}\n    }\n  }\n`,
        '      var v = acc[i * MAX_R + j];\n      if (dispatches >= BAD_AFTER) { v += 1; }   // BUG: goes stale after BAD_AFTER dispatches\n'
        + '      if (r < P.M && c < P.N) { C[(b * P.M + r) * P.N + c] = v; }\n    }\n  }\n'
        + '  if (all(lid == vec3<u32>(0u)) && all(wid == vec3<u32>(0u))) { atomicAdd(&S[0], 1u); }\n']] },
];

// the f64 library's and the unit kernels' mutants (tests/test_webgpu_f64.py: gateF64 must reject each)
export const F64_MUTANTS = [
  { id: 'f64_div_no_sticky', failure: 'a wrong sticky bit: the division ignores its non-zero remainder',
    edits: [deleteLine('  if (!u64_zero(rem)) { q.x = q.x | 1u; }                         // sticky')] },
  { id: 'f64_jam_lost', failure: 'a wrong sticky bit: right shifts (alignment in +/-, denormalization) drop the bits shifted out',
    edits: [deleteLine('  if (!u64_eq(u64_shl(r, s), a)) { r.x = r.x | 1u; }')] },
  { id: 'f64_lost_carry', failure: 'a lost carry: the 128-bit product drops the carry out of its second word',
    edits: [['vec2<u32>(hl.y, 0u)), vec2<u32>(w1.y, 0u));', 'vec2<u32>(hl.y, 0u)), vec2<u32>(0u, 0u));']] },
  { id: 'f64_mul_no_sticky', failure: 'a wrong sticky bit: the product ignores its low 64 bits',
    edits: [deleteLine('  if (!u64_zero(p.lo)) { sig.x = sig.x | 1u; }                    // sticky')] },
  { id: 'f64_rint_ties_up', failure: 'rint rounds half away from zero (Math.round-like) instead of half to even',
    edits: [['let up = u64_lt(half, rem) || (u64_eq(rem, half) && (ip.x & 1u) == 1u);', 'let up = u64_lt(half, rem) || u64_eq(rem, half);']] },
  { id: 'f64_ties_away', failure: 'ties away from zero: an exactly half-way result is rounded up instead of to the even neighbour',
    edits: [deleteLine('  if (round_bits == 0x200u) { sig.x = sig.x & ~1u; }   // exactly half: to even')] },
  { id: 'f64_truncate', failure: 'rounding by truncation: the half-ULP increment before the shift is gone',
    edits: [['  sig = u64_shr(u64_add(sig, vec2<u32>(0x200u, 0u)), 10u);\n  if (round_bits == 0x200u) { sig.x = sig.x & ~1u; }   // exactly half: to even\n',
      '  sig = u64_shr(sig, 10u);\n']] },
  // the unit's own kernels (`option`: GpuF64Unit.create's option that takes the patched file)
  { id: 'unit_quant_no_fallback', kernel: 'unit_quant.wgsl', option: 'quant',
    failure: 'the float32 estimate trusted near half-integers (no exact division where it cannot decide)',
    edits: [deleteLine('    if (abs(fr - 0.5) <= MARGIN) { return f64_rint_clamp127(f64_div(x, s)); }')] },
  { id: 'unit_quant_rows_mixed', kernel: 'unit_quant.wgsl', option: 'quant', failure: "rows of one workgroup take the first row's maximum",
    edits: [["  let slot = lid.x - t;                    // its row's first slot in red", '  let slot = 0u;   // BUG: the first row\'s slot']] },
  { id: 'unit_epilogue_one_slice', kernel: 'unit_epilogue.wgsl', option: 'epilogue', failure: 'split-K partials beyond the first not added',
    edits: [deleteLine('  for (var sp = 1u; sp < P.splits; sp++) { acc += C[sp * P.stride + o]; }')] },
  { id: 'gemm_slice_short', kernel: BODY, option: 'gemmBody', failure: "split-K slices one staging step short (each slice's last TK words lost)",
    edits: [['let kHi = min(P.K4, kLo + chunk);', 'let kHi = min(P.K4, kLo + chunk - TK);']] },
].map((m) => ({ kernel: 'f64_lib.wgsl', option: 'lib', mustFail: 'the f64 gate (frontend_js/gpu/f64.js gateF64)', ...m }));

// the resident kernels' mutants (frontend_js/gpu/resident_gates.js gateResident must reject each;
// `check`: the gate's check that covers the kernel, so a test runs only what the mutant touches)
export const RESIDENT_MUTANTS = [
  { id: 'res_tree_in_order', kernel: 'f64_rows.wgsl', check: 'rmsnorm', failure: 'treeSum as a running sum (another order of additions)',
    edits: [['for (var i = t; i < p; i += WG) { tree[i] = f64_add(tree[i], tree[i + p]); }',
      'if (t == 0u) { for (var i = 1u; i < p * 2u; i++) { tree[0] = f64_add(tree[0], tree[i]); } }   // BUG: sequential']] },
  { id: 'res_pad_no_add', kernel: 'res_rmsnorm_dg.wgsl', check: 'rmsnormBackward', failure: 'the tree pad copies instead of adding +0 (-0 stays -0)',
    edits: [['tree[i] = f64_add(prod(i, c), select(F64_ZERO, prod(i + p, c), i + p < N));',
      'tree[i] = select(prod(i, c), f64_add(prod(i, c), prod(i + p, c)), i + p < N); /* BUG: no +0 */']] },
  { id: 'res_adam_fused_order', kernel: 'res_adam.wgsl', check: 'adam', failure: 'Adam divides by bc1 after the ratio (another order)',
    edits: [['let step = f64_div(f64_div(mi, P.bc1), f64_add(f64_sqrt(f64_div(vi, P.bc2)), P.eps));',
      'let step = f64_div(f64_div(mi, f64_add(f64_sqrt(f64_div(vi, P.bc2)), P.eps)), P.bc1);   // BUG: reordered']] },
  { id: 'res_relu_nan_zero', kernel: 'res_relu.wgsl', check: 'relu', failure: 'ReLU drops NaN to 0 (np.maximum keeps it)',
    edits: [['f64_gt_zero(h) || f64_is_nan(h)', 'f64_gt_zero(h)']] },
  { id: 'res_softmax_unmasked', kernel: 'res_softmax.wgsl', check: 'causalSoftmax', failure: 'the causal mask forgotten in the normalizer',
    edits: [['if (j <= i) { e = f64_exp_det(f64_sub(f64_mul(S[o + j], P.scale), m)); }', 'e = f64_exp_det(f64_sub(f64_mul(S[o + j], P.scale), m));   // BUG: no mask']] },
  { id: 'res_exp_one_term_short', kernel: 'f64_rows.wgsl', check: 'causalSoftmax', failure: "exp's polynomial one term short",
    edits: [['for (var i = 12; i >= 0; i--) { p = f64_add(f64_mul(p, r), EXP_C[i]); }', 'for (var i = 12; i >= 1; i--) { p = f64_add(f64_mul(p, r), EXP_C[i]); }']] },
  { id: 'res_embed_descending', kernel: 'res_embed_back.wgsl', check: 'embeddingBackward', failure: 'the embedding gradient summed in descending token order',
    edits: [['for (var n = 0u; n < P.N; n++) {\n    if (IDX[n] == v) { acc = f64_add(acc, DX[n * P.C + c]); }',
      'for (var q = 0u; q < P.N; q++) {\n    let n = P.N - 1u - q;\n    if (IDX[n] == v) { acc = f64_add(acc, DX[n * P.C + c]); }']] },
  { id: 'res_xent_log_fused', kernel: 'res_xent.wgsl', check: 'crossEntropy', failure: 'the loss as m + (log z - logit) (another association)',
    edits: [['f64_sub(f64_add(m, f64_log_det(z)), LOGITS[o + tgt])', 'f64_add(m, f64_sub(f64_log_det(z), LOGITS[o + tgt]))']] },
  { id: 'res_codec_scale_nearest', kernel: 'res_codec_encode.wgsl', check: 'int8Exchange', failure: 'the int8 scale rounded to the nearest float32, not up (|y| may pass 127)',
    edits: [deleteLine('  if (u64_lt(f32_bits_to_f64(sb), m)) { sb = sb + 1u; }     // the next float32 up')] },
  { id: 'res_codec_floor_trunc', kernel: 'f64_rows.wgsl', check: 'int8Exchange', failure: 'floor as truncation toward zero (negative codes off by one)',
    edits: [['  return -i32(ip.x) - select(1, 0, exact);', '  return -i32(ip.x);   // BUG: truncates']] },
  { id: 'res_audit_b_stride', kernel: 'res_audit_gather.wgsl', check: 'auditGather', failure: "the self-audit reads B's column with A's stride (checks other values than the unit used)",
    edits: [['    OUT[g] = B[at.z + (w - K) * at.w];', '    OUT[g] = B[at.z + (w - K) * at.y];   // BUG: A\'s stride']] },
  { id: 'res_audit_no_element', kernel: 'res_audit_gather.wgsl', check: 'auditGather', failure: 'the self-audit gathers the first result element, not the sampled one',
    edits: [['    OUT[g] = R[P.elem[s].x];', '    OUT[g] = R[0];   // BUG: always the first element']] },
].map((m) => ({ mustFail: 'the resident gate (frontend_js/gpu/resident_gates.js gateResident)', ...m }));

export class StaleMutant extends Error {}

// a mutant and its kernel's text now -> the mutated text; throws StaleMutant naming the mutant and
// the edit whose `find` does not occur exactly once
export function applyMutant(mutant, text) {
  let out = text;
  mutant.edits.forEach(([find, replace], i) => {
    const at = out.indexOf(find), again = at < 0 ? -1 : out.indexOf(find, at + 1);
    if (at < 0 || again >= 0) {
      throw new StaleMutant(`mutant ${mutant.id}: edit ${i + 1} looks for ${JSON.stringify(find.slice(0, 80))}, which occurs `
        + `${at < 0 ? 'nowhere' : 'more than once'} in kernels/${mutant.kernel}: the kernel changed; update the patch in tests/gpu/mutants.js`);
    }
    out = out.slice(0, at) + replace + out.slice(at + find.length);
  });
  return `// MUTANT ${mutant.id} of kernels/${mutant.kernel} (tests/gpu/mutants.js): ${mutant.failure}\n${out}`;
}

// the mutated kernel as a blob: URL, which a kernel spec's `file` or `body` and the f64 unit's
// `lib` take (a page or Node); the live kernel is read from kernels/ beside tests/
export async function mutantUrl(mutant) {
  const text = await loadText(new URL(`../../kernels/${mutant.kernel}`, import.meta.url));
  return URL.createObjectURL(new Blob([applyMutant(mutant, text)], { type: 'text/plain' }));
}

// a GEMM mutant -> its kernel spec's sources (gemm_kernel.js): the dot4 `file` and the `body`,
// the patched one as a blob: URL
export async function mutantSpec(mutant) {
  const url = await mutantUrl(mutant);
  return mutant.kernel === mutant.dot ? { file: url } : { file: mutant.dot, body: url };
}
