// The resident kernels' gate (docs/VERIFICATION.md §9.2): every piece of resident.js against its
// JS twin (model.js, optim.js), bit for bit, on small shapes (ragged, 1, powers of two and one
// past them) and values of many magnitudes with zeros of both signs, ties and the specials each
// twin is given in the step (engines.js gateRowKernels' kinds). A 1-ULP difference fails it.
//   gateResident(kernels, {only}) -> {ok, reason, cases: [{name, ok, n, reason}]}
import * as model from '../model.js';
import * as optim from '../optim.js';
import { CODECS } from '../exchange_codec.js';
import { key, PURPOSE_EXCHANGE } from '../prng.js';
import { int8MessageWords, ResidentKernels, auditSamples } from './resident.js';
import { GpuF64Unit, gateF64 } from './f64.js';
import { openDevice } from './device.js';
import { KERNEL_BASE } from './gemm_kernel.js';

// a counter-based LCG: the same values on every boot
function values(n, seed, specials) {
  const x = new Float64Array(n);
  let st = seed >>> 0;
  const next = () => { st = (Math.imul(st, 1664525) + 1013904223) >>> 0; return st; };
  const special = [0, -0, 3.5, -3.5, 1e-310, -708, 709, -1000, 1e300, -1e300, 0.5, -0.5];
  for (let i = 0; i < n; i++) {
    const r = next();
    // 53 significant bits (values of fewer bits would add exactly in any order: no check of order)
    const u = ((next() >>> 5) * 2 ** 26 + (next() >>> 6)) * 2 ** -53;
    x[i] = specials && r % 7 === 0 ? special[next() % special.length] : (u - 0.5) * 2 ** ((r >>> 4) % 12 - 2);
  }
  return x;
}

const bits = (x) => { const w = new Uint32Array(new Float64Array([x]).buffer); return `0x${w[1].toString(16).padStart(8, '0')}${w[0].toString(16).padStart(8, '0')}`; };
// -> index of the first element whose 64 bits differ (NaN == NaN: its payload is the engine's), or -1
function firstDiff(a, b) {
  const wa = new Uint32Array(a.buffer, a.byteOffset, a.length * 2), wb = new Uint32Array(b.buffer, b.byteOffset, b.length * 2);
  for (let i = 0; i < a.length; i++) {
    if (Number.isNaN(a[i]) && Number.isNaN(b[i])) continue;
    if (wa[2 * i] !== wb[2 * i] || wa[2 * i + 1] !== wb[2 * i + 1]) return i;
  }
  return -1;
}
const compare = (what, got, want) => {
  const i = firstDiff(got, want);
  return i < 0 ? null : `${what} index ${i}: GPU ${got[i]} (${bits(got[i])}), JS ${want[i]} (${bits(want[i])})`;
};

// piece -> async (k, seed) => [[case name, reason or null], ...]
const CHECKS = {
  async add(k, seed) {
    const out = [];
    for (const n of [1, 3, 64, 65]) {
      const x = values(n, seed++, true), y = values(n, seed++, true), bx = k.f64(x);
      k.add(bx, k.f64(y), n);
      out.push([`add (${n})`, compare('x', await k.read(bx, n), x.map((v, i) => v + y[i]))]);
    }
    return out;
  },
  async relu(k, seed) {
    const out = [];
    for (const n of [1, 2, 33, 130]) {
      const h = values(n, seed++, true); h[0] = NaN;
      const hr = k.zeros(n);
      k.relu(k.f64(h), hr, n);
      out.push([`relu (${n})`, compare('hr', await k.read(hr, n), model.relu(h))]);
    }
    return out;
  },
  async reluBack(k, seed) {
    const out = [];
    for (const n of [1, 2, 33, 130]) {
      const h = values(n, seed++, true), dhr = values(n, seed++, true); h[0] = NaN;
      const dh = k.zeros(n);
      k.reluBack(k.f64(dhr), k.f64(h), dh, n);
      out.push([`relu backward (${n})`, compare('dh', await k.read(dh, n), model.reluBackward(dhr, h))]);
    }
    return out;
  },
  async adam(k, seed) {
    const out = [];
    for (const [n, t0, lr] of [[1, 0, 0.01], [7, 1, 0.005], [257, 0, 0.03], [257, 2, 0.01], [65, 999, 0.05]]) {
      const w = values(n, seed++, false), g = values(n, seed++, true), m = values(n, seed++, false), v = values(n, seed++, false).map(Math.abs);
      g[0] = -0; if (n > 1) g[1] = 0;
      const bw = k.f64(w), bm = k.f64(m), bv = k.f64(v), t = t0 + 1;
      k.adam(bw, k.f64(g), bm, bv, n, optim, lr, 1.0 - optim.powInt(optim.B1, t), 1.0 - optim.powInt(optim.B2, t));
      const ref = { x: Float64Array.from(w) }, st = { t: t0, m: { x: Float64Array.from(m) }, v: { x: Float64Array.from(v) } };
      optim.adamStep(ref, { x: g }, st, lr);
      out.push([`adam (${n}, step ${t})`, compare('w', await k.read(bw, n), ref.x) || compare('m', await k.read(bm, n), st.m.x)
        || compare('v', await k.read(bv, n), st.v.x)]);
    }
    return out;
  },
  async rmsnorm(k, seed) {
    const out = [];
    for (const [N, C] of [[1, 1], [2, 3], [3, 8], [2, 17], [2, 128]]) {
      const x = values(N * C, seed++, true), g = values(C, seed++, false);
      const y = k.zeros(N * C), xh = k.zeros(N * C), r = k.zeros(N);
      k.rmsnorm(k.f64(x), k.f64(g), y, xh, r, N, C, model.NORM_EPS);
      const [yw, cw] = model.rmsnorm(x, g, N, C);
      out.push([`rmsnorm (${N}, ${C})`, compare('y', await k.read(y, N * C), yw) || compare('xhat', await k.read(xh, N * C), cw.xhat)
        || compare('r', await k.read(r, N), cw.r)]);
    }
    return out;
  },
  async rmsnormBackward(k, seed) {
    const out = [];
    for (const [N, C] of [[1, 1], [2, 3], [5, 8], [3, 17], [33, 16]]) {
      const x = values(N * C, seed++, false), g = values(C, seed++, false), dy = values(N * C, seed++, true);
      const [, cache] = model.rmsnorm(x, g, N, C);
      // column 0's products dy * xhat all -0: only the pad's explicit +0 makes dg[0] +0
      for (let n = 0; n < N; n++) dy[n * C] = cache.xhat[n * C] > 0 ? -0 : 0;
      const dx = k.zeros(N * C), dg = k.zeros(C);
      k.rmsnormBackward(k.f64(dy), k.f64(g), k.f64(cache.xhat), k.f64(cache.r), dx, dg, N, C);
      const [dxw, dgw] = model.rmsnormBackward(dy, g, cache, N, C);
      out.push([`rmsnorm backward (${N}, ${C})`, compare('dx', await k.read(dx, N * C), dxw) || compare('dg', await k.read(dg, C), dgw)]);
    }
    return out;
  },
  async causalSoftmax(k, seed) {
    const out = [];
    for (const [G, T] of [[1, 1], [2, 3], [2, 5], [1, 17], [1, 33]]) {
      for (const specials of [false, true]) {
        const s = values(G * T * T, seed++, specials), scale = specials ? 0.35355339059327373 : 1.0, pr = k.zeros(G * T * T);
        k.causalSoftmax(k.f64(s), pr, G, T, scale);
        out.push([`causal softmax (${G}, ${T}, ${T})${specials ? ' specials' : ''}`, compare('p', await k.read(pr, G * T * T), model.causalSoftmax(s, G, T, undefined, scale))]);
      }
    }
    return out;
  },
  async softmaxBackward(k, seed) {
    const out = [];
    for (const [G, T] of [[1, 1], [2, 3], [3, 8], [1, 17]]) {
      const p = model.causalSoftmax(values(G * T * T, seed++, true), G, T), dp = values(G * T * T, seed++, true), scale = 1.0 / Math.sqrt(T);
      const ds = k.zeros(G * T * T);
      k.softmaxBackward(k.f64(dp), k.f64(p), ds, G, T, scale);
      out.push([`softmax backward (${G}, ${T}, ${T})`, compare('ds', await k.read(ds, G * T * T), model.softmaxBackward(dp, p, G, T, scale))]);
    }
    return out;
  },
  async crossEntropy(k, seed) {
    const out = [];
    for (const [N, V, specials] of [[1, 1, true], [2, 2, true], [3, 7, true], [16, 65, false], [2, 257, true]]) {
      const logits = values(N * V, seed++, specials).map((v) => (Math.abs(v) > 1e299 ? -1000 : v));
      const targets = Int32Array.from({ length: N }, (_, n) => (n * 7919) % V);
      const dl = k.zeros(N * V), lossN = k.zeros(N);
      k.crossEntropy(k.f64(logits), k.u32(targets), dl, lossN, N, V);
      const [lossWant, dWant] = model.crossEntropy(logits, targets, N, V);
      const ln = await k.read(lossN, N);
      const { treeSum } = await import('../detmath.js');
      const loss = treeSum(ln, 0, N) / N;
      out.push([`cross-entropy (${N}, ${V})`, compare('dlogits', await k.read(dl, N * V), dWant) || compare('loss', new Float64Array([loss]), new Float64Array([lossWant]))]);
    }
    return out;
  },
  async embeddingBackward(k, seed) {
    const out = [];
    for (const [V, N, C, specials] of [[1, 1, 1, true], [5, 7, 3, true], [3, 24, 8, false], [17, 12, 8, true]]) {
      const dx = values(N * C, seed++, specials), idx = Int32Array.from({ length: N }, (_, n) => (n * 3 + (n % 2)) % V);
      const dw = k.zeros(V * C);
      k.embeddingBackward(k.f64(dx), k.u32(idx), dw, V, N, C);
      out.push([`embedding backward (${V}, ${N}, ${C})`, compare('dwte', await k.read(dw, V * C), model.embeddingBackward(dx, idx, V, N, C))]);
    }
    return out;
  },
  async int8Exchange(k, seed) {
    const out = [], codec = CODECS.int8;
    for (const [n, offset, scaleKind] of [[1, 0, 'rand'], [255, 256, 'rand'], [256, 0, 'zeros'], [700, 512, 'rand'], [513, 0, 'wide']]) {
      const x = values(n, seed++, false);
      if (scaleKind === 'zeros') x.fill(0).fill(-0, 0, 100);                 // a block of zeros: scale 0, codes 0
      // per block: values near 2^-160 (the scale rounds up to float32's smallest subnormal), 2^-120
      // (a subnormal float32 scale), 2^50
      if (scaleKind === 'wide') for (let i = 0; i < n; i++) x[i] = x[i] * 2 ** [-160, -120, 50][Math.floor(i / 256)];
      const [sd, st, sl] = [seed, 3, 1], kk = key(PURPOSE_EXCHANGE, sd, st, sl);
      const want = codec.encode(x, { seed: sd, step: st, slot: sl, offset });
      const words = int8MessageWords(n), msg = k.u32(new Uint32Array(words)), flags = k.u32([0, 0, 0, 0]);
      k.int8Encode(k.f64(x), msg, flags, n, kk, offset);
      const got = new Uint8Array((await k.read(msg, Math.ceil(words / 2))).buffer).subarray(0, want.length);
      const fl = new Uint32Array((await k.read(flags, 1)).buffer)[0];
      const i = got.findIndex((b, j) => b !== want[j]);
      const enc = fl ? `flagged ${fl} a valid gradient` : i >= 0 ? `message byte ${i} (block ${Math.floor(i / 260)}): GPU ${got[i]}, JS ${want[i]}` : null;
      // decode the JS message on the GPU
      const padded = new Uint8Array(words * 4); padded.set(want);
      const dout = k.zeros(n), dflags = k.u32([0, 0, 0, 0]);
      k.int8Decode(k.u32(new Uint32Array(padded.buffer)), dout, dflags, n);
      const dfl = new Uint32Array((await k.read(dflags, 1)).buffer)[0];
      const dec = dfl ? `decode flagged ${dfl} a valid message` : compare('decoded', await k.read(dout, n), codec.decode(want, n));
      out.push([`int8 exchange (${n} values from ${offset}, ${scaleKind})`, enc || dec]);
    }
    // a non-finite value and a malformed message are flagged (the JS codec then refuses them)
    const bad = values(300, seed++, false); bad[257] = Infinity;
    const flags = k.u32([0, 0, 0, 0]);
    k.int8Encode(k.f64(bad), k.u32(new Uint32Array(int8MessageWords(300))), flags, 300, 7, 0);
    const msg = codec.encode(values(10, seed++, false), { seed: 1, step: 1, slot: 0, offset: 0 }); msg[4 + 3] = 0x80;   // code -128
    const padded = new Uint8Array(int8MessageWords(10) * 4); padded.set(msg);
    const dflags = k.u32([0, 0, 0, 0]);
    k.int8Decode(k.u32(new Uint32Array(padded.buffer)), k.zeros(10), dflags, 10);
    const [fe, fd] = [new Uint32Array((await k.read(flags, 1)).buffer)[0], new Uint32Array((await k.read(dflags, 1)).buffer)[0]];
    out.push(['int8 exchange refusals flagged', fe && fd ? null : `GPU flags ${fe} (inf value), ${fd} (code -128): 0 means let through`]);
    return out;
  },
  // the unit's self-audit gather: each sample's row of A, column of B and result element, both
  // layouts of each operand, against the same values picked out on the host
  async auditGather(k, seed) {
    const out = [];
    for (const [nb, m, kk, n, ta, tb, count] of [[1, 1, 1, 1, false, false, 1], [1, 5, 7, 3, false, true, 2], [3, 4, 9, 6, true, false, 4], [2, 17, 33, 5, true, true, 3]]) {
      const a = values(nb * m * kk, seed++, true), b = values(nb * kk * n, seed++, true), r = values(nb * m * n, seed++, true);
      const samples = auditSamples(nb, m, kk, n, ta, tb, seed++, 5, count), dst = k.zeros(count * (2 * kk + 1));
      k.auditGather(k.f64(a), k.f64(b), k.f64(r), dst, kk, samples);
      const want = new Float64Array(count * (2 * kk + 1));
      for (const [s, x] of samples.entries()) {
        const at = s * (2 * kk + 1);
        for (let i = 0; i < kk; i++) { want[at + i] = a[x.aBase + i * x.aStride]; want[at + kk + i] = b[x.bBase + i * x.bStride]; }
        want[at + 2 * kk] = r[x.e];
      }
      out.push([`audit gather (${nb}x${m}x${kk}x${n}${ta ? ' A^T' : ''}${tb ? ' B^T' : ''}, ${count} samples)`, compare('gathered', await k.read(dst, want.length), want)]);
    }
    return out;
  },
};
// resident.js pieces each check needs compiled
export const GATE_PIECES = Object.freeze({
  add: ['add'], relu: ['relu'], reluBack: ['reluBack'], adam: ['adam'], rmsnorm: ['rmsnorm'], rmsnormBackward: ['rmsnormDx', 'rmsnormDg'],
  causalSoftmax: ['causalSoftmax'], softmaxBackward: ['softmaxBack'], crossEntropy: ['crossEntropy'], embeddingBackward: ['embedBack'],
  int8Exchange: ['int8Encode', 'int8Decode'], auditGather: ['auditGather'],
});

// kernels (resident.js ResidentKernels) -> {ok, reason, cases}; only: the checks to run (names of
// GATE_PIECES; default all)
export async function gateResident(kernels, { only = Object.keys(CHECKS), seed = 1 } = {}) {
  const cases = [];
  try {
    for (const name of only) for (const [c, reason] of await CHECKS[name](kernels, seed + 1000 * only.indexOf(name))) cases.push({ name: c, ok: !reason, reason });
  } catch (e) {
    return { ok: false, reason: `the resident gate threw: ${e.message}`, cases };
  }
  const bad = cases.find((c) => !c.ok);
  return { ok: !bad, reason: bad ? `${bad.name}: ${bad.reason}` : null, cases };
}

// The resident step's parts on `gpu` (navigator.gpu, or the `webgpu` package's GPU), gated: the
// device, every resident kernel (gateResident: each against its JS twin) and the f64 unit (gateF64:
// every emulated operation, then the unit against units.js). -> {device, info, kernels, unit};
// throws with the reason when there is no adapter or a gate fails (the registry then stays on the
// CPU and says why). opts: kernelBase; features: WebGPU features to ask for where the adapter has
// them (the profile's 'timestamp-query')
export async function createResidentStep(gpu, { kernelBase = KERNEL_BASE, features = [] } = {}) {
  const { device, info } = await openDevice(gpu, { features });
  try {
    const langs = new Set(info.wgslLanguageFeatures || []);
    const [kernels, unit] = await Promise.all([ResidentKernels.create(device, { kernelBase }),
      GpuF64Unit.create(device, { kernelBase, gemm: langs.has('packed_4x8_integer_dot_product') ? 'dot4_packed.wgsl' : 'dot4_portable.wgsl' })]);
    const gu = await gateF64(unit);
    if (!gu.ok) throw new Error(`the f64 unit failed its gate: ${gu.reason}`);
    const gr = await gateResident(kernels);
    kernels.releaseUniforms();
    if (!gr.ok) throw new Error(`a resident kernel failed its gate: ${gr.reason}`);
    return { device, info, kernels, unit };
  } catch (e) {
    device.destroy();
    throw e;
  }
}
