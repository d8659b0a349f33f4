// The bug corpus driver: deliberately broken GEMM kernels (tests/gpu/bugs/*.wgsl) and one broken
// host packer, each modelling a real failure class. Each goes through the same boot gates and
// training-time audits as the real kernels (frontend_js/gpu/gpu.js); every one must be rejected, and
// the real kernels, run the same way, must never be (0 false alarms).
import { createGpuEngine, GEMM_KERNELS, GpuFault, PACKED_FEATURE, packRowsI8 } from '../../frontend_js/gpu/gpu.js';
import { gateOperands } from '../../frontend_js/gpu/gpu_gates.js';

// Wrong byte order when packing: B's lanes big-endian (b0<<24 | b1<<16 | ...) while A's and the
// kernel's are little-endian, so lane l of A meets lane 3-l of B. (Consistent reversal of both
// operands would be harmless: that is why only one side is wrong, as with a mixed-up DataView.)
export function packColsBigEndian(q, batch, K, N) {
  const w = packRowsI8(transposeI8(q, batch, K, N), batch * N, K);
  for (let i = 0; i < w.length; i++) {
    const x = w[i];
    w[i] = (((x & 0xff) << 24) | (((x >>> 8) & 0xff) << 16) | (((x >>> 16) & 0xff) << 8) | (x >>> 24)) >>> 0;
  }
  return w;
}
function transposeI8(q, batch, K, N) {   // (batch, K, N) -> (batch, N, K)
  const t = new Int8Array(q.length);
  for (let b = 0; b < batch; b++) for (let k = 0; k < K; k++) for (let j = 0; j < N; j++) t[b * K * N + j * K + k] = q[b * K * N + k * N + j];
  return t;
}

const P = PACKED_FEATURE;
// the broken kernels live beside this file (test-only: the server does not serve them)
const bugFile = (name) => new URL(`./bugs/${name}`, import.meta.url).href;

// id, kernel spec, failure class (the kernels' headers say more)
export const BUG_CORPUS = [
  { id: 'sign_extension', spec: { file: bugFile('sign_extension.wgsl') }, failure: 'sign extension lost when unpacking int8' },
  { id: 'unsigned_dot', spec: { file: bugFile('unsigned_dot.wgsl'), needs: P }, failure: 'signedness lost in the packed path (dot4U8Packed)' },
  { id: 'ragged_edge', spec: { file: bugFile('ragged_edge.wgsl'), needs: P }, failure: 'wrong tile edge on ragged shapes (store guard misses c < N)' },
  { id: 'missing_barrier', spec: { file: bugFile('missing_barrier.wgsl'), needs: P }, failure: 'missing workgroupBarrier after staging tiles' },
  { id: 'int16_saturation', spec: { file: bugFile('int16_saturation.wgsl'), needs: P }, failure: 'integer saturation in a narrow (int16) accumulator' },
  { id: 'f32_accumulate', spec: { file: bugFile('f32_accumulate.wgsl') }, failure: 'float accumulation, exact only below 2^24' },
  { id: 'fma_accumulate', spec: { file: bugFile('fma_accumulate.wgsl') }, failure: 'FMA contraction in a float path' },
  { id: 'subnormal_flush', spec: { file: bugFile('subnormal_flush.wgsl'), needs: P }, failure: 'subnormal flush to zero (int bits through an f32 op)' },
  { id: 'k_off_by_one', spec: { file: bugFile('k_off_by_one.wgsl'), needs: P }, failure: 'off-by-one in the K loop' },
  { id: 'byte_order_pack', spec: { file: 'gemm_packed.wgsl', needs: P }, packB: packColsBigEndian, failure: 'wrong byte order when packing (host side)' },
  { id: 'bad_after_n', spec: { file: bugFile('bad_after_n.wgsl'), needs: P, stateful: true }, failure: 'goes bad only after N dispatches' },
];

// Training-like GEMM calls after boot (the default model's shapes, smaller batch).
export const WORKLOAD = [[1, 64, 32, 96], [4, 32, 8, 32], [4, 32, 32, 8], [1, 64, 32, 128], [1, 64, 128, 32], [1, 64, 32, 257], [1, 257, 64, 32]];

// Boots an engine on spec, then runs `calls` workload GEMMs through it.
// -> { id, failure, caughtBy: 'gate'|'compile'|'audit'|null, reason, calls }
async function trial(id, failure, spec, { gpu, device, info, kernelBase, calls, auditEvery, checksum, packB, log }) {
  const engine = await createGpuEngine({ gpu, device, info, kernelBase, kernels: [{ id, ...spec }], auditEvery, checksum, packB, log });
  const rejectedAtBoot = engine.status.path === 'cpu';
  const out = { id, failure, caughtBy: null, reason: null, calls: 0, gates: engine.status.gates };
  try {
    await drive(engine, out, rejectedAtBoot, calls);
  } finally {
    engine.destroy();
  }
  return out;
}

async function drive(engine, out, rejectedAtBoot, calls) {
  if (rejectedAtBoot) {
    out.caughtBy = engine.status.gates.length ? 'gate' : 'compile';
    out.reason = engine.status.reasons.join(' | ');
    return;
  }
  for (let i = 0; i < calls; i++) {
    const [b, M, K, N] = WORKLOAD[i % WORKLOAD.length];
    const { qa, qb } = gateOperands('random', b, M, K, N, 1000 + i);
    out.calls = i + 1;
    try {
      await engine.gemm(qa, qb, b, M, K, N);
    } catch (e) {
      if (!(e instanceof GpuFault)) throw e;
      out.caughtBy = 'audit'; out.reason = e.message;
      return;
    }
  }
}

// -> [{ id, failure, caughtBy, reason, calls }] for every bug whose language feature exists.
export async function runBugCorpus({ gpu, device, info, kernelBase, calls = 24, auditEvery = 4, checksum = true, only, log } = {}) {
  const langs = new Set(info ? info.wgslLanguageFeatures : [...(gpu?.wgslLanguageFeatures || [])]);
  const results = [];
  for (const bug of BUG_CORPUS) {
    if (only && !only.includes(bug.id)) continue;
    if (bug.spec.needs && !langs.has(bug.spec.needs)) { results.push({ id: bug.id, failure: bug.failure, caughtBy: 'unsupported', reason: `needs ${bug.spec.needs}` }); continue; }
    results.push(await trial(bug.id, bug.failure, bug.spec, { gpu, device, info, kernelBase, calls, auditEvery, checksum, packB: bug.packB, log }));
  }
  return results;
}

// The real kernels through the very same trial: must pass gates and every audit (no false alarm).
export async function runFalseAlarmCheck({ gpu, device, info, kernelBase, calls = 24, auditEvery = 1, log } = {}) {
  const results = [];
  for (const spec of GEMM_KERNELS) {
    const langs = new Set(info ? info.wgslLanguageFeatures : [...(gpu?.wgslLanguageFeatures || [])]);
    if (spec.needs && !langs.has(spec.needs)) continue;
    results.push(await trial(spec.id, 'none (real kernel)', spec, { gpu, device, info, kernelBase, calls, auditEvery, checksum: true, log }));
  }
  return results;
}
