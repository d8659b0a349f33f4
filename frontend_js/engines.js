// The CPU integer engines available here, best first: the WebAssembly SIMD engine when it
// compiles and passes its gate against the scalar engine, then the scalar engine (always).
import { cpuEngine } from './units.js';
import { createWasmEngine } from './wasm_gemm.js';

let cached = null;
export let wasmUnavailable = null;      // why the SIMD engine is not offered (null when it is)

export function engines() {
  if (cached) return cached;
  cached = [];
  try {
    cached.push(createWasmEngine());
  } catch (e) {
    wasmUnavailable = e.message;
  }
  cached.push(cpuEngine);
  return cached;
}

// the engine the trainer uses: the first of engines()
export async function bestEngine() {
  return engines()[0];
}
