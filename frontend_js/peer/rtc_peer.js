// One WebRTC link to one remote peer: a raw RTCPeerConnection with one ordered, reliable binary
// data channel, negotiated through the signaling server's `signal` relay (docs/PROTOCOL.md).
// No wrapper library: simple-peer is unmaintained and PeerJS brings its own server protocol;
// we need only one channel, our own framing and back-pressure (docs/ARCHITECTURE.md).
//
//   const link = new RtcPeer({ remoteId, initiator, iceServers, sendSignal, onMessage, onState });
//   link.signal(data)      a relayed {sdp} or {candidate} from the remote peer
//   await link.send(bytes) resolves once the bytes are queued under the high-water mark
//   link.maxFrame          the channel's real SCTP maxMessageSize (frames are cut to fit)
//   link.close(reason)
//
// The peer with the smaller id offers (the same rule on both sides, so no glare). Back-pressure:
// we never queue past HIGH_WATER bytes in the channel's buffer; a sender waits for
// `bufferedamountlow` (threshold LOW_WATER). Chromium closes a channel whose buffer passes
// ~16 MB, so an unbounded loop of send() would kill the link at the larger settings.
export const HIGH_WATER = 1024 * 1024;
export const LOW_WATER = 256 * 1024;
const DEFAULT_MAX_MESSAGE = 64 * 1024;      // when the browser does not say (RFC 8831's floor)

export class RtcPeer {
  constructor({ remoteId, initiator, iceServers = [], sendSignal, onMessage, onState }) {
    this.remoteId = remoteId;
    this.initiator = initiator;
    this.sendSignal = sendSignal;
    this.onMessage = onMessage;
    this.onState = onState;
    this.state = 'connecting';          // connecting | open | closed
    this.closeReason = '';
    this.queue = Promise.resolve();     // sends run one after another
    this.pendingCandidates = [];
    this.pc = new RTCPeerConnection({ iceServers });
    this.pc.onicecandidate = (ev) => { if (ev.candidate) this.sendSignal({ candidate: ev.candidate.toJSON() }); };
    this.pc.onconnectionstatechange = () => {
      const st = this.pc.connectionState;
      if (st === 'failed') this.close('the WebRTC connection failed (ICE found no working path)');
      else if (st === 'closed') this.close('the WebRTC connection closed');
    };
    if (initiator) {
      this.attach(this.pc.createDataChannel('daisy', { ordered: true }));
      this.offer();
    } else {
      this.pc.ondatachannel = (ev) => this.attach(ev.channel);
    }
  }

  async offer() {
    try {
      await this.pc.setLocalDescription(await this.pc.createOffer());
      this.sendSignal({ sdp: this.pc.localDescription.toJSON() });
    } catch (err) { this.close(`offer failed: ${err.message || err}`); }
  }

  // a relayed signal: {sdp: {type, sdp}} or {candidate: {...}}; bad shapes are ignored with a warning
  async signal(data) {
    if (this.state === 'closed' || !data || typeof data !== 'object') return;
    try {
      if (data.sdp && typeof data.sdp === 'object') {
        const { type, sdp } = data.sdp;
        if ((type !== 'offer' && type !== 'answer') || typeof sdp !== 'string') throw new Error('bad sdp');
        if (type === 'offer' && this.initiator) throw new Error('an offer to the offering side');
        await this.pc.setRemoteDescription({ type, sdp });
        for (const c of this.pendingCandidates.splice(0)) await this.pc.addIceCandidate(c);
        if (type === 'offer') {
          await this.pc.setLocalDescription(await this.pc.createAnswer());
          this.sendSignal({ sdp: this.pc.localDescription.toJSON() });
        }
      } else if (data.candidate && typeof data.candidate === 'object') {
        if (this.pc.remoteDescription) await this.pc.addIceCandidate(data.candidate);
        else if (this.pendingCandidates.length < 100) this.pendingCandidates.push(data.candidate);
      }
    } catch (err) {
      console.warn(`daisy: signal from ${this.remoteId} refused: ${err.message || err}`);
    }
  }

  attach(channel) {
    this.channel = channel;
    channel.binaryType = 'arraybuffer';
    channel.bufferedAmountLowThreshold = LOW_WATER;
    channel.onopen = () => this.markOpen();
    channel.onclose = () => this.close('the data channel closed');
    channel.onerror = (ev) => console.warn(`daisy: data channel to ${this.remoteId}: ${ev.error?.message || 'error'}`);
    channel.onmessage = (ev) => {
      // a message can be dispatched before the channel's open event (they come from different
      // threads in Chromium): the first message opens the link, so the peer's HELLO is not lost
      if (this.state === 'closed') return;     // a replaced link's late bytes are not the new link's
      this.markOpen();
      if (ev.data instanceof ArrayBuffer) this.onMessage(new Uint8Array(ev.data));
      else this.onMessage(ev.data);          // a text message: the mesh drops it with a reason
    };
  }

  markOpen() {
    if (this.state !== 'connecting') return;
    this.state = 'open';
    this.onState?.('open');
  }

  get maxFrame() {
    const m = this.pc.sctp?.maxMessageSize;
    return m && Number.isFinite(m) && m > 0 ? m : DEFAULT_MAX_MESSAGE;
  }

  get bufferedAmount() { return this.channel ? this.channel.bufferedAmount : 0; }

  send(bytes) {
    const next = this.queue.then(() => this.sendNow(bytes));
    this.queue = next.catch(() => {});
    return next;
  }

  async sendNow(bytes) {
    const ch = this.channel;
    if (this.state !== 'open' || !ch || ch.readyState !== 'open') throw new Error(`link to ${this.remoteId} is ${this.state}`);
    while (ch.bufferedAmount + bytes.length > HIGH_WATER && ch.bufferedAmount > 0) {
      await new Promise((resolve) => {
        const done = () => { ch.removeEventListener('bufferedamountlow', done); ch.removeEventListener('close', done); resolve(); };
        ch.addEventListener('bufferedamountlow', done);
        ch.addEventListener('close', done);
      });
      if (ch.readyState !== 'open') throw new Error(`link to ${this.remoteId} closed while sending`);
    }
    ch.send(bytes);
  }

  close(reason = 'closed') {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.closeReason = reason;
    try { this.channel?.close(); } catch { /* closing anyway */ }
    try { this.pc.close(); } catch { /* closing anyway */ }
    this.onState?.('closed', reason);
  }
}
