// Where a slot's batch for a step comes from (twin of daisy/batch_source.py):
//   StreamBatches(stream, cfg)   data.getBatch on a token stream (the CLI, tests)
//   HttpBatches(cfg, opts)       the Space's GET /data/batch?seed&step&slot&batch&seq_len
//                                (daisy/space/datastream/source.py): little-endian uint16, (B, T+1) row-major
// get(step, slot) -> Promise of {x, y}: Int32Array (B*T) each, row-major (B, T).
// one(step, slot): the same batch, alone: no prefetch, no wait counted (an audit's recomputation
// of another slot's past step, run/audits.js).
// HttpBatches prefetches the next `ahead` steps of its slot, so a step never waits on the
// network or the Hub once the pipeline is full; a failed fetch is retried `retries` times unless
// retrying cannot help (the BatchError's code: a changed data id, a parameter the server refused).
// The server unreachable (a restart: no connection, or a proxy's 502/503/504 with no answer of
// the app behind it) is retried with backoff for up to `outageMs`, then fails naming the outage;
// `onOutage(down, why)` is told when that starts and ends (docs/ARCHITECTURE.md "Server outage").
// close() stops the retries and forgets what is in flight (Python's also ends its thread pool).
import { getBatch } from './data.js';
import { VOCAB_SIZE } from './tokenizer.js';

export const DATA_WAIT_MS = 60_000;              // bound on waiting for an unreachable data server
const BACKOFF_MS = [250, 500, 1000, 2000];       // then every 2 s: peers resume within 2 s of each other
const UNREACHABLE_STATUS = new Set([502, 503, 504]);

// BatchError codes (= daisy/batch_source.py); the server's answers carry the last two in their
// JSON `code` (daisy/space/datastream/errors.py ERROR_CODES)
export const BATCH_ERRORS = Object.freeze({ UNREACHABLE: 'unreachable', DATA_CHANGED: 'data_changed', BAD_ANSWER: 'bad_answer',
  BAD_PARAMETER: 'bad_parameter', DATA_UNAVAILABLE: 'data_unavailable' });
const E = BATCH_ERRORS;
const NOT_RETRIED = new Set([E.DATA_CHANGED, E.BAD_PARAMETER]);   // the same request gets the same answer

// a batch cannot be had; `code` says which kind (BATCH_ERRORS), the message says why
export class BatchError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class StreamBatches {
  constructor(stream, cfg) { this.stream = stream; this.cfg = cfg; }

  async get(step, slot) {
    const { cfg } = this;
    return getBatch(this.stream, cfg.seed, step, slot, cfg.batch, cfg.seq_len);
  }

  one(step, slot) { return this.get(step, slot); }

  close() {}
}

export class HttpBatches {
  constructor(cfg, { base = '', dataId = null, ahead = 4, retries = 2, outageMs = DATA_WAIT_MS, onOutage = null,
                     fetchFn = globalThis.fetch.bind(globalThis) } = {}) {
    this.cfg = cfg; this.base = base; this.dataId = dataId ?? null; this.ahead = ahead; this.retries = retries;
    this.outageMs = outageMs; this.onOutage = onOutage;
    this.fetch = fetchFn;
    this.down = null;              // why the server is unreachable now, or null
    this.closed = false;
    this.inflight = new Map();     // "step:slot" -> Promise of {x, y}
    this.waitMs = 0;               // time get() spent waiting (a full pipeline keeps it ~0)
  }

  url(step, slot) {
    const { cfg } = this;
    const q = new URLSearchParams({ seed: cfg.seed, step, slot, batch: cfg.batch, seq_len: cfg.seq_len });
    return `${this.base}/data/batch?${q}`;
  }

  // the server is (un)reachable: tell onOutage on each change
  setDown(why) {
    if ((why === null) === (this.down === null)) return;
    this.down = why;
    try { this.onOutage?.(why !== null, why); } catch (err) { console.warn('daisy: onOutage failed:', err); }
  }

  // one request -> {x, y}; a BatchError with its code otherwise
  async answer(step, slot) {
    const { batch: B, seq_len: T } = this.cfg;
    let res, buf;
    try {
      res = await this.fetch(this.url(step, slot));
      buf = res.ok ? await res.arrayBuffer() : null;
    } catch (err) {                  // no connection, a cut body
      throw new BatchError(E.UNREACHABLE, err.message || String(err));
    }
    if (!res.ok) {
      const body = await res.json().catch(() => null);
      const code = body && typeof body === 'object' ? body.code : undefined;
      if (code === undefined && UNREACHABLE_STATUS.has(res.status)) throw new BatchError(E.UNREACHABLE, `HTTP ${res.status}`);   // a proxy with no app behind it
      throw new BatchError(code || E.BAD_ANSWER, `the data server answered HTTP ${res.status} to /data/batch: ${(body && body.error) || res.statusText}`);
    }
    const id = res.headers.get('X-Daisy-Data-Id');
    if (this.dataId !== null && id !== this.dataId) {
      throw new BatchError(E.DATA_CHANGED, `the data changed under the run: the server now serves ${id}, the run trains on ${this.dataId}`);
    }
    if (buf.byteLength !== 2 * B * (T + 1)) throw new BatchError(E.BAD_ANSWER, `the data route sent ${buf.byteLength} bytes for a batch, expected ${2 * B * (T + 1)}`);
    const dv = new DataView(buf);
    const x = new Int32Array(B * T), y = new Int32Array(B * T);
    for (let b = 0; b < B; b++) {
      for (let t = 0; t <= T; t++) {
        const tok = dv.getUint16(2 * (b * (T + 1) + t), true);
        if (tok >= VOCAB_SIZE) throw new BatchError(E.BAD_ANSWER, `the data route sent token ${tok}, outside the vocabulary`);
        if (t < T) x[b * T + t] = tok;
        if (t > 0) y[b * T + t - 1] = tok;
      }
    }
    return { x, y };
  }

  // {x, y} of (step, slot): the retries and the outage wait of the header
  async fetchBatch(step, slot) {
    let last = null, downSince = null, waits = 0;
    for (let attempt = 0; attempt <= this.retries && !this.closed;) {
      try {
        const out = await this.answer(step, slot);
        this.setDown(null);
        return out;
      } catch (err) {
        if (!(err instanceof BatchError)) throw err;
        if (err.code === E.UNREACHABLE) {
          downSince ??= performance.now();
          this.setDown(err.message);
          if (performance.now() - downSince >= this.outageMs) {
            throw new BatchError(E.UNREACHABLE, `the data server did not answer for ${Math.round(this.outageMs / 1000)} s (${err.message}): no batch for step ${step + 1}`);
          }
          await sleep(BACKOFF_MS[Math.min(waits++, BACKOFF_MS.length - 1)]);
          continue;
        }
        this.setDown(null);
        last = err;
        if (NOT_RETRIED.has(err.code)) break;
        attempt++;
      }
    }
    throw last || new BatchError(E.UNREACHABLE, `the batch source was closed before step ${step + 1}'s batch came`);
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
    // batches of this slot at or before this step are never asked for again
    for (const key of [...this.inflight.keys()]) {
      const [s, sl] = key.split(':').map(Number);
      if (sl === slot && s <= step) this.inflight.delete(key);
    }
    try {
      return await p;
    } finally {
      this.waitMs += performance.now() - t0;
    }
  }

  one(step, slot) {
    const p = this.request(step, slot);
    this.inflight.delete(`${step}:${slot}`);
    return p;
  }

  close() {
    this.closed = true;
    this.inflight.clear();
  }
}
