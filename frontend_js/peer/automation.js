// The automation API, `window.daisy` in the page (ui.js) and the headless peer's handle
// (../headless.mjs): what a user's buttons, the tests and scripts may ask of a Peer
// (docs/ARCHITECTURE.md "The automation API: `window.daisy`").
//
//   window.daisy = automationApi(peer, bus)

export function automationApi(peer, bus) {
  return {
    state: () => peer.state(),
    start: (config) => peer.start(config),
    stop: () => peer.stop(),
    on: (event, cb) => bus.on(event, cb),
    approve: (peerId) => peer.approve(peerId),
    reject: (peerId) => peer.reject(peerId),
    keepOut: (peerId) => peer.keepOut(peerId),
    hasModel: () => peer.hasModel(),
    generate: (prompt, opts) => peer.models.generate(prompt, opts),
    downloadCheckpoint: () => peer.models.downloadCheckpoint(),
    downloadSafetensors: () => peer.models.downloadSafetensors(),
    downloadKit: () => peer.models.downloadKit(),
    load: (stateOrFile) => peer.models.load(stateOrFile),
    resumeStored: () => peer.storedRun.resume(),
    // a group restore offered to this page (it holds a model): Load or Ignore, as the panel's buttons
    acceptRestore: () => peer.restore.accept(),
    declineRestore: () => peer.restore.decline(),
    // the mesh, for tests and for anyone curious: recent drops with reasons, the links' states,
    // and raw bytes to a linked peer (a hostile peer can send anything; tests send bad frames)
    mesh: {
      drops: () => ({ count: peer.mesh.drops.count, recent: peer.mesh.drops.recent.slice(), stale: peer.mesh.drops.stale }),
      links: () => ({ ...peer.s.links }),
      sendRaw: (peerId, bytes) => peer.links.rtc.get(peerId)?.send(bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes)),
      frames: () => import('../mesh/frames.js'),
      stats: () => { const r = peer.runs.run || peer.runs.lastRun; return r ? { ...peer.runs.stats(r), dataWaitMs: r.batches.waitMs, topology: r.collective.topology, steps: r.completed - r.desc.startStep } : null; },
    },
    // test hooks for the membership tests: a joiner whose state goes wrong after its checks; the
    // next state transfer from this page cut short or tampered with in transit
    testing: {
      corruptNextSync: () => { peer.runs.faults.corruptNextSync = true; },
      faultNextState: (kind) => { peer.mesh.faultNext = { type: 8, kind }; },
      // the GPU engine faults as a lost device or failed audit would (backends.js hears it)
      faultGpu: (reason) => peer.picked?.engine?.fault(reason, 'test'),
      // what the others see of a crashed device: every link and the server socket end at once,
      // no goodbye, and this page's JS stops (CDP's Page.crash never answers under Playwright)
      crash: () => {
        peer.conn.final = true;
        peer.conn.stopPinging();
        try { peer.conn.ws.close(); } catch { /* gone anyway */ }
        for (const link of peer.links.rtc.values()) { try { link.pc.close(); } catch { /* gone anyway */ } }
        setTimeout(() => { for (;;) { /* frozen */ } }, 0);
      },
    },
    // test hook: flip one bit of this replica's weights mid-run (the sync guard must stop the run)
    corruptWeights: () => peer.runs.corruptWeights(),
  };
}
