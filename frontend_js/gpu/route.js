// Routing: which fused-unit calls the GPU engine sends to the GPU. Pure rules, no GPU state.
// With route 'all' (rule null) every call goes to the GPU; with route 'measure' (the page's and
// the CLI's choice, frontend_js/backends.js) each call shape is timed on both paths during the
// first steps and then runs on the faster (MEASURE below); with route 'auto' only the calls the
// static rule ROUTE says pay (a fixed split, for tests). Whatever the route the bits are the same
// (both paths exact, both gated); only where the integers are computed changes.

// ROUTE: the 'auto' rule, a call on the GPU only where that is faster than the wasm engine.
// Measured on the H200 (TEST_RESULTS.md): per output element the GPU path pays ~2 ns on the CPU
// (readback copy, audit) and per call ~0.1 ms (submit, map), while the wasm GEMM costs 0.04-0.15
// ns per multiply-add (the small-K batched shapes are the slow ones) — so the GPU wins only with
// a deep enough K and a large call; at the default settings no call qualifies.
export const ROUTE = Object.freeze({ minK: 32, minMacs: 2 ** 22 });
export const gpuPays = (nb, m, kk, n, rule = ROUTE) => kk >= rule.minK && nb * m * kk * n >= rule.minMacs;

// opts.route ('all' | 'auto' | 'measure'), opts.routeRule -> the rule in force, or null (every
// call on the GPU). 'measure' is {measure: true}: the engine asks measuredSide per call.
export const routeRule = ({ route, routeRule: rule } = {}) => (route === 'auto' ? { ...ROUTE, ...(rule || {}) }
  : route === 'measure' ? { measure: true } : null);

// The rule for the adapter the engine booted on: a software adapter (SwiftShader) is never faster
// than the wasm engine, so nothing pays there; an explicit rule (tests) is used as given.
// (A measured route on a software adapter is not measured either: its calls would cost seconds.)
export function ruleForAdapter(rule, info, explicit) {
  return rule && info?.isFallbackAdapter && !explicit ? { ...ROUTE, minMacs: Infinity } : rule;
}

// -> whether a fused-unit call of (batch nb, m, kk, n) goes to the GPU under a static `rule`
export const routeToGpu = (rule, nb, m, kk, n) => !rule || gpuPays(nb, m, kk, n, rule);

// the rule in words, for engine.status.routing (the panel's path line)
export function describeRoute(rule) {
  return !rule ? 'every GEMM on the GPU'
    : rule.measure ? 'each GEMM shape timed on the GPU and on the CPU in the first steps, then run on the faster'
      : rule.minMacs === Infinity ? 'every GEMM on the CPU: a software adapter is slower than the wasm engine'
        : `GEMMs with K >= ${rule.minK} and >= ${rule.minMacs} multiply-adds on the GPU, the rest on the CPU (faster for small ones)`;
}

// --- the measured route ---------------------------------------------------------------------
// Every backend gives the same bits, so timing a call on either path and switching is safe. Per
// call shape (shapeKey) the engine keeps {cpu: [ms], gpu: [ms], calls}; the first `samples`
// calls of a shape alternate between the paths (GPU first), then the shape runs on the one with
// the smaller median for good. measureSummary weighs each shape by its calls: the step's GEMMs.
export const MEASURE = Object.freeze({ samples: 3 });

export const shapeKey = (transA, transB, nb, m, kk, n) => `${nb}x${m}x${kk}x${n}${transA ? 'A' : ''}${transB ? 'B' : ''}`;

export const newShapeTimes = () => ({ cpu: [], gpu: [], calls: 0 });

const median = (xs) => { const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };

// entry {cpu, gpu} -> {side: 'gpu' | 'cpu', decided}: while either path has fewer than `samples`
// times, the one with fewer (the GPU on a tie); then the smaller median (the CPU on a tie)
export function measuredSide(entry, samples = MEASURE.samples) {
  const { cpu, gpu } = entry;
  if (cpu.length < samples || gpu.length < samples) return { side: gpu.length <= cpu.length ? 'gpu' : 'cpu', decided: false };
  return { side: median(gpu) < median(cpu) ? 'gpu' : 'cpu', decided: true };
}

// {key: entry} -> {decided, shapes, gpuShapes, cpuMs, gpuMs, pickedMs, speedup, gpuVsCpu, wholeSteps}:
// every shape's median on each path times its calls, summed (ms over the calls seen); speedup =
// cpuMs / pickedMs (>= 1: what the pick gains over the CPU path), gpuVsCpu = cpuMs / gpuMs (the
// GPU path alone against this device's CPU). Undecided shapes count in neither (decided false).
// wholeSteps ({cpuMs, pickedMs, side} or null): whole steps timed on both paths; side 'cpu' puts
// every shape on the CPU (gpuShapes 0) and the speedup is the whole steps' (cpuMs / pickedMs).
export function measureSummary(shapes, samples = MEASURE.samples, wholeSteps = null) {
  let cpuMs = 0, gpuMs = 0, pickedMs = 0, n = 0, onGpu = 0, decided = true;
  const allCpu = wholeSteps?.side === 'cpu';
  for (const e of Object.values(shapes)) {
    const { side, decided: d } = measuredSide(e, samples);
    if (!d) { decided = false; continue; }
    const c = median(e.cpu) * e.calls, g = median(e.gpu) * e.calls;
    cpuMs += c; gpuMs += g; pickedMs += side === 'gpu' && !allCpu ? g : c; n++;
    if (side === 'gpu' && !allCpu) onGpu++;
  }
  const speedup = wholeSteps ? wholeSteps.cpuMs / (allCpu ? wholeSteps.cpuMs : wholeSteps.pickedMs) : pickedMs > 0 ? cpuMs / pickedMs : 1;
  return { decided: decided && n > 0, shapes: n, gpuShapes: onGpu, cpuMs, gpuMs, pickedMs,
    speedup, gpuVsCpu: gpuMs > 0 ? cpuMs / gpuMs : 0, wholeSteps };
}

// whole steps' medians on the CPU path and on the measured route -> the side that keeps them: the
// route only when it is faster by more than the timing's noise (WHOLE_STEP_MARGIN)
export const WHOLE_STEP_MARGIN = 1.05;
export const wholeStepSide = (cpuMs, pickedMs) => (pickedMs * WHOLE_STEP_MARGIN < cpuMs ? 'gpu' : 'cpu');
// Medians of a few steps this close (within WHOLE_STEP_CLOSE of each other) are within run-to-run
// noise of the margin (TEST_RESULTS.md "The resident step on the lent H200, after the second
// pass": 12.4 vs 13.3 ms at the default settings): the caller times more steps before deciding
export const WHOLE_STEP_CLOSE = 1.25;
export const WHOLE_STEP_MORE_REPS = 9;
export const wholeStepsClose = (aMs, bMs) => Math.max(aMs, bMs) < WHOLE_STEP_CLOSE * Math.min(aMs, bMs);
