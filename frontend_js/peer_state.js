// A peer's state body (state_codec.js), decoded and checked in ONE place: a run's start state
// (start.js), a joiner's state (join.js) and a group restore (peer/group_state.js) all read
// untrusted bytes from another page through readPeerState.
import { decodeState } from './state_codec.js';
import { cloneReplica } from './train.js';
import { makeConfig, configToDict } from './config.js';
import { paramCount } from './model.js';
import { short, weightHash } from './hashing.js';

export class PeerStateError extends Error {}

// one flat gradient of this run's settings, in bytes (a FWD message)
export const gradientBytes = (cfg) => 8 * paramCount(cfg);

// payload (Uint8Array) -> {state, replica, hash}. expect (each optional):
//   config: the run's config dict (the state's settings must equal it), step: the step it must be
//   at, hash: the weight hash it must have. Always: Adam moments present, adamT = step for a run's
//   state, and the carried weight hash (when there is one) equal to the recomputed one.
export function readPeerState(payload, expect = {}) {
  const buf = payload.byteOffset === 0 && payload.byteLength === payload.buffer.byteLength
    ? payload.buffer : payload.buffer.slice(payload.byteOffset, payload.byteOffset + payload.byteLength);
  let st;
  try {
    st = decodeState(buf);
  } catch (err) { throw new PeerStateError(err.message || String(err)); }
  if (!st.m || !st.v) throw new PeerStateError('the state has no Adam moments');
  if (!Number.isInteger(st.step) || st.step < 0 || !Number.isInteger(st.adamT) || st.adamT < 0) throw new PeerStateError('the state has no valid step');
  const dict = JSON.stringify(configToDict(makeConfig(st.config)));
  if (expect.config && dict !== JSON.stringify(expect.config)) throw new PeerStateError('its settings differ from the run\'s');
  if (expect.step !== undefined && (st.step !== expect.step || st.adamT !== st.step)) {
    throw new PeerStateError(`it is at step ${st.step}, expected ${expect.step}`);
  }
  const hash = weightHash(st.params);
  if (st.weightHash && st.weightHash !== hash) throw new PeerStateError(`weight hash mismatch: the state says ${short(st.weightHash)}, its weights hash to ${short(hash)}`);
  if (expect.hash && hash !== expect.hash) throw new PeerStateError(`its weights hash to ${short(hash)}, expected ${short(expect.hash)}`);
  if (expect.needWeightHash && !st.weightHash) throw new PeerStateError('the state carries no weight hash');
  return { state: st, hash, replica: cloneReplica({ params: st.params, adam: { t: st.adamT, m: st.m, v: st.v } }) };
}
