// The job format between threads.js (the caller) and thread_worker.js (each worker): one table of
// kernel ids and the layout of the control block, a SharedArrayBuffer read as Int32 and Float64:
//   i32[GEN]   bumped once per job (the workers wait on it)
//   i32[DONE]  workers finished with the job (the caller waits on it)
//   i32[ERR]   0, or 1 + the slot of the first worker whose call threw
//   f64[slotBase(w) ...]  worker w's calls: count, then per call: kernel id, then MAX_ARGS arguments
// Arguments are wasm i32 pointers/counts or f64 scalars, all exact as float64.
export const KERNELS = ['gemm', 'qrows', 'qcols', 'qcolsLd', 'epi', 'softmaxRows', 'rmsnormRows',
  'rmsnormBackRows', 'softmaxBackRows', 'relu', 'reluBack', 'adamStep', 'copy'];
export const KERNEL_ID = Object.freeze(Object.fromEntries(KERNELS.map((k, i) => [k, i])));
export const STOP = -1;
export const CTL = Object.freeze({ GEN: 0, DONE: 1, ERR: 2 });
export const MAX_ARGS = 12, MAX_CALLS = 8;
const HEADER_F64 = 2, CALL_F64 = 1 + MAX_ARGS, SLOT_F64 = 1 + MAX_CALLS * CALL_F64;
export const slotBase = (w) => HEADER_F64 + w * SLOT_F64;
export const controlBytes = (slots) => 8 * slotBase(slots);

// write worker w's calls ([[id, ...args], ...]) into its slot
export function writeSlot(f64, w, calls) {
  if (calls.length > MAX_CALLS) throw new Error(`a thread job holds at most ${MAX_CALLS} calls, got ${calls.length}`);
  let o = slotBase(w);
  f64[o++] = calls.length;
  for (const [id, ...args] of calls) {
    if (args.length > MAX_ARGS) throw new Error(`a kernel call takes at most ${MAX_ARGS} arguments, got ${args.length}`);
    f64[o] = id;
    for (let i = 0; i < args.length; i++) f64[o + 1 + i] = args[i];
    o += CALL_F64;
  }
}

// worker w's calls as [id, args]: all MAX_ARGS slots (a wasm export ignores arguments past its own)
export function* slotCalls(f64, w) {
  let o = slotBase(w);
  const n = f64[o++];
  for (let c = 0; c < n; c++, o += CALL_F64) {
    const id = f64[o];
    const args = [];
    for (let i = 0; i < MAX_ARGS; i++) args.push(f64[o + 1 + i]);
    yield [id, args];
  }
}
