// The state body codec of the page (frontend_js/state_codec.js) reads bytes from a peer (STATE)
// and from the server: hostile input is refused with a reason before any large allocation.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { encodeState, decodeState, MAX_STATE_HEADER_BYTES } from '../../frontend_js/state_codec.js';
import { makeConfig, configToDict } from '../../frontend_js/config.js';
import { initParams, paramShapes } from '../../frontend_js/model.js';

const cfg = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4 });

function body(header, tensorBytes) {
  const json = new TextEncoder().encode(JSON.stringify(header));
  const H = json.length + ((8 - (json.length % 8)) % 8);
  const buf = new ArrayBuffer(8 + H + tensorBytes);
  new DataView(buf).setUint32(0, H, true);
  const u8 = new Uint8Array(buf);
  u8.set(json, 8);
  u8.fill(0x20, 8 + json.length, 8 + H);
  return buf;
}

test('round trip keeps every bit', () => {
  const params = initParams(cfg);
  const buf = encodeState(paramShapes(cfg), { config: configToDict(cfg), step: 3, adamT: 3, params, m: params, v: params });
  const st = decodeState(buf);
  assert.equal(st.step, 3);
  for (const [name] of paramShapes(cfg)) assert.deepEqual(new Uint8Array(st.params[name].buffer, st.params[name].byteOffset, st.params[name].byteLength), new Uint8Array(params[name].buffer));
});

test('hostile bodies are refused with a reason', () => {
  const ok = { format: 'daisychain-state', version: 1, config: configToDict(cfg), step: 0, adam_t: 0, parts: ['model'] };
  const cases = [
    [new ArrayBuffer(4), /too short/],
    [(() => { const b = new ArrayBuffer(16); new DataView(b).setUint32(0, 0xfffffff8, true); return b; })(), /bad header length/],
    [(() => { const b = new ArrayBuffer(8 + MAX_STATE_HEADER_BYTES + 8); new DataView(b).setUint32(0, MAX_STATE_HEADER_BYTES + 8, true); return b; })(), /over the limit/],
    [body({ ...ok, format: 'other' }, 0), /not a daisychain-state/],
    [body({ ...ok, config: 'x' }, 0), /no config object/],
    [body({ ...ok, config: { ...ok.config, width: 10 ** 9 } }, 0), /model width/],
    [body({ ...ok, parts: ['model', 'model', 'model', 'model'] }, 0), /parts must be/],
    [body({ ...ok, parts: 'model' }, 0), /parts must be/],
    [body(ok, 8), /bytes of tensors/],                             // far fewer than the config needs
    [body('['.repeat(30000), 0), /not JSON|not a daisychain-state/],
  ];
  for (const [buf, why] of cases) assert.throws(() => decodeState(buf), why);
});
