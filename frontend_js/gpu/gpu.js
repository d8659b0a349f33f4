// The WebGPU driver's public entry: what the page, the tests and the benches import. One module
// per job (docs/ARCHITECTURE.md "Compute"):
//   device.js       device helpers: openDevice, compileKernel, submitChecked, buffers, readBack, loadText
//   gemm_kernel.js  the GEMM kernel: GEMM_KERNELS, GemmKernel (batched run), packRowsI8 / packColsI8
//   wasm_host.js    the wasm host: quantizers, pack8, audit and epilogue of the fused unit (GEMM_WASM)
//   route.js        routing: ROUTE, gpuPays, which fused-unit calls go to the GPU
//   engine.js       the engine: GpuEngine, createGpuEngine, withGpuFallback, GpuFault; its header
//                   describes the jobs and the steps around the GEMM (quantize, GEMM, audit, epilogue)
//   gpu_gates.js    boot gates and training-time audits
//   f64.js          the whole INT8 unit on the GPU in emulated float64 (kernels/f64_lib.wgsl), its gate
//                   and spot audit (docs/VERIFICATION.md §9.1); the engine uses it on real GPUs
//   resident.js     the resident step: the rest of the step's pieces as kernels, the forward and
//                   backward passes in one submit, ResidentTrainer (docs/VERIFICATION.md §9.2)
//   resident_gates.js  their gate against the JS twins; createResidentStep (the device, the kernels, gated)
export { loadText, openDevice, compileKernel, submitChecked, storageBuffer, uniformBuffer, readBack } from './device.js';
export { KERNEL_BASE, PACKED_FEATURE, GEMM_KERNELS, DEFAULT_TUNING, GemmKernel, packRowsI8, packColsI8 } from './gemm_kernel.js';
export { WasmUnitHost, gateWasmHost } from './wasm_host.js';
export { ROUTE, gpuPays } from './route.js';
export { GpuFault, GpuEngine, createGpuEngine, withGpuFallback } from './engine.js';
export { GpuF64Unit, gateF64, spotAudit } from './f64.js';
export { ResidentKernels, ResidentTrainer, residentForward } from './resident.js';
export { gateResident, createResidentStep } from './resident_gates.js';
