// Facts about the machine this code runs on, one copy each (every module imports them here).
//   IS_NODE         Node (worker_threads, node:os) rather than a browser (Worker, navigator)
//   LITTLE_ENDIAN   the host's byte order: the wire formats, the state body and the wasm kernels
//                   are little-endian, and a typed-array view of their bytes reads them only there
export const IS_NODE = typeof process !== 'undefined' && !!(process.versions && process.versions.node);
export const LITTLE_ENDIAN = new Uint8Array(new Float64Array([1]).buffer)[7] === 0x3f;
