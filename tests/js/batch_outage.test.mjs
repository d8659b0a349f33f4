// HttpBatches (frontend_js/batch_source.js) against a real HTTP server on loopback that goes
// away and comes back on the same port (docs/ARCHITECTURE.md "Server outage"): an unreachable
// server is retried with backoff and the batch arrives once it is back; a proxy's 503 is
// retried the same way; past the bound the error names the outage; a changed data id is
// never retried.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';

import { BatchError, HttpBatches } from '../../frontend_js/batch_source.js';

const CFG = { seed: 0, batch: 2, seq_len: 16, steps: 1 };      // steps 1: no prefetch of later steps
const BODY = Buffer.from(Uint16Array.from({ length: CFG.batch * (CFG.seq_len + 1) }, (_, i) => i % 250).buffer);
const DATA_ID = 'builtin-test';

// a data server; answer(req) -> {status, id, body (optional, else BODY)}; close() drops every connection (a killed server)
function serve(port, answer = () => ({ status: 200, id: DATA_ID })) {
  const server = http.createServer((req, res) => {
    const { status, id, body = BODY } = answer(req);
    res.writeHead(status, { 'X-Daisy-Data-Id': id, 'Content-Type': status === 200 ? 'application/octet-stream' : 'application/json' });
    res.end(status === 200 ? body : JSON.stringify({ error: `status ${status}` }));
  });
  return new Promise((resolve) => server.listen(port, '127.0.0.1', () => resolve({
    port: server.address().port,
    close: () => new Promise((done) => { server.closeAllConnections(); server.close(done); }),
  })));
}

function batches(port, opts = {}) {
  const events = [];
  const source = new HttpBatches(CFG, { base: `http://127.0.0.1:${port}`, dataId: DATA_ID,
    onOutage: (down, why) => events.push([down, why]), ...opts });
  return { source, events };
}

test('the server stopped and started again on the same port: the batch arrives, the outage is reported both ways', async () => {
  const first = await serve(0);
  const { port } = first;
  const { source, events } = batches(port);
  const { x } = await source.get(0, 0);
  assert.equal(x[1], 1);
  await first.close();
  const pending = source.get(0, 0);
  await new Promise((r) => setTimeout(r, 1200));                   // down across several retries
  assert.equal(events.length, 1, JSON.stringify(events));
  assert.equal(events[0][0], true);
  const second = await serve(port);
  try {
    const again = await pending;
    assert.deepEqual(Array.from(again.x), Array.from(x));
    assert.deepEqual(events.map(([down]) => down), [true, false]);
    assert.equal(source.down, null);
  } finally { await second.close(); }
});

test('a proxy answering 503 while the app restarts is waited out like a refused connection', async () => {
  let calls = 0;
  const server = await serve(0, () => (++calls <= 3 ? { status: 503, id: '' } : { status: 200, id: DATA_ID }));
  try {
    const { source, events } = batches(server.port);
    await source.get(0, 0);
    assert.equal(calls, 4);
    assert.deepEqual(events, [[true, 'HTTP 503'], [false, null]]);
  } finally { await server.close(); }
});

test('past the bound the error names the outage', async () => {
  const server = await serve(0);
  const { port } = server;
  await server.close();
  const { source } = batches(port, { outageMs: 800 });
  const t0 = performance.now();
  await assert.rejects(source.get(0, 0), /the data server did not answer for 1 s \(.+\): no batch for step 1/);
  assert.ok(performance.now() - t0 >= 800, 'gave up before the bound');
});

test('a restarted server with other data stops the run at once, naming both ids', async () => {
  let calls = 0;
  const server = await serve(0, () => { calls++; return { status: 200, id: 'builtin-other' }; });
  try {
    const { source } = batches(server.port);
    await assert.rejects(source.get(0, 0), /the server now serves builtin-other, the run trains on builtin-test/);
    assert.equal(calls, 1, 'a changed data id was retried');
  } finally { await server.close(); }
});

test('the answer\'s code decides the retry, never its words: a refused parameter once, the app\'s own 503 a bounded number of times', async () => {
  for (const [status, code, calls] of [[400, 'bad_parameter', 1], [503, 'data_unavailable', 3]]) {
    let n = 0;
    const server = http.createServer((req, res) => {
      n++;
      res.writeHead(status, { 'X-Daisy-Data-Id': DATA_ID, 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ error: `the ${code} words`, code }));
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const { source, events } = batches(server.address().port);
      await assert.rejects(source.get(0, 0), (e) => e instanceof BatchError && e.code === code && /HTTP \d+ to \/data\/batch: the .* words/.test(e.message));
      assert.equal(n, calls, `${code}: ${n} requests`);
      assert.deepEqual(events, [], `${code} was taken for an outage`);
    } finally { server.closeAllConnections(); await new Promise((done) => server.close(done)); }
  }
});

test('a token outside the vocabulary is a bad answer (the words of daisy/batch_source.py\'s twin check)', async () => {
  const tokens = new Uint16Array(BODY.buffer.slice(BODY.byteOffset, BODY.byteOffset + BODY.byteLength));
  tokens[5] = 257;                                                  // VOCAB_SIZE
  const server = await serve(0, () => ({ status: 200, id: DATA_ID, body: Buffer.from(tokens.buffer) }));
  try {
    const { source } = batches(server.port, { retries: 0 });
    await assert.rejects(source.get(0, 0), (e) => e instanceof BatchError && e.code === 'bad_answer'
      && e.message === 'the data route sent token 257, outside the vocabulary');
  } finally { await server.close(); }
});

test('one(step, slot): the batch alone (an audit of another slot\'s past step): no prefetch, no wait counted; get prefetches its slot', async () => {
  const asked = [];
  const server = await serve(0, (req) => { asked.push(new URL(req.url, 'http://x').searchParams.get('step')); return { status: 200, id: DATA_ID }; });
  const source = new HttpBatches({ ...CFG, steps: 100 }, { base: `http://127.0.0.1:${server.port}`, dataId: DATA_ID, ahead: 3 });
  try {
    const { x } = await source.one(5, 1);
    assert.equal(x.length, CFG.batch * CFG.seq_len);
    assert.deepEqual(asked, ['5'], 'one fetch, nothing prefetched');
    assert.equal(source.waitMs, 0, 'not counted as a wait of the loop');
    assert.equal(source.inflight.size, 0, 'nothing held');
    await source.get(10, 0);
    // the prefetches are in flight: wait for them (bounded; a loaded box answered 3 in 100 ms once)
    for (const t0 = Date.now(); asked.length < 5 && Date.now() - t0 < 5000;) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 50));   // and nothing more comes
    assert.deepEqual(asked.slice(1).sort(), ['10', '11', '12', '13'], 'get: its step and the next 3 of its slot');
    // held: the prefetches not yet asked for; get() forgets its slot's steps at or before its own
    await source.get(2, 1);
    await source.get(20, 0);
    assert.deepEqual([...source.inflight.keys()].sort(), ['21:0', '22:0', '23:0', '3:1', '4:1', '5:1']);
  } finally {
    // the prefetches still in flight stop retrying: else they wait out the 60-s outage bound
    // (DATA_WAIT_MS) against the closed server and hold the test process that long
    source.close();
    await server.close();
  }
});
