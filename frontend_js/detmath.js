// Deterministic float helpers from IEEE-754 basic operations only, mirroring daisy/detmath.py.
// Never Math.exp/log/pow/tanh in the step: engines differ.

// Round to nearest, ties to even (np.rint). x - floor(x) is exact for |x| < 2^52.
export function rint(x) {
  const f = Math.floor(x);
  const d = x - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1;
  return (f % 2 === 0) ? f : f + 1;
}
