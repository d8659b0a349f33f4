// Server outages while the mesh trains (docs/ARCHITECTURE.md "Server outage"): the /signal
// socket drops or the data route stops answering (a restart, a redeploy). Training traffic is
// peer to peer, so the run goes on; this module keeps it going and says what is happening:
//   - the panel says why it waits: reconnecting to the server, waiting for the data server;
//   - while the server is down, a run's exchange deadline waits on (a peer may be stalled on its
//     batch, not gone), up to the data wait bound plus a margin for peers still retrying;
//   - a room host approves at once a peer of its run that asks again (a restarted server forgot
//     the approvals; ids are bound to tokens, docs/PROTOCOL.md "Identity").
//
//   const outage = new OutageWatch(peer, bus);   // peer.js; texts: reconnectText(), welcomeText(m)
import { DATA_WAIT_MS } from '../batch_source.js';

export const RESUME_MARGIN_MS = 10_000;  // after the server is back: peers still retrying catch up within it

export class OutageWatch {
  constructor(peer, bus) {
    this.peer = peer;
    this.signalDown = false;     // the /signal socket is reconnecting (not a final close)
    this.wasDown = false;        // ... and this page has been welcomed before (an outage, not the first connect)
    this.dataDown = null;        // why the data route is unreachable, or null
    this.since = null;           // performance.now() when the current outage began
    this.holdUntil = 0;          // the run's deadline waits on until then
    bus.on('signal:close', ({ final }) => { this.signalDown = !final && Boolean(peer.s.peerId); this.refresh(); });
    bus.on('signal:welcome', () => { this.wasDown = this.signalDown; this.signalDown = false; this.refresh(); });
    bus.on('run-started', () => {
      const run = peer.runs.run;
      if (run && run.batches) run.batches.onOutage = (down, why) => this.dataChanged(down ? why : null);
      this.refresh();
    });
    bus.on('run-ended', () => { this.dataDown = null; this.refresh(); });
    bus.on('join-request', (who) => this.readmit(who));
  }

  get down() { return this.signalDown || this.dataDown !== null; }

  // the panel's line while /signal is down (peer.js shows it on a non-final close)
  reconnectText() {
    const parts = [this.peer.s.running ? 'Reconnecting to the server… training goes on peer to peer'
      : 'Reconnecting to the server… joining a group waits until it is back (peers find each other through it)'];
    if (this.dataDown !== null) parts.push(this.dataText());
    return parts.join('; ') + '.';
  }

  dataText() {
    return `waiting for the data server (${this.dataDown}; retrying for up to ${DATA_WAIT_MS / 1000} s)`;
  }

  // the panel's line on a welcome after an outage, or null for the usual one
  welcomeText(m) {
    if (!this.wasDown || !this.peer.s.running) return null;
    const data = this.dataDown !== null ? `; ${this.dataText()}` : '';
    if (m.role === 'pending') {
      return `The server restarted and forgot this room's approvals: waiting for the host to accept this device again; training goes on peer to peer${data}.`;
    }
    return `Back on the server: training goes on${data}.`;
  }

  dataChanged(why) {
    const was = this.dataDown;
    this.dataDown = why;
    if (why !== null) this.peer.set({ message: this.signalDown ? this.reconnectText() : `${cap(this.dataText())}…` });
    else if (was !== null) this.peer.set({ message: this.signalDown ? this.reconnectText() : 'The data server is back: training goes on.' });
    this.refresh();
  }

  // the hold on the run's deadline: bounded by the data wait, then a margin once all is back
  refresh() {
    const now = performance.now();
    if (this.down) {
      this.since ??= now;
      this.holdUntil = this.since + DATA_WAIT_MS + RESUME_MARGIN_MS;
    } else if (this.since !== null) {
      this.since = null;
      this.holdUntil = now + RESUME_MARGIN_MS;
    }
    this.peer.runs.holdDeadlines(this.holdUntil);   // a run that starts during the hold gets it too
  }

  // A restarted server forgot the room's approvals: a peer of our run (or of the last one: a
  // run may end before its peers are back) asks again. Its id is bound to its token, so it is
  // a device this room admitted before: approve it without asking the user.
  readmit(who) {
    const p = this.peer, run = p.runs.run || p.runs.lastRun;
    if (p.s.role !== 'host' || !run || !run.roster.includes(who.id)) return;
    try {
      p.approve(who.id);
      p.note(`${who.name} (${who.id}) asked to join again after a server restart: approved, it trained in this device's run.`);
    } catch (err) {
      console.warn('daisy: could not re-admit a run peer:', err);
    }
  }
}

const cap = (text) => text[0].toUpperCase() + text.slice(1);
