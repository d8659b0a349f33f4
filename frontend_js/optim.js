// Deterministic Adam, mirroring daisy/optim.py. Elementwise float64, pinned order:
//   m = B1*m + OMB1*g
//   v = B2*v + OMB2*(g*g)
//   w = w - lr * ((m / (1 - B1^t)) / (sqrt(v / (1 - B2^t)) + EPS))
// with B^t by powInt (square-and-multiply from the top bit), t = 1 at the first step.
import { floatKernels, floatKernelsUnavailable } from './wasm_float.js';

export const B1 = 0.9, OMB1 = 0.1;
export const B2 = 0.999, OMB2 = 0.001;
export const EPS = 1e-8;

export function powInt(b, t) {
  let r = 1.0;
  if (t > 0) for (const bit of t.toString(2)) { r = r * r; if (bit === '1') r = r * b; }
  return r;
}

export function adamInit(params) {
  const zeros = () => Object.fromEntries(Object.entries(params).map(([k, v]) => [k, new Float64Array(v.length)]));
  return { t: 0, m: zeros(), v: zeros() };
}

// Update params and state in place (t becomes t + 1). The elementwise update runs in wasm
// (wasm_float.js, the same operations on f64x2 lanes) once it has matched adamStepJS at first use.
export function adamStep(params, grads, state, lr) {
  const fast = adamKernel();
  if (!fast) return adamStepJS(params, grads, state, lr);
  const t = state.t + 1;
  const bc1 = 1.0 - powInt(B1, t);
  const bc2 = 1.0 - powInt(B2, t);
  for (const name of Object.keys(params)) fast.adamStep(params[name], grads[name], state.m[name], state.v[name], lr, bc1, bc2);
  state.t = t;
}

// the reference (and the fallback)
export function adamStepJS(params, grads, state, lr) {
  const t = state.t + 1;
  const bc1 = 1.0 - powInt(B1, t);
  const bc2 = 1.0 - powInt(B2, t);
  for (const name of Object.keys(params)) {
    const w = params[name], g = grads[name], m = state.m[name], v = state.v[name];
    for (let i = 0; i < w.length; i++) {
      const gi = g[i];
      const mi = B1 * m[i] + OMB1 * gi;
      const vi = B2 * v[i] + OMB2 * (gi * gi);
      m[i] = mi; v[i] = vi;
      w[i] = w[i] - lr * ((mi / bc1) / (Math.sqrt(vi / bc2) + EPS));
    }
  }
  state.t = t;
}

let fastAdam;                             // undefined: not tried; null: not used
export let adamKernelUnavailable = null;  // why (null when it is used)
function adamKernel() {
  if (fastAdam === undefined) {
    const k = floatKernels();
    const bad = k ? gateAdam(k) : floatKernelsUnavailable;
    fastAdam = bad ? null : k;
    adamKernelUnavailable = bad ? `wasm Adam not used: ${bad}` : null;
  }
  return fastAdam;
}

// the tests' switch: false forces adamStepJS, true the gated wasm kernel (if any)
export function useAdamKernel(on) {
  fastAdam = on ? undefined : null;
  return on ? adamKernel() : null;
}

// kernels -> null, or the first disagreement with adamStepJS in words: odd and even lengths,
// steps 1, 2, 3 and 1000, gradients of many magnitudes, zeros of both signs
export function gateAdam(kernels) {
  let st = 12345;
  const next = () => { st = (Math.imul(st, 1664525) + 1013904223) >>> 0; return st; };
  const value = () => { const r = next(); return r % 11 === 0 ? [0, -0, 1e-300, -1e300][r % 4] : ((next() >>> 8) * 2 ** -24 - 0.5) * 2 ** (r % 40 - 30); };
  const fill = (n) => Float64Array.from({ length: n }, value);
  for (const [n, t0, lr] of [[1, 0, 0.01], [2, 1, 0.005], [7, 2, 0.05], [33, 999, 0.01], [256, 0, 0.03]]) {
    const w = fill(n), g = fill(n), m = fill(n).map(Math.abs), v = fill(n).map(Math.abs);
    const a = { x: Float64Array.from(w) }, b = { x: Float64Array.from(w) };
    const sa = { t: t0, m: { x: Float64Array.from(m) }, v: { x: Float64Array.from(v) } };
    const sb = { t: t0, m: { x: Float64Array.from(m) }, v: { x: Float64Array.from(v) } };
    const t = t0 + 1, bc1 = 1.0 - powInt(B1, t), bc2 = 1.0 - powInt(B2, t);
    kernels.adamStep(a.x, g, sa.m.x, sa.v.x, lr, bc1, bc2);
    adamStepJS(b, { x: g }, sb, lr);
    for (const [what, x, y] of [['w', a.x, b.x], ['m', sa.m.x, sb.m.x], ['v', sa.v.x, sb.v.x]]) {
      for (let i = 0; i < n; i++) {
        if (!(Object.is(x[i], y[i]) || (x[i] !== x[i] && y[i] !== y[i]))) return `${what}[${i}] of ${n} at step ${t}: ${x[i]} vs JS ${y[i]}`;
      }
    }
  }
  return null;
}

export function sgdStep(params, grads, lr) {
  for (const name of Object.keys(params)) {
    const w = params[name], g = grads[name];
    for (let i = 0; i < w.length; i++) w[i] = w[i] - lr * g[i];
  }
}
