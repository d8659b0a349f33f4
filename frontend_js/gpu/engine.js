// The WebGPU integer engine: exact int8 GEMMs on the GPU behind the engine contracts of
// frontend_js/units.js: gemm(qa, qb, batch, M, K, N) -> Int32Array (batch, M, N), and the fused
// unit qmatmulT(a, transA, b, transB, batch, M, K, N, out) -> Float64Array (batch, M, N), which
// units.qmatmulT hands over whole. The GPU does integer work only; quantization and the float64
// epilogue stay on the CPU, in the wasm host (wasm_host.js: qrows, qcols, epi — the operations of
// units.js, gated there), so every result has the bits of the CPU engines — and the engine
// proves it:
//   boot:     device (device.js), then each kernel in preference order (gemm_kernel.js
//             GEMM_KERNELS: packed dot4I8Packed, then portable i32) is compiled and gated
//             (gpu_gates.js); the first that passes is used.
//   each call: the result is bound-checked and Freivalds-checked; every `auditEvery` calls a
//             random tile is recomputed exactly on the CPU. Calls are numbered in issue order
//             (the audits' randomness is keyed by that number), so audits are deterministic.
//   batching: calls issued in the same tick (e.g. the dW and dX pair of model.js backward's
//             both(), which waits for both with Promise.allSettled) run as ONE submit (one
//             dispatch each, one copy into one mappable buffer) and ONE mapAsync; each is
//             audited and finished on its own, in issue order.
//   faults:   a failed gate, shader compile error, validation/OOM error, uncaptured error, lost
//             device or failed audit switches the engine to the CPU for good, with the reason in
//             engine.status.reasons, console.error, onFault callbacks and a 'fault' event.
//             Errors mean nothing wrong was returned: the calls of that submit are computed on the
//             CPU and the step goes on. A failed audit means the GPU returned wrong numbers: that
//             call rejects with GpuFault (recompute: true) and the caller redoes the whole step
//             (withGpuFallback does that); calls of the batch after it are computed on the CPU.
//   CPU:      opts.cpu, the caller's CPU engine (the page: its backend's); by default
//             engines.js bestGemmEngine() (wasm-simd when it passed its gate, else scalar).
//   routing:  with route 'measure' (the page's and the CLI's choice, frontend_js/backends.js)
//             each fused-unit call shape is timed on the GPU and on the CPU engine in the first
//             steps and then runs on the faster (route.js measuredSide); status.measure is the
//             summary and onMeasured callbacks hear it each time every shape seen is decided.
//             With route 'auto' a call goes to the GPU only when route.js gpuPays (a static
//             split, for tests). Same bits either way.
//   f64 unit: where the adapter is a real GPU (opts.f64Unit: 'auto', the default; true forces
//             it, false never), the fused-unit calls routed to the GPU run WHOLLY there
//             (f64.js: quantizers and epilogue in emulated float64, one submit and one read-back
//             of the float64 result per call, outside the job queue below), once its own boot
//             gate (gateF64: every emulated operation vs JS, the unit vs units.js, bit for bit)
//             passed on the kernel chosen above; each result is spot-audited on the CPU
//             (f64.js spotAudit). A failed gate leaves the path above; a failed submit drops
//             the f64 unit (that call on the CPU); a failed audit is a GpuFault.
//
// Jobs — the seam between the engine and the work. A call becomes one job; the engine only
// queues, submits, audits and finishes jobs, in this order, and knows nothing else of them:
//   { batch, M, N, K4, aWords, bWords,   the GEMM's (padded) shape and operand sizes in u32 words
//     write(queue, buffer, aByte, bByte) upload A (batch, M, K4) and B^T (batch, N, K4) words
//     take(c)        the GPU's C (batch, M, N) int32, a view valid during the call: copy it
//     audit(call)    -> null, or why C is wrong (gpu_gates.js checks; call: the audit's number)
//     finish()       -> the call's result, after its audit passed
//     cpu()          -> the same result computed on the CPU (a fault, no kernel, a failed submit)
//     done()         optional: release what the job holds (always called)
//     shape, bytes } for messages, and the batch's byte budget
// Two job makers: int8Job (gemm_kernel.js; the int8 API) and unitJob (below; the fused unit).
// The fused unit's steps around the GEMM, each a place to change one thing:
//   1. quantize   (CPU, unitJob): floats -> padded int16 codes and scales in wasm memory
//                 (host.qrows / host.qcols), then int8x4 words (host.pack8) for write()
//   2. GEMM       (GPU, flush -> GemmKernel.run): every job of the tick in one submit
//   3. audit      (CPU, job.audit -> GpuEngine.audit): checksum in wasm, tile audit in JS
//   4. epilogue   (CPU, job.finish): host.epi reads the padded C and writes float64 (batch, M, N)
// A different number format (e.g. float64 emulation) is another job maker with its own steps 1,
// 3 and 4; all jobs of one flush run through the one kernel the engine booted (flush), so a job
// that needs another kernel needs flush to group jobs by kernel.
//
// Runs in a browser (navigator.gpu, kernels fetched relative to gemm_kernel.js) and under Node's
// `webgpu` package (pass { gpu }, kernels read from disk through file: URLs).
import { MAX_K, qmatmulT as unitQmatmulT } from '../units.js';
import { bestGemmEngine } from '../engines.js';
import { gateKernel, checksumAuditView, tileAuditView, freivaldsVector, auditKey, view, denseView } from './gpu_gates.js';
import { openDevice } from './device.js';
import { GEMM_KERNELS, GemmKernel, packColsI8, int8Job } from './gemm_kernel.js';
import { WasmUnitHost, gateWasmHost, unitPadding } from './wasm_host.js';
import { routeRule, ruleForAdapter, routeToGpu, describeRoute, MEASURE, shapeKey, newShapeTimes, measuredSide, measureSummary, wholeStepSide } from './route.js';
import { GpuF64Unit, gateF64, spotAudit } from './f64.js';

export class GpuFault extends Error {
  constructor(message, { kind = 'audit', recompute = true } = {}) {
    super(message);
    this.name = 'GpuFault';
    this.kind = kind;
    this.recompute = recompute;   // true: a wrong result came back; redo the step on the CPU
  }
}

function checkOperands(qa, qb, batch, M, K, N) {
  for (const [n, v] of [['batch', batch], ['M', M], ['K', K], ['N', N]]) {
    if (!Number.isInteger(v) || v < (n === 'K' ? 0 : 1)) throw new Error(`gemm: ${n} must be a positive integer, got ${v}`);
  }
  if (!(qa instanceof Int8Array) || !(qb instanceof Int8Array)) throw new Error('gemm: operands must be Int8Array');
  if (qa.length !== batch * M * K) throw new Error(`gemm: A has ${qa.length} values, (batch, M, K) = (${batch}, ${M}, ${K}) needs ${batch * M * K}`);
  if (qb.length !== batch * K * N) throw new Error(`gemm: B has ${qb.length} values, (batch, K, N) = (${batch}, ${K}, ${N}) needs ${batch * K * N}`);
  if (K > MAX_K) throw new Error(`gemm: K=${K} could overflow int32 (MAX_K = ${MAX_K})`);
}

export class GpuEngine extends EventTarget {
  constructor(opts) {
    super();
    this.opts = opts;
    this.name = 'cpu';
    this.status = { path: 'cpu', kernel: null, adapter: null, reasons: [], gates: [] };
    // submits: GPU round trips (one per batch of calls issued in the same tick)
    // routed: fused-unit calls route 'auto' kept on the CPU (not faults; not in cpuCalls)
    // unitCalls: calls run wholly on the GPU by the f64 unit (also counted in gpuCalls)
    this.stats = { calls: 0, gpuCalls: 0, cpuCalls: 0, routed: 0, checksums: 0, tileAudits: 0, submits: 0, unitCalls: 0, spotAudits: 0 };
    this.f64 = null;                      // the f64 unit, once gated
    this.route = routeRule(opts);   // null: every call on the GPU (route.js)
    this.shapeTimes = {};                 // route 'measure': shapeKey -> {cpu, gpu, calls} (route.js)
    this.wholeSteps = null;               // route 'measure': whole steps timed on both paths (wholeStepsTimed), or null
    this.measuredCallbacks = [];
    this.now = opts.now || (() => performance.now());   // the measured route's clock (tests pass one)
    this.kernel = null; this.device = null;
    this.cpu = opts.cpu || bestGemmEngine().engine;
    // the fused unit's CPU ends, only where the wasm engine (same module) passed its gates
    const host = this.cpu.qmatmulT ? new WasmUnitHost() : null, hostBad = host && gateWasmHost(host);
    if (hostBad) this.fault(`fused unit off (int8 API, JS quantizers and audits): ${hostBad}`, 'host', false);
    this.host = hostBad ? null : host;
    this.pending = null;                  // calls issued this tick, submitted together
    this.pendingBytes = 0;
    this.lastBatch = Promise.resolve();
    this.faultCallbacks = [];
    this.auditKey = auditKey(opts.seed ?? 0);
    this.closing = false;
  }

  log(msg) { (this.opts.log || console).log(`[gpu] ${msg}`); }

  // Records a reason; when `fatal`, drops to the CPU for good and tells everyone, loudly.
  fault(reason, kind, fatal = true) {
    this.status.reasons.push(reason);
    if (!fatal) { this.log(reason); return; }
    const wasGpu = this.status.path === 'gpu';
    this.status.path = 'cpu'; this.status.kernel = null; this.name = 'cpu'; this.kernel = null;
    console.error(`[gpu] ${wasGpu ? 'GPU path disabled, computing on CPU' : 'GPU path unavailable'}: ${reason}`);
    const detail = { reason, kind, status: this.status };
    for (const cb of this.faultCallbacks) { try { cb(detail); } catch (e) { console.error('[gpu] onFault callback threw', e); } }
    this.dispatchEvent(Object.assign(new Event('fault'), { detail }));
  }

  reportLost(info) {
    this.lostReported = true;
    this.fault(`device lost (${info.reason || 'unknown'}): ${info.message}`, 'device-lost');
  }

  onFault(cb) { this.faultCallbacks.push(cb); return () => { this.faultCallbacks = this.faultCallbacks.filter((c) => c !== cb); }; }

  // cb(summary) each time every call shape seen so far is decided (route.js measureSummary)
  onMeasured(cb) { this.measuredCallbacks.push(cb); }

  async boot() {
    const o = this.opts;
    let opened;
    try {
      opened = o.device ? { device: o.device, info: o.info || null } : await openDevice(o.gpu ?? globalThis.navigator?.gpu);
    } catch (e) {
      this.fault(e.message, 'no-gpu');
      return this;
    }
    const { device, info } = opened;
    this.device = device; this.ownsDevice = !o.device; this.status.adapter = info;
    if (this.ownsDevice) {
      device.lost.then((li) => { if (!this.closing && !this.lostReported) this.reportLost(li); });
    }
    this.onGpuError = (ev) => this.fault(`uncaptured GPU error: ${ev.error.message}`, 'gpu-error');
    device.addEventListener('uncapturederror', this.onGpuError);
    const langs = new Set(info ? info.wgslLanguageFeatures : [...((o.gpu ?? globalThis.navigator?.gpu)?.wgslLanguageFeatures || [])]);
    for (const spec of o.kernels || GEMM_KERNELS) {
      if (spec.needs && !langs.has(spec.needs)) { this.fault(`${spec.id} kernel skipped: WGSL language feature ${spec.needs} missing`, 'skip', false); continue; }
      let kernel;
      try {
        kernel = await GemmKernel.create(device, spec, { kernelBase: o.kernelBase, tuning: o.tuning });
      } catch (e) { this.fault(`${spec.id} kernel disabled: ${e.message}`, 'compile', false); continue; }
      const packB = o.packB || packColsI8;
      const gate = o.gate === false ? { ok: true, cases: [] }
        : await gateKernel(spec.id, (qa, qb, b, M, K, N) => kernel.gemm(qa, qb, b, M, K, N, packB), { cases: o.gateCases });
      this.status.gates.push({ kernel: spec.id, ok: gate.ok, reason: gate.reason, cases: gate.cases });
      if (!gate.ok) { kernel.destroy(); this.fault(`${spec.id} kernel disabled: ${gate.reason}`, 'gate', false); continue; }
      this.kernel = kernel;
      this.status.path = 'gpu'; this.status.kernel = spec.id; this.name = `webgpu-${spec.id}`;
      this.route = ruleForAdapter(this.route, info, this.opts.routeRule);
      this.status.routing = describeRoute(this.route);
      this.log(`using the ${spec.id} kernel (gates passed: ${gate.cases.length} cases)`);
      await this.bootF64(device, spec, kernel, info);
      return this;
    }
    this.fault('no GPU kernel passed its gate', 'gate');
    return this;
  }

  // The f64 unit on the chosen GEMM kernel, behind its own gate (see the header)
  async bootF64(device, spec, kernel, info) {
    const o = this.opts, want = o.f64Unit ?? 'auto';
    if (want === false) return;
    if (want === 'auto' && (info?.isFallbackAdapter || o.kernels)) {
      this.status.unit = o.kernels ? 'f64 unit off: a custom kernel list (opts.f64Unit: true to gate it)'
        : 'f64 unit off: a software adapter emulates float64 slower than the wasm engine computes it';
      return;
    }
    let unit = null;
    try {
      unit = await GpuF64Unit.create(device, { kernelBase: o.kernelBase, gemm: spec.file, tuning: kernel.tuning, lib: o.f64Lib });
      const gate = o.gate === false ? { ok: true, cases: [] } : await gateF64(unit);
      this.status.gates.push({ kernel: 'f64-unit', ok: gate.ok, reason: gate.reason, cases: gate.cases });
      if (!gate.ok) throw new Error(gate.reason);
      this.f64 = unit;
      this.status.unit = `f64 unit on the ${spec.id} kernel (gate passed: ${gate.cases.length} cases)`;
      this.log(`quantizers and epilogue on the GPU: ${this.status.unit}`);
    } catch (e) {
      if (unit) unit.destroy();
      this.status.unit = 'f64 unit off';
      this.fault(`f64 unit disabled (quantizers and epilogue stay on the CPU): ${e.message}`, 'gate', false);
    }
  }

  // One fused-unit call wholly on the GPU (f64 unit), spot-audited; see the header for faults
  async f64Call(a, transA, b, transB, nb, m, kk, n, out) {
    const unit = this.f64, call = ++this.stats.unitCalls;
    let r;
    try {
      r = await unit.qmatmulT(a, transA, b, transB, nb, m, kk, n, out);
    } catch (e) {
      if (this.f64 === unit) { this.f64 = null; unit.destroy(); this.fault(`f64 unit disabled after a failed submit (${nb}x${m}x${kk}x${n}): ${e.message}`, 'error', false); }
      r = null;
    }
    if (!r) { this.stats.cpuCalls++; return this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out); }   // non-finite operand or failed submit
    this.stats.gpuCalls++;
    this.stats.spotAudits++;
    const bad = spotAudit(a, transA, b, transB, nb, m, kk, n, r, this.auditKey, call, this.opts.spotSamples ?? 8);
    if (bad) {
      const reason = `f64 unit failed an audit on call ${call} (${nb}x${m}x${kk}x${n}): ${bad}`;
      if (this.f64 === unit) { this.f64 = null; unit.destroy(); }
      this.fault(reason, 'audit');
      throw new GpuFault(reason, { kind: 'audit', recompute: true });
    }
    return r;
  }

  // The largest bytes one batch may upload or read back (its buffers grow to the next power of 2).
  batchLimit() { return Math.min(this.device.limits.maxBufferSize, this.device.limits.maxStorageBufferBindingSize) / 4; }

  // The int8 contract: int8 (batch, M, K) @ (batch, K, N) -> Int32Array. Always exact: GPU when
  // proven, else the CPU engine.
  async gemm(qa, qb, batch, M, K, N) {
    checkOperands(qa, qb, batch, M, K, N);
    this.stats.calls++;
    const K4 = Math.ceil(K / 4), bytes = 4 * (batch * M * N + batch * (M + N) * K4);
    if (!this.kernel || K === 0 || bytes > this.batchLimit()) { this.stats.cpuCalls++; return this.cpu.gemm(qa, qb, batch, M, K, N); }
    const job = int8Job(qa, qb, batch, M, K, N, this.opts.packB || packColsI8);
    let c = null;
    Object.assign(job, {
      shape: `${batch}x${M}x${K}x${N}`, bytes,
      take: (view) => { c = view.slice(); },
      audit: (call) => this.audit(denseView(qa, M, K), denseView(qb, K, N), denseView(c, M, N), batch, M, K, N, call),
      finish: () => c,
      cpu: () => this.cpu.gemm(qa, qb, batch, M, K, N),
    });
    return this.enqueue(job);
  }

  // The fused unit, units.qmatmulT's contract: a holds A (batch, M, K) or, transA, A^T (batch, K, M);
  // b holds B (batch, K, N) or, transB, B^T (batch, N, K); -> Float64Array (batch, M, N), into
  // `out` when given. Quantized now (wasm, into the host's memory), GEMM on the GPU with the other
  // calls of this tick, epilogue (wasm) once the result passed its audits.
  qmatmulT(a, transA, b, transB, nb, m, kk, n, out = undefined) {
    if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
    if (this.route?.measure) return this.measuredCall(a, transA, b, transB, nb, m, kk, n, out);
    if (!routeToGpu(this.route, nb, m, kk, n) && this.kernel && kk > 0) { this.stats.calls++; this.stats.routed++; return this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out); }
    return this.gpuUnit(a, transA, b, transB, nb, m, kk, n, out);
  }

  // route 'measure': the call on the side route.js measuredSide says; while its shape is being
  // measured, timed (the engine's clock around the awaited result) and recorded
  async measuredCall(a, transA, b, transB, nb, m, kk, n, out) {
    if (!this.kernel || kk === 0) return this.gpuUnit(a, transA, b, transB, nb, m, kk, n, out);   // the CPU anyway
    const key = shapeKey(transA, transB, nb, m, kk, n), e = (this.shapeTimes[key] ||= newShapeTimes());
    e.calls++;
    const { side: shapeSide, decided } = measuredSide(e, MEASURE.samples);
    const side = decided && this.wholeSteps?.side === 'cpu' ? 'cpu' : shapeSide;
    const run = () => (side === 'gpu' ? this.gpuUnit(a, transA, b, transB, nb, m, kk, n, out)
      : (this.stats.calls++, this.stats.routed++, this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out)));
    if (decided) return run();
    const t0 = this.now(), result = await run();
    e[side].push(this.now() - t0);
    if (measuredSide(e, MEASURE.samples).decided) this.measured();
    return result;
  }

  // Whole steps timed on both paths once the shapes were decided (backends.js settle): the GEMM
  // calls timed apart miss what the GPU route costs the rest of the step (on the H100 the shapes'
  // medians promised 1.08x and whole steps ran at 0.69x, TEST_RESULTS "The resident step on the
  // lent H100"). {cpuMs, pickedMs} medians -> route.js wholeStepSide; 'cpu' keeps every shape there.
  wholeStepsTimed({ cpuMs, pickedMs }) {
    this.wholeSteps = { cpuMs, pickedMs, side: wholeStepSide(cpuMs, pickedMs) };
    this.measured();
  }

  // a shape was just decided: when every shape seen is, the summary goes to status and callbacks
  measured() {
    const summary = measureSummary(this.shapeTimes, MEASURE.samples, this.wholeSteps);
    if (!summary.decided) return;
    this.status.measure = summary;
    for (const cb of this.measuredCallbacks) { try { cb(summary); } catch (e) { console.error('[gpu] onMeasured callback threw', e); } }
  }

  // the fused unit on the GPU (the f64 unit where it booted, else the GPU GEMM with the wasm
  // host's quantizers and epilogue), or the CPU when the GPU cannot take the call
  gpuUnit(a, transA, b, transB, nb, m, kk, n, out) {
    // (operands that do not fit the shape take the path below, which names the problem)
    if (this.f64 && this.kernel && kk > 0
      && a.length === nb * m * kk && b.length === nb * kk * n && this.f64.fits(nb, m, n)
      && 8 * Math.max(a.length + b.length, nb * m * n + 64) <= this.batchLimit() * 2) {
      this.stats.calls++;
      return this.f64Call(a, transA, b, transB, nb, m, kk, n, out);
    }
    const h = this.host;
    if (!h) return unitQmatmulT({ gemm: (...args) => this.gemm(...args) }, a, transA, b, transB, nb, m, kk, n, out);
    this.stats.calls++;
    const { kp, mp, np } = unitPadding(m, kk, n);
    const bytes = 4 * nb * mp * np + 2 * nb * (mp + np) * kp;
    if (!this.kernel || kk === 0 || bytes > this.batchLimit()) { this.stats.cpuCalls++; return this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out); }
    // (batch, Mp, Kp) and (batch, Np, Kp) int16 codes, scales, padded C, result: live until done
    h.live++;
    try {
      return this.enqueue(this.unitJob(h, a, transA, b, transB, nb, m, kk, n, out, kp, mp, np, bytes));
    } catch (e) {
      h.done();
      throw e;
    }
  }

  // The fused unit's job (see "Jobs" in the header): step 1 (quantize) runs now; steps 3 and 4
  // (audit, epilogue) when the engine calls job.audit and job.finish after the GEMM.
  unitJob(h, a, transA, b, transB, nb, m, kk, n, out, kp, mp, np, bytes) {
    // 1. quantize: floats -> padded int16 codes + scales, then int8x4 words, all in wasm memory
    const oA = h.alloc(nb * mp * kp * 2), oB = h.alloc(nb * np * kp * 2), oSa = h.alloc(nb * m * 8), oSb = h.alloc(nb * n * 8);
    const oC = h.alloc(nb * mp * np * 4), oOut = h.alloc(nb * m * n * 8);
    const top = h.top, oXa = h.alloc(a.length * 8), oXb = h.alloc(b.length * 8);   // the floats: only for now
    let buf = h.mem.buffer;
    new Float64Array(buf, oXa, a.length).set(a);
    new Float64Array(buf, oXb, b.length).set(b);
    if (kp !== kk || mp !== m) new Int16Array(buf, oA, nb * mp * kp).fill(0);
    if (kp !== kk || np !== n) new Int16Array(buf, oB, nb * np * kp).fill(0);
    (transA ? h.qcols : h.qrows)(oXa, oA, oSa, nb, m, kk, mp, kp);   // A's logical row i
    (transB ? h.qrows : h.qcols)(oXb, oB, oSb, nb, n, kk, np, kp);   // B's logical column j
    h.top = top;
    // the kernels' int8x4 words of both operands, uploaded straight from wasm memory
    const aBytes = nb * mp * kp, bBytes = nb * np * kp, oA8 = h.alloc(aBytes), oB8 = h.alloc(bBytes);
    h.pack8(oA, oA8, aBytes);
    h.pack8(oB, oB8, bBytes);
    const job = {
      batch: nb, M: mp, N: np, K4: kp / 4, aWords: aBytes / 4, bWords: bBytes / 4,
      shape: `${nb}x${m}x${kk}x${n}`, bytes,
      write(queue, buffer, aByte, bByte) {
        queue.writeBuffer(buffer, aByte, h.mem.buffer, oA8, aBytes);
        queue.writeBuffer(buffer, bByte, h.mem.buffer, oB8, bBytes);
      },
      take: (c) => { new Int32Array(h.mem.buffer, oC, c.length).set(c); },
      // 3. audit the padded C in wasm memory (checksum in wasm, tile audit in JS)
      audit: (call) => {
        const views = () => {
          buf = h.mem.buffer;
          return [view(new Int16Array(buf), oA / 2, mp * kp, kp, 1), view(new Int16Array(buf), oB / 2, np * kp, 1, kp),
            view(new Int32Array(buf), oC / 4, mp * np, np, 1)];
        };
        const wasmChecksum = () => {
          const row = h.auditAt(oA, oB, oC, freivaldsVector(this.auditKey, call, kk, n), nb, m, kk, n, mp, np, kp);
          if (!row) return null;
          const b = Math.floor((row - 1) / m), i = (row - 1) % m;
          return checksumAuditView(...views(), nb, m, kk, n, this.auditKey, call)
            || `checksum audit (wasm): batch ${b} row ${i} failed; the JS audit disagrees`;
        };
        return this.audit(...views(), nb, m, kk, n, call, wasmChecksum);
      },
      // 4. epilogue: padded C (batch, Mp, Np) int32 + scales -> float64 (batch, M, N)
      finish: () => {
        h.epi(oC, oSa, oSb, oOut, nb, m, n, mp, np);
        const result = new Float64Array(h.mem.buffer, oOut, nb * m * n);
        return out ? (out.set(result), out) : result.slice();
      },
      cpu: () => this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out),
      done: () => h.done(),
    };
    return job;
  }

  cpuUnit(a, transA, b, transB, nb, m, kk, n, out) {
    return this.cpu.qmatmulT ? this.cpu.qmatmulT(a, transA, b, transB, nb, m, kk, n, out)
      : unitQmatmulT(this.cpu, a, transA, b, transB, nb, m, kk, n, out);
  }

  // -> Promise of the job's result; jobs issued in the same tick share one submit.
  enqueue(job) {
    if (this.pending && this.pendingBytes + job.bytes > this.batchLimit()) this.flush();
    return new Promise((resolve, reject) => {
      Object.assign(job, { resolve, reject });
      if (!this.pending) { this.pending = []; this.pendingBytes = 0; queueMicrotask(() => this.flush()); }
      this.pending.push(job); this.pendingBytes += job.bytes;
    });
  }

  flush() {
    const jobs = this.pending;
    if (!jobs) return;
    this.pending = null;
    const kernel = this.kernel, prev = this.lastBatch;
    this.lastBatch = (async () => {
      let error = null;
      if (kernel) {
        this.stats.submits++;
        // 2. the GEMMs of every job of the tick: one submit, one mapAsync
        try { await kernel.run(jobs, (i, c) => jobs[i].take(c)); } catch (e) { error = e; }
      }
      await prev;            // batches finish in submission order: call numbers follow issue order
      if (error) await this.submitFailed(kernel, jobs, error);
      for (const job of jobs) {
        try {
          if (error || !kernel || this.kernel !== kernel) {   // lost, faulted or failed: don't trust it
            this.stats.cpuCalls++;
            job.resolve(await job.cpu());
            continue;
          }
          this.stats.gpuCalls++;
          const call = this.stats.gpuCalls, bad = job.audit(call);
          if (bad) {
            const reason = `${kernel.id} kernel failed an audit on call ${call} (${job.shape}): ${bad}`;
            this.fault(reason, 'audit');
            job.reject(new GpuFault(reason, { kind: 'audit', recompute: true }));
            continue;
          }
          job.resolve(job.finish());
        } catch (e) {
          job.reject(e);
        } finally {
          if (job.done) job.done();
        }
      }
    })();
  }

  async submitFailed(kernel, jobs, e) {
    // A submit that fails because the device went away (e.g. mapAsync aborted) usually rejects
    // before device.lost resolves: give it a moment so the reason names the real cause.
    const lost = this.device && await Promise.race([this.device.lost, new Promise((r) => setTimeout(r, 100, null))]);
    if (lost) { if (!this.lostReported) this.reportLost(lost); return; }
    if (this.kernel !== kernel) return;      // already faulted for another reason
    this.fault(`${kernel.id} kernel failed a submit of ${jobs.length} call(s) (${jobs.map((j) => j.shape).join(', ')}): ${e.message}`, 'error');
  }

  // Audits of one GPU result (operands and C as gpu_gates.js views) -> null or the reason;
  // checksum: the same check in wasm where the unit's host has it (-> null or the reason)
  audit(A, B, C, batch, M, K, N, call, checksum = null) {
    let bad = null;
    if (this.opts.checksum !== false) {
      this.stats.checksums++;
      bad = checksum ? checksum() : checksumAuditView(A, B, C, batch, M, K, N, this.auditKey, call);
    }
    const every = this.opts.auditEvery ?? 8;
    if (!bad && every > 0 && call % every === 0) {
      this.stats.tileAudits++;
      bad = tileAuditView(A, B, C, batch, M, K, N, this.auditKey, call, this.opts.auditTile ?? 8);
    }
    return bad;
  }

  destroy() {
    this.closing = true;
    if (this.device && this.onGpuError) this.device.removeEventListener('uncapturederror', this.onGpuError);
    if (this.kernel) this.kernel.destroy();
    if (this.f64) this.f64.destroy();
    this.f64 = null;
    if (this.ownsDevice && this.device) this.device.destroy();
    this.kernel = null; this.status.path = 'cpu'; this.name = 'cpu';
  }
}

// createGpuEngine({ gpu, auditEvery = 8, auditTile = 8, checksum = true, seed, kernelBase, tuning,
//                   kernels, onFault, onMeasured, device, info, route = 'all' | 'auto' | 'measure',
//                   routeRule = ROUTE (an explicit rule: also measured on a software adapter), now,
//                   f64Unit = 'auto' | true | false, f64Lib, spotSamples = 8 })
// -> GpuEngine (never null: when the GPU is
// unusable it runs on the CPU and engine.status = { path: 'cpu', reasons: [...] } says why).
export async function createGpuEngine(opts = {}) {
  const engine = new GpuEngine(opts);
  if (opts.onFault) engine.onFault(opts.onFault);
  if (opts.onMeasured) engine.onMeasured(opts.onMeasured);
  return engine.boot();
}

// Runs stepFn(engine) (which must not mutate state before it returns); when the GPU returned a
// wrong result (GpuFault) the engine is on the CPU by then, so the step is simply computed again.
export async function withGpuFallback(engine, stepFn) {
  try {
    return await stepFn(engine);
  } catch (e) {
    if (!(e instanceof GpuFault)) throw e;
    console.error(`[gpu] recomputing the step on CPU: ${e.message}`);
    return stepFn(engine);
  }
}
