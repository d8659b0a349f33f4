// The signaling client: one WebSocket to /signal (docs/PROTOCOL.md), kept alive.
//   - answers the server's `ping` with `pong` and pings the server itself, so a dead socket is
//     noticed even when the server goes silent (proxies drop idle sockets);
//   - reconnects with backoff, presenting the identity token of `welcome`, so the server gives
//     back the same peer id and role (within its grace period);
//   - never reconnects after a final close: left, rejected by the host, bad room, replaced by
//     a newer tab with the same token.
// Every server message is emitted on the bus as `signal:<type>` (e.g. `signal:welcome`), plus
// `signal:open` / `signal:close` {code, reason, final} for the socket itself.

const FINAL_CLOSES = new Map([
  [1000, 'left'],
  [4400, 'bad room code'],
  [4403, 'rejected by the host'],
  [4409, 'replaced by a newer connection'],
  [4410, 'the room closed: no approved member is left'],
]);
const BACKOFF_MS = [500, 1000, 2000, 4000, 5000];   // capped low: after a restart, pages are back within 5 s

export class ServerConnection {
  // url: the /signal endpoint, no query (default: this page's origin's); token: an identity of an
  // earlier `welcome` to present on the first connect (the headless peer's saved seat)
  constructor(bus, { room = null, name = null, url = null, token = null } = {}) {
    this.bus = bus;
    this.room = room;
    this.name = name;
    this.url = url;
    this.token = token;       // from `welcome`; a page keeps it in memory only (one identity per tab)
    this.ws = null;
    this.attempt = 0;
    this.final = false;
    this.pingTimer = null;
    this.lastHeard = 0;
    this.pingIntervalS = 20;
  }

  endpoint() {
    const base = this.url || `${location.protocol === 'https:' ? 'wss:' : 'ws:'}//${location.host}/signal`;
    const params = new URLSearchParams();
    if (this.room !== null) params.set('room', this.room);
    if (this.token) params.set('token', this.token);
    if (this.name) params.set('name', this.name);
    const query = params.toString();
    return `${base}${query ? '?' + query : ''}`;
  }

  connect() {
    if (this.final) return;
    const ws = new WebSocket(this.endpoint());
    this.ws = ws;
    ws.onopen = () => {
      this.lastHeard = Date.now();
      this.bus.emit('signal:open', { resume: Boolean(this.token) });
    };
    ws.onmessage = (ev) => {
      this.lastHeard = Date.now();
      let msg;
      try { msg = JSON.parse(ev.data); } catch { console.warn('daisy: non-JSON from the server'); return; }
      if (msg.type === 'ping') { this.send({ type: 'pong' }); return; }
      if (msg.type === 'pong') return;
      if (msg.type === 'welcome') {
        this.token = msg.token;
        this.attempt = 0;
        if (msg.pingIntervalS > 0) this.pingIntervalS = msg.pingIntervalS;
        this.startPinging();
      }
      this.bus.emit('signal:' + msg.type, msg);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;        // an older socket we already replaced
      this.stopPinging();
      const finalWhy = FINAL_CLOSES.get(ev.code);
      if (finalWhy) this.final = true;
      this.bus.emit('signal:close', { code: ev.code, reason: ev.reason || finalWhy || '', final: this.final });
      if (!this.final) {
        const delay = BACKOFF_MS[Math.min(this.attempt++, BACKOFF_MS.length - 1)];
        setTimeout(() => this.connect(), delay);
      }
    };
    ws.onerror = () => {};                // onclose follows and handles it
  }

  send(msg) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(msg));
    return true;
  }

  get connected() { return Boolean(this.ws && this.ws.readyState === WebSocket.OPEN); }

  // Our own ping: if nothing at all came for two intervals, the socket is dead; close it so
  // onclose reconnects.
  startPinging() {
    this.stopPinging();
    const periodMs = this.pingIntervalS * 1000;
    this.pingTimer = setInterval(() => {
      if (Date.now() - this.lastHeard > 2 * periodMs) { this.ws?.close(); return; }
      this.send({ type: 'ping' });
    }, periodMs);
  }

  stopPinging() { clearInterval(this.pingTimer); this.pingTimer = null; }

  leave() {
    this.final = true;
    this.send({ type: 'leave' });
    this.stopPinging();
  }
}
