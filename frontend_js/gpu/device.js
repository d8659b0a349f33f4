// WebGPU device helpers, nothing GEMM-specific: open a device with the adapter's own limits,
// compile a WGSL kernel (compiler messages in the error), submit inside error scopes, plain
// storage/uniform buffers, read a buffer back, and load a kernel's text (fetch in a browser,
// the file system for file: URLs under Node's `webgpu` package).

// the error scopes every checked submit pushes (and pops in reverse)
export const ERROR_SCOPES = ['validation', 'out-of-memory', 'internal'];

// Text of a URL: fetch over http(s), the file system for file: URLs (Node).
export async function loadText(url) {
  const u = new URL(url);
  if (u.protocol === 'file:') {
    const { readFile } = await import('node:fs/promises');
    return readFile(u, 'utf8');
  }
  const res = await fetch(u);
  if (!res.ok) throw new Error(`fetch ${u.href}: HTTP ${res.status}`);
  return res.text();
}

// -> { adapter, device, info }; throws Error with a human reason when there is no usable GPU.
// Under Node's `webgpu` the GPU object (create()) owns the instance its devices live in: collected
// by the GC while a device is in use, the process crashed (segfaults and aborts on the H100 at the
// first collection, TEST_RESULTS "The resident step on the lent H100"). A page's navigator.gpu lives
// as long as the page; here every GPU object a device was opened from is held for the process.
const openedFrom = new Set();

export async function openDevice(gpu, { features = [] } = {}) {
  if (!gpu) throw new Error('WebGPU is missing (navigator.gpu is undefined)');
  openedFrom.add(gpu);
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error('WebGPU has no adapter (requestAdapter returned null)');
  const lim = adapter.limits;
  const requiredLimits = {
    maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize,
    maxBufferSize: lim.maxBufferSize,
    maxComputeWorkgroupStorageSize: lim.maxComputeWorkgroupStorageSize,
    maxComputeInvocationsPerWorkgroup: lim.maxComputeInvocationsPerWorkgroup,
    maxComputeWorkgroupSizeX: lim.maxComputeWorkgroupSizeX,
    maxComputeWorkgroupSizeY: lim.maxComputeWorkgroupSizeY,
  };
  const requiredFeatures = features.filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  const ai = adapter.info || {};
  const info = {
    vendor: ai.vendor, architecture: ai.architecture, device: ai.device, description: ai.description,
    isFallbackAdapter: ai.isFallbackAdapter ?? adapter.isFallbackAdapter ?? null,
    subgroupMinSize: ai.subgroupMinSize, subgroupMaxSize: ai.subgroupMaxSize,
    wgslLanguageFeatures: [...(gpu.wgslLanguageFeatures || [])].sort(),
    features: [...adapter.features].sort(),
    maxStorageBufferBindingSize: device.limits.maxStorageBufferBindingSize,
  };
  return { adapter, device, info };
}

// Compiles a .wgsl file into a compute pipeline; throws with the compiler's messages.
export async function compileKernel(device, code, constants, label) {
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ code, label });
  const msgs = (await module.getCompilationInfo()).messages.filter((m) => m.type === 'error');
  if (msgs.length) {
    await device.popErrorScope();
    throw new Error(`shader ${label} does not compile: ${msgs.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join('; ')}`);
  }
  let pipeline;
  try {
    pipeline = await device.createComputePipelineAsync({ layout: 'auto', label, compute: { module, entryPoint: 'main', constants } });
  } finally {
    const err = await device.popErrorScope();
    if (err && !pipeline) throw new Error(`pipeline ${label}: ${err.message}`);
  }
  return pipeline;
}

// A pipeline's bind group layout 0, asked of it once: a step makes ~200 bind groups, and each
// getBindGroupLayout call makes a new layout object (Node's Dawn: a crossing and an allocation)
const layouts = new WeakMap();
export function bindLayout(pipe) {
  let layout = layouts.get(pipe);
  if (!layout) { layout = pipe.getBindGroupLayout(0); layouts.set(pipe, layout); }
  return layout;
}

// Runs fn(encoder) on the queue inside validation/OOM/internal error scopes; throws on any error.
export async function submitChecked(device, fn) {
  for (const s of ERROR_SCOPES) device.pushErrorScope(s);
  const enc = device.createCommandEncoder();
  fn(enc);
  device.queue.submit([enc.finish()]);
  const errs = [];
  for (let i = 0; i < ERROR_SCOPES.length; i++) { const e = await device.popErrorScope(); if (e) errs.push(e.message); }
  if (errs.length) throw new Error(`GPU error: ${errs.join('; ')}`);
}

export function storageBuffer(device, bytes, data) {
  const buf = device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 4) * 4), usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  if (data) device.queue.writeBuffer(buf, 0, data);
  return buf;
}

export function uniformBuffer(device, words) {
  const data = new Uint32Array(Math.max(4, Math.ceil(words.length / 4) * 4));
  data.set(words);
  const buf = device.createBuffer({ size: data.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  device.queue.writeBuffer(buf, 0, data);
  return buf;
}

// Copies `bytes` of src back to the CPU -> ArrayBuffer (after the queued work).
export async function readBack(device, src, bytes) {
  const size = Math.ceil(bytes / 4) * 4;
  const read = device.createBuffer({ size: Math.max(16, size), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  try {
    await submitChecked(device, (enc) => enc.copyBufferToBuffer(src, 0, read, 0, size));
    await read.mapAsync(GPUMapMode.READ);
    return read.getMappedRange(0, size).slice(0);
  } finally {
    read.destroy();
  }
}
