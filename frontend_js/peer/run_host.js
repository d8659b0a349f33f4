// The run controller's host (frontend_js/run/controller.js lists what it needs): everything the
// controller sees of the page, the server and the compute path. peer.js builds one per Peer.
//
//   new RunController(runHost(peer), { faults })
import { HttpBatches } from '../batch_source.js';

export function runHost(peer) {
  return {
    get selfId() { return peer.s.peerId; },
    mesh: peer.mesh,
    members: () => peer.s.peers,
    canRun: () => (peer.s.role === 'pending' ? 'waiting for the room host to accept this device: it cannot start a run yet'
      : peer.s.rejected ? 'the room host declined this device' : null),
    nameOf: (id) => peer.nameOf(id),
    show: (patch) => peer.set(patch),
    note: (text) => peer.note(text),
    emit: (event, payload) => peer.bus.emit(event, payload),
    announce: () => peer.announce(),
    ready: () => peer.pathReady,
    prepare: async (cfg) => { await peer.pathReady; await peer.picked?.prepare(cfg); },
    backend: () => peer.backend(),
    trainer: (cfg, replica, batches) => peer.trainer(cfg, replica, batches),
    get gpu() { return peer.gpu || null; },
    dataId: () => peer.dataId(),
    batches: (cfg, dataId) => new HttpBatches(cfg, { dataId, base: peer.server }),
    get models() { return peer.models; },
    get stored() { return peer.storedRun || null; },
  };
}
