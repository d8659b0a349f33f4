// Routing: which fused-unit calls the GPU engine sends to the GPU. Pure rules, no GPU state.
// With route 'all' (rule null) every call goes to the GPU; with route 'auto' (the page's choice)
// only the calls where the GPU pays. Either way the bits are the same (both paths exact, both
// gated); only where the integers are computed changes.

// ROUTE: the 'auto' rule, a call on the GPU only where that is faster than the wasm engine.
// Measured on the H200 (TEST_RESULTS.md): per output element the GPU path pays ~2 ns on the CPU
// (readback copy, audit) and per call ~0.1 ms (submit, map), while the wasm GEMM costs 0.04-0.15
// ns per multiply-add (the small-K batched shapes are the slow ones) — so the GPU wins only with
// a deep enough K and a large call; at the default settings no call qualifies.
export const ROUTE = Object.freeze({ minK: 32, minMacs: 2 ** 22 });
export const gpuPays = (nb, m, kk, n, rule = ROUTE) => kk >= rule.minK && nb * m * kk * n >= rule.minMacs;

// opts.route ('all' | 'auto'), opts.routeRule -> the rule in force, or null (every call on the GPU)
export const routeRule = ({ route, routeRule: rule } = {}) => (route === 'auto' ? { ...ROUTE, ...(rule || {}) } : null);

// The rule for the adapter the engine booted on: a software adapter (SwiftShader) is never faster
// than the wasm engine, so nothing pays there; an explicit rule (tests) is used as given.
export function ruleForAdapter(rule, info, explicit) {
  return rule && info?.isFallbackAdapter && !explicit ? { ...rule, minMacs: Infinity } : rule;
}

// -> whether a fused-unit call of (batch nb, m, kk, n) goes to the GPU under `rule`
export const routeToGpu = (rule, nb, m, kk, n) => !rule || gpuPays(nb, m, kk, n, rule);

// the rule in words, for engine.status.routing (the panel's path line)
export function describeRoute(rule) {
  return !rule ? 'every GEMM on the GPU'
    : rule.minMacs === Infinity ? 'every GEMM on the CPU: a software adapter is slower than the wasm engine'
      : `GEMMs with K >= ${rule.minK} and >= ${rule.minMacs} multiply-adds on the GPU, the rest on the CPU (faster for small ones)`;
}
