// The one event bus of the page: the signaling client, the peer and the UI talk through it.
//   const off = bus.on('state', (s) => ...); bus.emit('state', s); off();
// A listener that throws is reported on the console and does not stop the others.
export class Bus {
  constructor() { this.listeners = new Map(); }   // event -> Set of callbacks

  on(event, cb) {
    if (typeof cb !== 'function') throw new TypeError(`bus.on(${event}): callback must be a function`);
    if (!this.listeners.has(event)) this.listeners.set(event, new Set());
    this.listeners.get(event).add(cb);
    return () => this.listeners.get(event)?.delete(cb);
  }

  emit(event, payload) {
    for (const cb of [...(this.listeners.get(event) || [])]) {
      try { cb(payload); } catch (err) { console.warn(`daisy: a '${event}' listener failed:`, err); }
    }
    for (const cb of [...(this.listeners.get('*') || [])]) {
      try { cb(event, payload); } catch (err) { console.warn('daisy: a \'*\' listener failed:', err); }
    }
  }
}

export const bus = new Bus();
