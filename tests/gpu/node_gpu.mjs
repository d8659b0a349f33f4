// WebGPU under Node for the tests in tests/gpu/*.test.mjs: the npm package `webgpu` (Dawn) on
// NODE_PATH, on SwiftShader (tests/test_webgpu_node.py sets NODE_PATH, LD_LIBRARY_PATH and
// VK_ICD_FILENAMES; .ci/run installs the package into .gpu/). -> the GPU object (navigator.gpu's
// counterpart); the WebGPU globals (GPUBufferUsage, ...) are set on globalThis.
import { createRequire } from 'node:module';

export function nodeGpu() {
  const webgpu = createRequire(import.meta.url)('webgpu');
  Object.assign(globalThis, webgpu.globals);
  return webgpu.create([]);
}
