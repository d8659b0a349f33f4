// One WebRTC link to one remote peer: LANES raw RTCPeerConnections, each with one ordered,
// reliable binary data channel, negotiated through the signaling server's `signal` relay
// (docs/PROTOCOL.md "Mesh frames"). To its user it is one ordered channel: every frame goes out on one
// lane with a sequence number and comes out on the far side in sending order (LaneOrder).
// Why several connections: one SCTP association's congestion window bounds what a channel moves
// on a long, lossy path (rate × RTT above its window: ~1.2 Mbit/s at 80 ms and 1 % loss,
// measured behind the `home` profile, TEST_RESULTS.md "Behind emulated links"); every
// connection has a window of its own, channels of one connection share one.
// No wrapper library: simple-peer is unmaintained and PeerJS brings its own server protocol.
//
//   const link = new RtcPeer({ remoteId, initiator, iceServers, sendSignal, onMessage, onState });
//   link.signal(data)      a relayed {sdp, lanes} or {candidates: [{candidate, lane}]} from the remote peer
//   await link.send(bytes) resolves once the bytes are queued under a lane's high-water mark
//   link.maxFrame          the most a frame may weigh (frames are cut to fit)
//   link.close(reason)
//
// The peer with the smaller id offers (the same rule on both sides, so no glare), all lanes in
// one signal: {sdp: lane 0's offer, lanes: [lane 1's offer, ...]}; the answer likewise, so the
// page sees one offer and one answer per link. Candidates carry their lane and go out together,
// CANDIDATE_BATCH_MS after the first of a batch (the server allows a peer 50 messages a second).
// Back-pressure: no lane queues past HIGH_WATER bytes in its channel's buffer, and the link's lanes
// together past MAX_LINK_QUEUED (the memory one link may hold: 16 lanes × HIGH_WATER would be
// 16 MiB); a sender waits for `bufferedamountlow` (threshold LOW_WATER) or, at the latest,
// LANE_POLL_MS (Node's @roamhq/wrtc never fires the event). Chromium closes a channel whose
// buffer passes ~16 MB, so an unbounded loop of send() would kill the link at the larger settings.
export const LANES = 16;
export const MAX_LANES = 32;                // what an offer may ask for
export const PAGE_CONNECTIONS = 64;         // lanes of the links a page opens, summed at each opening (Chromium refuses past ~500 connections)

// the lanes of a new link when the page holds `links` links: LANES, fewer in a large group so
// that every link still gets one and the page stays under PAGE_CONNECTIONS
export const lanesFor = (links) => Math.max(1, Math.min(LANES, Math.floor(PAGE_CONNECTIONS / Math.max(1, links))));
export const HIGH_WATER = 1024 * 1024;
export const LOW_WATER = 256 * 1024;
export const MAX_LINK_QUEUED = 8 * 1024 * 1024;
export const LANE_POLL_MS = 5;
export const SEQ_BYTES = 4;                 // each frame's sequence number, before the frame
export const MAX_HELD_BYTES = 32 * 1024 * 1024;   // frames waiting for an earlier one (LaneOrder) ...
export const MAX_HELD_FRAMES = 8192;              // ... and how many (16 lanes × 1 MiB is 2048 frames)
// Frames of 8 KiB rather than the channel's 256 KiB: a step's gradient spreads over every lane
// (int8's 43 KB at the default settings too), so each lane sends a short burst: fewer round trips
// of slow start, less exposure to a tail loss; and a peer's progress (a frame received) shows
// often on a slow link, where the run's deadline counts frames. The 64-byte header costs 0.8 %.
// Measured against 4 and 16 KiB (TEST_RESULTS.md "Behind emulated links").
const FRAME_CAP = 8 * 1024;
const CANDIDATE_BATCH_MS = 30;
const MAX_CANDIDATES = 200;                 // in one signal
const DEFAULT_MAX_MESSAGE = 64 * 1024;      // when the browser does not say (RFC 8831's floor)

export class LaneError extends Error {}

// The receiving half of the lanes, pure: frames arrive with their sequence numbers in any order
// across lanes (each lane is itself ordered) and leave in sequence order. Bounded: a frame whose
// number was already delivered or is held, or more than MAX_HELD_BYTES or MAX_HELD_FRAMES held,
// throws LaneError.
export class LaneOrder {
  constructor({ maxHeld = MAX_HELD_BYTES, maxHeldFrames = MAX_HELD_FRAMES } = {}) {
    this.next = 0;                 // the sequence number delivered next
    this.held = new Map();         // seq -> frame
    this.heldBytes = 0;
    this.maxHeld = maxHeld;
    this.maxHeldFrames = maxHeldFrames;
  }

  // one received message (sequence number + frame) -> the frames now deliverable, in order
  accept(bytes) {
    if (!(bytes instanceof Uint8Array) || bytes.length <= SEQ_BYTES) {
      throw new LaneError(`a lane message of ${bytes?.length ?? 0} bytes has no frame after its sequence number`);
    }
    const seq = new DataView(bytes.buffer, bytes.byteOffset, SEQ_BYTES).getUint32(0);
    const frame = bytes.subarray(SEQ_BYTES);
    const ahead = (seq - this.next) >>> 0;       // wraps at 2^32 like the sender's counter
    if (ahead >= 2 ** 31 || this.held.has(seq)) throw new LaneError(`frame ${seq} came twice (next expected ${this.next})`);
    if (ahead > 0) {
      if (this.heldBytes + frame.length > this.maxHeld || this.held.size >= this.maxHeldFrames) {
        throw new LaneError(`over ${this.maxHeld} bytes or ${this.maxHeldFrames} frames wait for frame ${this.next}`);
      }
      this.held.set(seq, frame);
      this.heldBytes += frame.length;
      return [];
    }
    const out = [frame];
    this.next = (this.next + 1) >>> 0;
    while (this.held.has(this.next)) {
      const f = this.held.get(this.next);
      this.held.delete(this.next);
      this.heldBytes -= f.length;
      out.push(f);
      this.next = (this.next + 1) >>> 0;
    }
    return out;
  }
}

// The sending half's choice, pure: buffered[k] is lane k's queued bytes (null: not open) ->
// the lane to send `size` bytes on (the least queued), or -1 to wait. A lane takes it under its
// HIGH_WATER and the link under MAX_LINK_QUEUED; an empty lane, or an empty link, always takes one
// frame (a frame is never larger than the bounds).
export function laneFor(buffered, size, { highWater = HIGH_WATER, linkMax = MAX_LINK_QUEUED } = {}) {
  let best = -1, total = 0;
  for (const [k, b] of buffered.entries()) {
    if (b === null) continue;
    total += b;
    if (best < 0 || b < buffered[best]) best = k;
  }
  if (best < 0) return -1;
  const b = buffered[best];
  const laneOk = b + size <= highWater || b === 0;
  const linkOk = total + size <= linkMax || total === 0;
  return laneOk && linkOk ? best : -1;
}

// the sending half's number in front of a frame
export function withSeq(seq, frame) {
  const out = new Uint8Array(SEQ_BYTES + frame.length);
  new DataView(out.buffer).setUint32(0, seq >>> 0);
  out.set(frame, SEQ_BYTES);
  return out;
}

function testLanes() {
  const n = globalThis.__daisyTest?.lanes;
  return Number.isInteger(n) && n >= 1 && n <= MAX_LANES ? n : null;
}

// the bench compares frame sizes the same way: `window.__daisyTest = {frameCap: BYTES}`
function frameCap() {
  const n = globalThis.__daisyTest?.frameCap;
  return Number.isInteger(n) && n >= 2048 && n <= 256 * 1024 ? n : FRAME_CAP;
}

export class RtcPeer {
  // lanes: the offering side's choice (the answering side takes the offer's), lanesFor(links) with
  // `links` the links the page holds; the bench compares counts in one run through
  // `window.__daisyTest = {lanes: N}` set before the page loads
  constructor({ remoteId, initiator, iceServers = [], sendSignal, onMessage, onState, links = 1, lanes = testLanes() ?? lanesFor(links) }) {
    this.remoteId = remoteId;
    this.initiator = initiator;
    this.iceServers = iceServers;
    this.sendSignal = sendSignal;
    this.onMessage = onMessage;
    this.onState = onState;
    this.state = 'connecting';          // connecting | open | closed
    this.closeReason = '';
    this.queue = Promise.resolve();     // sends run one after another
    this.sendSeq = 0;
    this.order = new LaneOrder();
    this.frameCap = frameCap();
    this.lanes = [];                    // {pc, channel, pendingCandidates}
    this.offered = false;               // the answering side: the offer came
    this.sdpSent = false;               // our candidates wait until our offer/answer went out
    this.outCandidates = [];            // [{candidate, lane}] of the next batch
    this.flushTimer = null;
    this.addLanes(initiator ? lanes : 1);        // the answering side learns the count from the offer
    if (initiator) {
      for (const lane of this.lanes) this.attach(lane, lane.pc.createDataChannel('daisy', { ordered: true }));
      this.offer();
    }
  }

  // lane 0's connection: what the page looks at (a re-offer is told apart by its remoteDescription)
  get pc() { return this.lanes[0].pc; }

  addLanes(n) {
    for (let i = 0; i < n; i++) {
      const k = this.lanes.length;
      const lane = { pc: new RTCPeerConnection({ iceServers: this.iceServers }), channel: null, pendingCandidates: [] };
      lane.pc.onicecandidate = (ev) => { if (ev.candidate) this.sendCandidate({ candidate: ev.candidate.toJSON(), lane: k }); };
      lane.pc.onconnectionstatechange = () => {
        const st = lane.pc.connectionState;
        if (st === 'failed') this.close('the WebRTC connection failed (ICE found no working path)');
        else if (st === 'closed') this.close('the WebRTC connection closed');
      };
      if (!this.initiator) lane.pc.ondatachannel = (ev) => this.attach(lane, ev.channel);
      this.lanes.push(lane);
    }
  }

  sendCandidate(c) {
    this.outCandidates.push(c);
    if (this.sdpSent && this.flushTimer === null) this.flushTimer = setTimeout(() => this.flushCandidates(), CANDIDATE_BATCH_MS);
  }

  flushCandidates() {
    this.flushTimer = null;
    if (this.state === 'closed') return;
    while (this.outCandidates.length) this.sendSignal({ candidates: this.outCandidates.splice(0, MAX_CANDIDATES) });
  }

  sendSdp(descriptions) {
    const [first, ...rest] = descriptions.map((d) => d.toJSON());
    this.sendSignal({ sdp: first, lanes: rest });
    this.sdpSent = true;
    this.flushCandidates();
  }

  async offer() {
    try {
      for (const { pc } of this.lanes) await pc.setLocalDescription(await pc.createOffer());
      this.sendSdp(this.lanes.map(({ pc }) => pc.localDescription));
    } catch (err) { this.close(`offer failed: ${err.message || err}`); }
  }

  // a relayed signal: {sdp: {type, sdp}, lanes: [{type, sdp}, ...]} or {candidates: [{candidate,
  // lane}, ...]} ({candidate, lane} alone also); bad shapes are ignored with a warning
  async signal(data) {
    if (this.state === 'closed' || !data || typeof data !== 'object') return;
    try {
      if (data.sdp && typeof data.sdp === 'object') {
        // a page of before the lanes sends no `lanes`: its frames would carry no sequence number
        if (!Array.isArray(data.lanes)) throw new Error('an offer or answer without lanes (a page of an older version: reload it)');
        const sdps = [data.sdp, ...data.lanes];
        if (sdps.length > MAX_LANES) throw new Error(`${sdps.length} lanes (at most ${MAX_LANES})`);
        const type = data.sdp.type;
        if (sdps.some((d) => !d || d.type !== type || typeof d.sdp !== 'string')) throw new Error('bad sdp');
        if (type !== 'offer' && type !== 'answer') throw new Error('bad sdp');
        if (type === 'offer' && this.initiator) throw new Error('an offer to the offering side');
        if (type === 'offer' && this.offered) throw new Error('a second offer on one link');
        if (type === 'offer') { this.offered = true; this.addLanes(sdps.length - 1); }
        if (sdps.length !== this.lanes.length) throw new Error(`an answer for ${sdps.length} lanes, ${this.lanes.length} offered`);
        for (const [k, lane] of this.lanes.entries()) {
          await lane.pc.setRemoteDescription({ type, sdp: sdps[k].sdp });
          for (const c of lane.pendingCandidates.splice(0)) await lane.pc.addIceCandidate(c);
        }
        if (type === 'offer') {
          for (const { pc } of this.lanes) await pc.setLocalDescription(await pc.createAnswer());
          this.sendSdp(this.lanes.map(({ pc }) => pc.localDescription));
        }
      } else {
        const list = Array.isArray(data.candidates) ? data.candidates : [data];
        if (list.length > MAX_CANDIDATES) throw new Error(`${list.length} candidates in one signal`);
        for (const c of list) await this.addCandidate(c);
      }
    } catch (err) {
      console.warn(`daisy: signal from ${this.remoteId} refused: ${err.message || err}`);
    }
  }

  async addCandidate(c) {
    if (!c || typeof c.candidate !== 'object' || !c.candidate) throw new Error('bad candidate');
    const k = c.lane ?? 0;
    if (!Number.isInteger(k) || k < 0 || k >= MAX_LANES) throw new Error(`a candidate for lane ${String(k).slice(0, 20)}`);
    const lane = this.lanes[k];
    if (!lane) throw new Error(`a candidate for lane ${k} before its offer`);
    if (lane.pc.remoteDescription) await lane.pc.addIceCandidate(c.candidate);
    else if (lane.pendingCandidates.length < 100) lane.pendingCandidates.push(c.candidate);
  }

  attach(lane, channel) {
    lane.channel = channel;
    channel.binaryType = 'arraybuffer';
    channel.bufferedAmountLowThreshold = LOW_WATER;
    channel.onopen = () => { if (this.lanes.every((l) => l.channel?.readyState === 'open')) this.markOpen(); };
    channel.onclose = () => this.close('the data channel closed');
    channel.onerror = (ev) => console.warn(`daisy: data channel to ${this.remoteId}: ${ev.error?.message || 'error'}`);
    channel.onmessage = (ev) => {
      // a message can be dispatched before the channel's open event (they come from different
      // threads in Chromium): the first message opens the link, so the peer's HELLO is not lost
      if (this.state === 'closed') return;     // a replaced link's late bytes are not the new link's
      this.markOpen();
      if (!(ev.data instanceof ArrayBuffer)) { this.onMessage(ev.data); return; }   // text: the mesh drops it with a reason
      let frames;
      try {
        frames = this.order.accept(new Uint8Array(ev.data));
      } catch (err) {
        if (!(err instanceof LaneError)) throw err;
        this.close(`bad lane message from ${this.remoteId}: ${err.message}`);
        return;
      }
      for (const f of frames) this.onMessage(f);
    };
  }

  markOpen() {
    if (this.state !== 'connecting') return;
    this.state = 'open';
    this.onState?.('open');
  }

  get maxFrame() {
    const m = this.pc.sctp?.maxMessageSize;
    const channel = m && Number.isFinite(m) && m > 0 ? m : DEFAULT_MAX_MESSAGE;
    return Math.min(channel, this.frameCap) - SEQ_BYTES;
  }

  get bufferedAmount() { return this.lanes.reduce((sum, l) => sum + (l.channel ? l.channel.bufferedAmount : 0), 0); }

  send(bytes) {
    const next = this.queue.then(() => this.sendNow(bytes));
    this.queue = next.catch(() => {});
    return next;
  }

  // the open lane with the least queued; waits while every open lane is at its high-water mark
  async sendNow(bytes) {
    const message = withSeq(this.sendSeq, bytes);
    for (;;) {
      if (this.state !== 'open') throw new Error(`link to ${this.remoteId} is ${this.state}`);
      const channels = this.lanes.map((l) => l.channel);
      const k = laneFor(channels.map((ch) => (ch && ch.readyState === 'open' ? ch.bufferedAmount : null)), message.length);
      if (k >= 0) {
        channels[k].send(message);
        this.sendSeq = (this.sendSeq + 1) >>> 0;
        return;
      }
      await this.anyLaneReady();
    }
  }

  // resolves when some lane's buffer ran low, or a lane opened or closed, or after LANE_POLL_MS
  // (a host that never fires `bufferedamountlow`: the sender looks at the buffers again)
  anyLaneReady() {
    const channels = this.lanes.map((l) => l.channel).filter(Boolean);
    return new Promise((resolve) => {
      const events = ['bufferedamountlow', 'open', 'close'];
      const done = () => {
        clearTimeout(timer);
        for (const ch of channels) for (const e of events) ch.removeEventListener(e, done);
        resolve();
      };
      for (const ch of channels) for (const e of events) ch.addEventListener(e, done);
      const timer = setTimeout(done, channels.length ? LANE_POLL_MS : 50);
    });
  }

  close(reason = 'closed') {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.closeReason = reason;
    clearTimeout(this.flushTimer);
    for (const lane of this.lanes) {
      try { lane.channel?.close(); } catch { /* closing anyway */ }
      try { lane.pc.close(); } catch { /* closing anyway */ }
    }
    this.onState?.('closed', reason);
  }
}
