// Membership: this page in its signaling group or room (docs/ARCHITECTURE.md "The browser peer's
// modules"). The server's messages come as bus events `signal:<type>` (server_connection.js); each
// type has one handler here, (peer, m) => void, in one table like the run controller's
// (../run/controller.js HANDLERS). A type with no handler is not for the page (ping: the
// connection answers it).
//
//   for (const [type, fn] of Object.entries(SIGNAL_HANDLERS)) bus.on(`signal:${type}`, (m) => fn(peer, m));
//
// Every change of the member list is emitted as `roster` (the run controller hears the server's
// word on who is here through it, peer.js) and brings the links up to date (links.js).

// the member list changed: tell the page's listeners, link to whom it now holds
function rosterChanged(peer) {
  peer.bus.emit('roster', peer.s.peers);
  peer.links.sync();
}

export const SIGNAL_HANDLERS = {
  open: (peer) => peer.set({ signal: 'connected' }),
  close: (peer, { code, reason, final }) => peer.set({
    signal: final ? 'closed' : 'reconnecting',
    message: peer.s.rejected ? peer.s.message            // keep saying why
      : final ? `Disconnected from the server: ${reason || 'code ' + code}.` : peer.outage.reconnectText(),
  }),
  welcome: (peer, m) => {
    if (m.peerId !== peer.s.peerId && !peer.runs.busy) peer.links.reset(m.peerId);
    if (Array.isArray(m.iceServers)) peer.links.iceServers = m.iceServers;
    peer.set({ peerId: m.peerId, name: m.name, group: m.group, role: m.role, peers: m.peers,
               requests: [], rejected: false, message: welcomeText(peer, m), error: '' });
    peer.announce();
    rosterChanged(peer);
  },
  peers: (peer, m) => { peer.set({ peers: m.peers }); rosterChanged(peer); },
  'peer-joined': (peer, m) => {
    const peers = peer.s.peers.filter((p) => p.id !== m.peer.id).concat([m.peer]);
    peer.set({ peers, requests: peer.s.requests.filter((r) => r.id !== m.peer.id) });
    rosterChanged(peer);
  },
  'peer-updated': (peer, m) => {
    peer.set({ peers: peer.s.peers.map((p) => (p.id === m.peer.id ? m.peer : p)) });
    peer.bus.emit('roster', peer.s.peers);
  },
  'peer-left': (peer, m) => {
    peer.runs.serverSaysGone(m.peer);
    peer.set({ peers: peer.s.peers.filter((p) => p.id !== m.peer),
               requests: peer.s.requests.filter((r) => r.id !== m.peer) });
    peer.bus.emit('roster', peer.s.peers);
    // an explicit goodbye ends the link; a dropped socket may come back (the link may be fine);
    // a device the room's host removed is kept out here too (the server's word)
    if (m.reason === 'removed') keepOut(peer, m.peer, 'removed by the room host');
    if (m.reason === 'left' || m.reason === 'removed') peer.links.close(m.peer, m.reason === 'left' ? 'it left the group' : 'the room host removed it');
  },
  role: (peer, m) => {
    const peers = peer.s.peers.map((p) => (p.id === m.peer ? { ...p, role: m.role } : p));
    const patch = { peers };
    if (m.peer === peer.s.peerId) {
      patch.role = m.role;
      if (m.role === 'host') patch.message = 'You are now the host of this room: approve who joins.';
    }
    peer.set(patch);
  },
  'join-request': (peer, m) => {
    const requests = peer.s.requests.filter((r) => r.id !== m.peer.id).concat([m.peer]);
    peer.set({ requests });
    peer.bus.emit('join-request', m.peer);
  },
  approved: (peer, m) => {
    peer.set({ role: m.role, peers: m.peers, message: 'The host accepted you into the room.' });
    peer.announce();
    rosterChanged(peer);
  },
  signal: (peer, m) => peer.links.onSignal(m.from, m.data),
  relay: (peer, m) => peer.links.onRelay(m.from, m.data),
  rejected: (peer, m) => {
    // the server's reason says who declined what (daisy/space/signaling/hub.py); say it once
    const why = typeof m.reason === 'string' && m.reason ? m.reason : 'the host declined the request';
    peer.set({ rejected: true, message: `Not admitted to room "${peer.room}": ${why}. Reload the page to ask again.` });
    peer.bus.emit('rejected', m);
  },
  error: (peer, m) => {
    console.warn(`daisy: server error ${m.code}: ${m.message}`);
    peer.set({ error: `Server: ${m.message}` });
  },
};

function welcomeText(peer, m) {
  const back = peer.outage.welcomeText(m);   // after an outage, mid-run
  if (back) return back;
  if (m.group.kind === 'network') return 'Connected: devices on your network land in this group.';
  if (m.role === 'host') return `You host room "${peer.room}": approve each device that asks to join.`;
  if (m.role === 'pending') return `Waiting for the host of room "${peer.room}" to accept you…`;
  return `Connected to room "${peer.room}".`;
}

// "don't train with this device" (the peer row's button): the run controller refuses any roster
// with it and never proposes one (run/controller.js keepOut); a room's host also has the server
// remove it from the room (`remove`: it leaves, and its id may not come back)
export function keepOut(peer, peerId, why = 'its user chose not to train with it') {
  if (typeof peerId !== 'string' || peerId === peer.s.peerId) throw new Error('choose another device of the group');
  peer.runs.keepOut(peerId, why);
  peer.set({ keptOut: { ...peer.s.keptOut, [peerId]: why } });
  if (peer.s.role === 'host' && peer.room !== null && why !== 'removed by the room host') peer.conn.send({ type: 'remove', peer: peerId });
  return true;
}

// the room host's answer to a join request: type 'approve' | 'reject'
export function decide(peer, type, peerId) {
  if (peer.s.role !== 'host') throw new Error(`only the room host can ${type} (you are ${peer.s.role})`);
  if (!peer.s.requests.some((r) => r.id === peerId)) throw new Error(`no join request from ${peerId}`);
  peer.conn.send({ type, peer: peerId });
  peer.set({ requests: peer.s.requests.filter((r) => r.id !== peerId) });
  return true;
}
