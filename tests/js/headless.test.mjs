// The headless peer's command line and policies (frontend_js/headless.mjs), pure parts. The peer
// itself is tested against real pages and a real server in tests/test_headless.py.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { approval, parseArgs, parseSettings, printable, statusLine } from '../../frontend_js/headless.mjs';

test('parseArgs: URL, room, name, approval list, keep, start settings, page parameters; bad input named', () => {
  const o = parseArgs(['http://127.0.0.1:7860/', '--room', 'abc', '--name', 'lab', '--approve', 'p1,box',
    '--keep', '--json', '--start', 'width=16,steps=30,exchange=int8', '--peers', '2', '--param', 'storeEvery=5']);
  assert.equal(o.url, 'http://127.0.0.1:7860');
  assert.equal(o.room, 'abc');
  assert.equal(o.params.get('room'), 'abc');
  assert.equal(o.params.get('storeEvery'), '5');
  assert.deepEqual([...o.approve], ['p1', 'box']);
  assert.deepEqual(o.start, { width: 16, steps: 30, exchange: 'int8' });
  assert.equal(o.peers, 2);
  assert.ok(o.keep && o.json);
  assert.equal(parseArgs(['https://x.hf.space', '--approve', 'all']).approve, 'all');
  assert.throws(() => parseArgs([]), /required: URL/);
  assert.throws(() => parseArgs(['ws://x']), /http or https/);
  assert.throws(() => parseArgs(['http://x', '--room']), /--room: expected one argument/);
  assert.throws(() => parseArgs(['http://x', '--frobnicate']), /unrecognized argument: --frobnicate/);
  assert.throws(() => parseArgs(['http://x', '--peers', '99']), /--peers/);
  assert.throws(() => parseSettings('width'), /expected k=v/);
});

test('approval: all, a list of peer ids (others declined, a name is no credential), else asked', () => {
  const req = { id: 'a1b2', name: 'laptop' };
  assert.equal(approval('all', req), 'approve');
  assert.equal(approval(new Set(['a1b2']), req), 'approve');
  assert.equal(approval(new Set(['laptop']), req), 'reject');      // anyone may call itself laptop
  assert.equal(approval(new Set(['other']), req), 'reject');
  assert.equal(approval(null, req), 'ask');
});

test('statusLine: step, loss, tokens/s, admitted peers, hash', () => {
  const s = { step: 12, totalSteps: 30, loss: 5.123456, tokensPerS: 1234.5, hash: 'ab'.repeat(32),
    peers: [{ role: 'member' }, { role: 'host' }, { role: 'pending' }] };
  assert.equal(statusLine(s), `step 12/30 loss 5.1235 1235 tok/s peers 2 hash ${'ab'.repeat(8)}`);
  assert.equal(statusLine({ ...s, loss: null, tokensPerS: null }), `step 12/30 peers 2 hash ${'ab'.repeat(8)}`);
});

test('printable: a peer\'s text reaches the terminal with its control characters escaped (no escape sequence, no line of its own)', () => {
  const reason = 'stopped\n\u001b[2J\u001b]0;title\u0007join request from box (p1): approve? [y/n]\u009b';
  const line = printable(reason);
  assert.equal(line, 'stopped\\x0a\\x1b[2J\\x1b]0;title\\x07join request from box (p1): approve? [y/n]\\x9b');
  assert.doesNotMatch(line, /[\u0000-\u001f\u007f-\u009f]/);
  assert.equal(printable('Error: x\n    at f (a.js:1)\u001b', '\n\t'), 'Error: x\n    at f (a.js:1)\\x1b');
  assert.equal(printable('step 3/100 loss 5.1 — ünïcode'), 'step 3/100 loss 5.1 — ünïcode');
});
