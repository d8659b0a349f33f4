// Deterministic Adam, mirroring daisy/optim.py. Elementwise float64, pinned order:
//   m = B1*m + OMB1*g
//   v = B2*v + OMB2*(g*g)
//   w = w - lr * ((m / (1 - B1^t)) / (sqrt(v / (1 - B2^t)) + EPS))
// with B^t by powInt (square-and-multiply from the top bit), t = 1 at the first step.
// This is the reference; wasm_float.js has the same update on f64x2 lanes (engines.js gates it).

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

// Update params and state in place (t becomes t + 1).
export function adamStep(params, grads, state, lr) {
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
