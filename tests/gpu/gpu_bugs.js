// The bug corpus driver: deliberately broken GEMM kernels (tests/gpu/mutants.js: patches applied to
// the live kernels now) and one broken host packer, each modelling a real failure class. Each goes through the same boot gates and
// training-time audits as the real kernels (frontend_js/gpu/gpu.js); every one must be rejected, and
// the real kernels, run the same way, must never be (0 false alarms).
import { createGpuEngine, GEMM_KERNELS, GpuFault, PACKED_FEATURE, packRowsI8 } from '../../frontend_js/gpu/gpu.js';
import { gateOperands } from '../../frontend_js/gpu/gpu_gates.js';
import { GEMM_MUTANTS, mutantSpec } from './mutants.js';

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

// id, kernel spec, failure class: the mutants (their specs made when the corpus runs, from the
// kernels as they are then) and the host packer
const NEEDS = { 'dot4_packed.wgsl': PACKED_FEATURE, 'dot4_portable.wgsl': undefined };
export const BUG_CORPUS = [
  ...GEMM_MUTANTS.map((m) => ({ id: m.id, mutant: m, spec: { needs: NEEDS[m.dot], stateful: m.stateful }, failure: m.failure })),
  { id: 'byte_order_pack', spec: { file: 'dot4_packed.wgsl', needs: PACKED_FEATURE }, packB: packColsBigEndian, failure: 'wrong byte order when packing (host side)' },
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
    const spec = bug.mutant ? { ...bug.spec, ...(await mutantSpec(bug.mutant)) } : bug.spec;   // a stale patch throws here
    results.push(await trial(bug.id, bug.failure, spec, { gpu, device, info, kernelBase, calls, auditEvery, checksum, packB: bug.packB, log }));
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
