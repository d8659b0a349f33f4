// Where a slot's batch for a step comes from (mirrors daisy/train.py's BatchSource):
//   StreamBatches(stream, cfg)   data.getBatch on a token stream (the CLI, tests)
//   HttpBatches(cfg, opts)       the Space's GET /data/batch?seed&step&slot&batch&seq_len
//                                (daisy/datastream.py): little-endian uint16, (B, T+1) row-major
// get(step, slot) -> Promise of {x, y}: Int32Array (B*T) each, row-major (B, T).
// HttpBatches prefetches the next `ahead` steps of its slot, so a step never waits on the
// network or the Hub once the pipeline is full; a failed fetch is retried `retries` times.
import { getBatch } from './data.js';
import { VOCAB_SIZE } from './tokenizer.js';

export class StreamBatches {
  constructor(stream, cfg) { this.stream = stream; this.cfg = cfg; }

  async get(step, slot) {
    const { cfg } = this;
    return getBatch(this.stream, cfg.seed, step, slot, cfg.batch, cfg.seq_len);
  }
}

export class HttpBatches {
  constructor(cfg, { base = '', dataId = null, ahead = 4, retries = 2, fetchFn = globalThis.fetch.bind(globalThis) } = {}) {
    this.cfg = cfg; this.base = base; this.dataId = dataId; this.ahead = ahead; this.retries = retries;
    this.fetch = fetchFn;
    this.inflight = new Map();     // "step:slot" -> Promise of {x, y}
    this.waitMs = 0;               // time get() spent waiting (a full pipeline keeps it ~0)
  }

  url(step, slot) {
    const { cfg } = this;
    const q = new URLSearchParams({ seed: cfg.seed, step, slot, batch: cfg.batch, seq_len: cfg.seq_len });
    return `${this.base}/data/batch?${q}`;
  }

  async fetchBatch(step, slot) {
    const { batch: B, seq_len: T } = this.cfg;
    let lastErr;
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      try {
        const res = await this.fetch(this.url(step, slot));
        if (!res.ok) {
          const body = await res.json().catch(() => ({}));
          throw new Error(`data route: ${body.error || 'HTTP ' + res.status}`);
        }
        const id = res.headers.get('X-Daisy-Data-Id');
        if (this.dataId && id && id !== this.dataId) {
          throw new Error(`the data changed under the run: the server now serves ${id}, the run trains on ${this.dataId}`);
        }
        const buf = await res.arrayBuffer();
        if (buf.byteLength !== 2 * B * (T + 1)) throw new Error(`data route sent ${buf.byteLength} bytes for a batch, expected ${2 * B * (T + 1)}`);
        const dv = new DataView(buf);
        const x = new Int32Array(B * T), y = new Int32Array(B * T);
        for (let b = 0; b < B; b++) {
          for (let t = 0; t <= T; t++) {
            const tok = dv.getUint16(2 * (b * (T + 1) + t), true);
            if (tok >= VOCAB_SIZE) throw new Error(`data route sent token ${tok}, outside the vocabulary`);
            if (t < T) x[b * T + t] = tok;
            if (t > 0) y[b * T + t - 1] = tok;
          }
        }
        return { x, y };
      } catch (err) {
        lastErr = err;
        if (/data changed/.test(err.message)) break;
      }
    }
    throw lastErr;
  }

  request(step, slot) {
    const key = `${step}:${slot}`;
    let p = this.inflight.get(key);
    if (!p) {
      p = this.fetchBatch(step, slot);
      p.catch(() => {});             // a prefetch nobody awaits must not be an unhandled rejection
      this.inflight.set(key, p);
    }
    return p;
  }

  async get(step, slot) {
    const t0 = performance.now();
    const p = this.request(step, slot);
    for (let k = 1; k <= this.ahead; k++) if (step + k < this.cfg.steps) this.request(step + k, slot);
    try {
      return await p;
    } finally {
      this.inflight.delete(`${step}:${slot}`);
      for (const key of this.inflight.keys()) if (Number(key.split(':')[0]) < step) this.inflight.delete(key);
      this.waitMs += performance.now() - t0;
    }
  }
}
