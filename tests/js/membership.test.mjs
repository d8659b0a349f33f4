// Membership (frontend_js/peer/membership.js): the signaling server's messages, each through its
// handler of SIGNAL_HANDLERS, drive a real Peer's state (a room host's view, then a member's).
// The signaling socket is the one part replaced: a recorder of what the page sends the server
// (tests/test_membership.py runs the whole thing between real pages and a real server).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Bus } from '../../frontend_js/peer/bus.js';
import { Peer } from '../../frontend_js/peer/peer.js';
import { SIGNAL_HANDLERS } from '../../frontend_js/peer/membership.js';

const SELF = 'a'.repeat(16), B = 'b'.repeat(16), C = 'c'.repeat(16), D = 'd'.repeat(16);

function roomPeer() {
  const bus = new Bus();
  const peer = new Peer(bus, { params: new URLSearchParams('room=r1') });
  peer.conn = { sent: [], send(m) { this.sent.push(m); }, leave() {} };
  peer.listen();
  const events = [];
  for (const e of ['roster', 'join-request', 'rejected']) bus.on(e, (x) => events.push([e, x]));
  const server = (type, m = {}) => bus.emit(`signal:${type}`, { type, ...m });
  return { peer, events, server };
}

test('one handler per server message the page acts on', () => {
  assert.deepEqual(Object.keys(SIGNAL_HANDLERS).sort(), ['approved', 'close', 'error', 'join-request', 'open', 'peer-joined',
    'peer-left', 'peer-updated', 'peers', 'rejected', 'relay', 'role', 'signal', 'welcome']);
});

test('a room host: welcome, a join request approved, a keep-out, a removal, the role handed on', () => {
  const { peer, events, server } = roomPeer();
  server('open');
  assert.equal(peer.s.signal, 'connected');
  server('welcome', { peerId: SELF, name: 'me', group: { kind: 'room', room: 'r1' }, role: 'host',
    peers: [{ id: SELF, name: 'me', role: 'host', state: 'idle' }] });
  assert.equal(peer.s.peerId, SELF);
  assert.equal(peer.mesh.selfId, SELF, 'a new identity resets the links under it');
  assert.match(peer.s.message, /You host room "r1"/);
  assert.equal(peer.conn.sent[0].type, 'hello', 'the welcome is answered with this page\'s path and state');
  assert.deepEqual(events.map(([e]) => e), ['roster']);

  server('join-request', { peer: { id: B, name: 'bee', role: 'pending' } });
  assert.deepEqual(peer.s.requests.map((r) => r.id), [B]);
  assert.deepEqual(events.at(-1), ['join-request', { id: B, name: 'bee', role: 'pending' }]);
  assert.throws(() => peer.approve(C), /no join request from c{16}/);
  peer.approve(B);
  assert.deepEqual(peer.conn.sent.at(-1), { type: 'approve', peer: B });
  assert.deepEqual(peer.s.requests, []);
  server('peer-joined', { peer: { id: B, name: 'bee', role: 'pending', state: 'idle' } });   // pending: no link yet
  assert.deepEqual(peer.s.peers.map((p) => p.id), [SELF, B]);
  assert.deepEqual(peer.s.links, {}, 'no link to a pending peer');

  peer.keepOut(C);
  assert.equal(peer.runs.keptOut.get(C), 'its user chose not to train with it');
  assert.deepEqual(peer.conn.sent.at(-1), { type: 'remove', peer: C }, 'a room host has the server remove it');
  const sent = peer.conn.sent.length;
  server('peer-left', { peer: D, reason: 'removed' });
  assert.equal(peer.s.keptOut[D], 'removed by the room host');
  assert.equal(peer.conn.sent.length, sent, 'the server\'s own removal is not sent back to it');
  assert.throws(() => peer.keepOut(SELF), /choose another device/);

  server('role', { peer: SELF, role: 'member' });
  assert.equal(peer.s.role, 'member');
  assert.throws(() => peer.reject(B), /only the room host can reject \(you are member\)/);
  server('error', { code: 'bad', message: 'no such thing' });
  assert.equal(peer.s.error, 'Server: no such thing');
  server('close', { code: 1006, reason: '', final: false });
  assert.equal(peer.s.signal, 'reconnecting');
});

test('a pending device: waiting, then turned away with the server\'s reason, which stays on a close', () => {
  const { peer, events, server } = roomPeer();
  server('welcome', { peerId: SELF, name: 'me', group: { kind: 'room', room: 'r1' }, role: 'pending',
    peers: [{ id: B, name: 'host', role: 'host', state: 'idle' }] });
  assert.match(peer.s.message, /Waiting for the host of room "r1"/);
  assert.deepEqual(peer.s.links, {}, 'a pending page links to nobody');
  server('rejected', { reason: 'the host declined' });
  assert.equal(peer.s.rejected, true);
  assert.match(peer.s.message, /Not admitted to room "r1": the host declined\./);
  assert.equal(events.at(-1)[0], 'rejected');
  const why = peer.s.message;
  server('close', { code: 4403, reason: 'rejected', final: true });
  assert.equal(peer.s.signal, 'closed');
  assert.equal(peer.s.message, why, 'the close keeps saying why');
});
