// Every compute dispatch encoded on `device` timed on the GPU (resident_profile.mjs, audit_cost.mjs):
// each in a compute pass of its own with timestampWrites. A profile: the passes are split, nothing
// else changes (both benches check that the gradients equal an unprofiled step's or the other runs').
// Needs a device with 'timestamp-query'.
//   const timer = timeDispatches(device, label)    label(pipeline, workgroups) -> what to record
//   timer.start(); <encode and submit the work>; const { labels, ms, spanMs } = await timer.read();
//   timer.restore()                                  device.createCommandEncoder as it was
export function timeDispatches(device, label, maxQueries = 4096) {
  const qs = device.createQuerySet({ type: 'timestamp', count: maxQueries }), labels = [];
  const realCreate = device.createCommandEncoder.bind(device);
  device.createCommandEncoder = (desc) => {
    const enc = realCreate(desc), begin = enc.beginComputePass.bind(enc);
    enc.beginComputePass = () => {
      let pipe = null; const groups = [];
      return {
        setPipeline(p) { pipe = p; }, setBindGroup(i, bg) { groups[i] = bg; }, end() {},
        dispatchWorkgroups(gx, gy = 1, gz = 1) {
          const q = labels.length * 2;
          if (q + 2 > maxQueries) throw new Error(`more dispatches than the query set's ${maxQueries / 2}`);
          labels.push(label(pipe, gx * gy * gz));
          const pass = begin({ timestampWrites: { querySet: qs, beginningOfPassWriteIndex: q, endOfPassWriteIndex: q + 1 } });
          pass.setPipeline(pipe); groups.forEach((bg, i) => pass.setBindGroup(i, bg)); pass.dispatchWorkgroups(gx, gy, gz); pass.end();
        },
      };
    };
    return enc;
  };
  return {
    start() { labels.length = 0; },
    // the dispatches since start(), after the work submitted so far -> {labels, ms (each dispatch's), spanMs}
    async read() {
      const n = labels.length * 2;
      const resolve = device.createBuffer({ size: n * 8, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
      const read = device.createBuffer({ size: n * 8, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      const enc = realCreate();
      enc.resolveQuerySet(qs, 0, n, resolve, 0); enc.copyBufferToBuffer(resolve, 0, read, 0, n * 8);
      device.queue.submit([enc.finish()]);
      await read.mapAsync(GPUMapMode.READ);
      const ts = new BigUint64Array(read.getMappedRange().slice(0));
      read.unmap(); read.destroy(); resolve.destroy();
      const ms = labels.map((_, i) => Number(ts[2 * i + 1] - ts[2 * i]) / 1e6);
      return { labels: labels.slice(), ms, spanMs: n ? Number(ts[n - 1] - ts[0]) / 1e6 : 0 };
    },
    restore() { device.createCommandEncoder = realCreate; },
  };
}
