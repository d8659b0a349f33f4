// The CPU integer engines available here, best first (the WebAssembly SIMD one only when it
// loaded and passed its gate against the scalar engine).
import { cpuEngine } from './units.js';

export function engines() {
  return [cpuEngine];
}
