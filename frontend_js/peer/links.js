// The page's links to the other peers of its group (docs/ARCHITECTURE.md "The browser peer's
// modules"): one RtcPeer (../mesh/rtc_peer.js) per admitted peer, handed to the Mesh once open;
// their WebRTC signals go through the signaling server (peer.conn). One link per admitted peer;
// the smaller id offers. Pending peers (a room that has not approved us) get no signals from the
// server, so they link to nobody.
//
//   const links = new Links(peer);  links.listen();   // peer.js boot
//   links.sync()  (the member list changed);  links.onSignal(from, data) / onRelay(from, data)
//   (membership.js);  links.close(id, why);  links.closeAll(why);  links.reset(newSelfId)
// The panel's view of each link is peer.s.links: peer id -> 'connecting' | 'linked' | 'closed: why' | 'refused: why'.
import { RtcPeer } from '../mesh/rtc_peer.js';

// A link not ready (open and HELLO matched) within this long is started over by its offering side:
// an ICE check or a negotiation message can be lost on a busy device; waits grow with each try.
export const LINK_READY_MS = 8000;
const LINK_READY_MAX_MS = 30_000;

export class Links {
  constructor(peer) {
    this.peer = peer;
    this.mesh = peer.mesh;
    this.rtc = new Map();        // peer id -> RtcPeer
    this.tries = new Map();      // peer id -> links offered since it was last ready (the watchdog's backoff)
    this.iceServers = [];        // the server's word (welcome)
    // tests: the first offer this page sends is lost on the way (the link watchdog must recover)
    this.loseOffer = Boolean(globalThis.__daisyTest?.loseFirstOffer);
  }

  // the mesh's word on each link, for the panel; a peer that cannot speak our frames is told why
  listen() {
    const p = this.peer;
    this.mesh.on('link', ({ peer, state, reason }) => this.show(peer, state === 'ready' ? 'linked' : `closed: ${reason}`));
    this.mesh.on('refused', ({ peer, reason }) => {
      this.show(peer, `refused: ${reason}`);
      p.note(`Not linked to ${p.nameOf(peer)}: ${reason}.`);
      p.conn?.send({ type: 'relay', to: peer, data: { kind: 'mesh-refused', protocol: this.mesh.version, reason } });
    });
  }

  sync() {
    const s = this.peer.s;
    if (!s.peerId || s.role === 'pending' || s.rejected) return;
    for (const q of s.peers) {
      if (q.id === s.peerId || q.role === 'pending') continue;
      const link = this.rtc.get(q.id);
      if (!link || link.state === 'closed') this.open(q.id, s.peerId < q.id);
    }
  }

  open(id, initiator) {
    this.rtc.get(id)?.close('replaced');
    const link = new RtcPeer({
      remoteId: id, initiator, iceServers: this.iceServers, links: this.rtc.size + 1,
      sendSignal: (data) => {
        if (this.loseOffer && data.sdp?.type === 'offer') { this.loseOffer = false; return; }
        this.peer.conn.send({ type: 'signal', to: id, data });
      },
      onMessage: (bytes) => this.mesh.receive(id, bytes),
      onState: (state, reason) => {
        if (this.rtc.get(id) !== link) return;
        if (state === 'open') this.mesh.addLink(id, link);
        else if (state === 'closed') { this.mesh.removeLink(id, reason); this.show(id, `closed: ${reason}`); }
      },
    });
    this.rtc.set(id, link);
    this.show(id, 'connecting');
    if (initiator) this.watch(id, link);
    return link;
  }

  // the offering side's watchdog: a link still not ready after its wait is offered again (the
  // answering side replaces its half on the new offer, onSignal)
  watch(id, link) {
    const tries = (this.tries.get(id) || 0) + 1;
    this.tries.set(id, tries);
    const wait = Math.min(LINK_READY_MS * tries, LINK_READY_MAX_MS);
    setTimeout(() => {
      if (this.rtc.get(id) !== link || link.state === 'closed') return;
      if (this.mesh.isReady(id)) { this.tries.delete(id); return; }
      if (!this.peer.s.peers.some((q) => q.id === id && q.role !== 'pending')) return;
      console.info(`daisy: link to ${id} not ready within ${wait / 1000} s: offering again`);
      this.open(id, true);
    }, wait);
  }

  close(id, reason) {
    const link = this.rtc.get(id);
    if (link) link.close(reason);
  }

  closeAll(reason) {
    for (const link of this.rtc.values()) link.close(reason);
  }

  // the server gave this page a new identity: no link of the old one stays
  reset(selfId) {
    this.closeAll('this page has a new identity');
    this.rtc.clear();
    this.mesh.selfId = selfId;
    this.peer.set({ links: {} });
  }

  // the panel's line for one link
  show(id, state) {
    const was = this.peer.s.links[id] || '';
    if (was === state || (was.startsWith('refused') && state.startsWith('closed'))) return;   // keep saying why
    this.peer.set({ links: { ...this.peer.s.links, [id]: state } });
  }

  // a relayed WebRTC signal: {sdp} or {candidate}; an offer for a link we already have means the
  // other side started over (its page reconnected): start over too
  onSignal(from, data) {
    if (!data || typeof data !== 'object' || typeof from !== 'string') return;
    let link = this.rtc.get(from);
    const isOffer = data.sdp && data.sdp.type === 'offer';
    if (isOffer && from < this.peer.s.peerId && (!link || link.state === 'closed' || link.pc.remoteDescription)) {
      link = this.open(from, false);
    }
    if (link) link.signal(data);
  }

  // small app messages through the server: a peer that cannot speak our frames says why
  onRelay(from, data) {
    if (!data || typeof data !== 'object' || data.kind !== 'mesh-refused') return;
    const reason = `peer ${from} speaks mesh protocol v${Number(data.protocol) | 0}, this page v${this.mesh.version}`;
    this.show(from, `refused: ${reason}`);
    this.peer.note(`Not linked to ${this.peer.nameOf(from)}: ${reason}.`);
  }
}
