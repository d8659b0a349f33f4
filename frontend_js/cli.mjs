#!/usr/bin/env node
// The JS trainer CLI, the twin of daisy/cli.py (`python -m daisy.train`): the same flags, the same
// --json lines, line for line:
//   diff <(python -m daisy.train --peers 2 --steps 100 --stop-after 20 --json) \
//        <(node frontend_js/cli.mjs --peers 2 --steps 100 --stop-after 20 --json)    # empty
// Argument errors print a usage line and "node frontend_js/cli.mjs: error: <the message Python
// prints>" and exit 2, as argparse does.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { makeConfig, ConfigError, DEFAULTS } from './config.js';
import { DataError, batchStarts, decodeText, textStream } from './data.js';
import { VOCAB_SIZE } from './tokenizer.js';
import { Group, MAX_PEERS, RosterError, checkRoster, leftAt, parseRoster, peersAt, stepJsonLine } from './train.js';
import { GPU_MODES, pickBackend } from './backends.js';
import { MAX_THREADS } from './cpu/workers.js';
import { AttackError, AuditedRun, checkAttack, parseAttack, parseAuditRate, runAudited } from './attack.js';
import { RoundAuditedRun } from './attack_rounds.js';
import { DEFAULT_AUDIT_RATE } from './audit.js';
import { short } from './hashing.js';

const PROG = 'node frontend_js/cli.mjs';
const BUILTIN_CORPUS = fileURLToPath(new URL('../daisy/corpus/builtin.txt', import.meta.url));

// flag -> [dest, help, metavar?]; every flag but --json takes one int (or, for --data, a path;
// --roster, a schedule; --exchange, a codec name)
const FLAGS = {
  '--peers': ['peers', `simulated peers, 1..${MAX_PEERS} (2)`],
  '--roster': ['roster', 'peers per step: "0:2,10:3" = steps 0..9 on 2 peers, from 10 on 3 (a new replica '
    + 'copies replica 0; shrinking drops the highest slots, or the ones "8:2:1" names: slot 1 leaves at step 8)', 'STEP:PEERS[:SLOTS],...'],
  '--steps': ['steps', 'steps of the run, 100..10000 (300)'],
  '--stop-after': ['stop_after', 'stop after this many steps of the run (fixtures, quick checks)'],
  '--width': ['width', 'model width, 16..128 (32)'],
  '--seq-len': ['seq_len', 'sequence length, 16..128 (32)'],
  '--batch': ['batch', 'batch per device, 2..32 (8)'],
  '--lr': ['lr', 'learning rate x1000, 5..50 (10)'],
  '--layers': ['layers', 'transformer blocks, 1..8 (2)'],
  '--heads': ['heads', 'attention heads, 1..8 (4)'],
  '--seed': ['seed', 'run seed, 0..2^32-1 (1234)'],
  '--exchange': ['exchange', 'how gradients travel between peers: f64 or int8 (f64; exchange_codec.js)', 'CODEC'],
  '--local-steps': ['local_steps', "steps each peer takes between exchanges, 1..64 (1): H > 1 averages the peers' "
    + 'weights (int8 deltas) every H steps (docs/VERIFICATION.md)'],
  '--data': ['data', 'a token file (*.u16, *.bin, *.tokens: raw little-endian uint16 ids) or a UTF-8 '
    + 'text file (documents separated by two blank lines, as the built-in corpus); parquet is not '
    + 'read by the JS CLI (default: built-in corpus)'],
  '--json': ['json', 'one JSON object per step: step, loss, hashes'],
  '--threads': ['threads', `run each step's kernels on this many threads, 1..${MAX_THREADS} (frontend_js/cpu/threads.js; `
    + 'the same bits for every count). Not a flag of daisy.train. Default: the single-threaded wasm-simd backend'],
  '--gpu': ['gpu', 'off (default), auto (the GEMMs on WebGPU where, timed at these settings, it is faster than the CPU), '
    + 'all (every GEMM on WebGPU), or resident (the whole step on WebGPU: weights, moments, activations stay there); '
    + 'needs the npm package webgpu (NODE_PATH). Same bits. Not a flag of daisy.train', 'MODE'],
  '--save': ['save', 'not in the JS CLI (checkpoints: python -m daisy.train --save)'],
  '--resume': ['resume', 'not in the JS CLI (checkpoints: python -m daisy.train --resume)'],
  '--attack': ['attack', 'an audited run in which peer S forges its gradient from step index STEP on '
    + '(frontend_js/attack.js: kinds, audits, removal)', 'slot=S,from=STEP,kind=KIND'],
  '--audit-rate': ['audit_rate', 'an audited run in which each slot\'s contribution to a step is audited with '
    + 'this chance, 0..1 (0.1 with --attack)'],
};
const USAGE = `usage: ${PROG} [-h] [--peers PEERS] [--roster STEP:PEERS[:SLOTS],...] [--steps STEPS]
       [--stop-after STOP_AFTER] [--width WIDTH] [--seq-len SEQ_LEN] [--batch BATCH] [--lr LR]
       [--layers LAYERS] [--heads HEADS] [--seed SEED] [--exchange CODEC] [--local-steps LOCAL_STEPS] [--data DATA] [--json] [--save SAVE]
       [--resume RESUME] [--attack slot=S,from=STEP,kind=KIND] [--audit-rate AUDIT_RATE]
       [--threads THREADS] [--gpu MODE]`;

class UsageError extends Error {}

function help() {
  const lines = [USAGE, '', 'The JS CPU mirror of the reference trainer (python -m daisy.train): P simulated peers',
    'in one process, each with its own replica; same flags, same --json lines, same bits.', '',
    'options:', '  -h, --help            show this help message and exit'];
  for (const [flag, [dest, text, metavar]] of Object.entries(FLAGS)) {
    const left = flag === '--json' ? flag : `${flag} ${metavar ?? dest.toUpperCase()}`;
    lines.push(left.length < 22 ? `  ${left.padEnd(22)}${text}` : `  ${left}\n${' '.repeat(24)}${text}`);
  }
  return lines.join('\n');
}

// Python int(): optional whitespace and sign, digits with single underscores between them
function pyInt(flag, s) {
  const m = /^\s*([+-]?)(\d(?:_?\d)*)\s*$/.exec(s);
  if (!m) throw new UsageError(`argument ${flag}: invalid int value: '${s}'`);
  const v = Number(m[1] + m[2].replaceAll('_', ''));
  return v === 0 ? 0 : v;
}

// argparse semantics: --flag VALUE or --flag=VALUE, unique prefixes, unknown args reported together
export function parseArgs(argv) {
  const args = { peers: null, roster: null, stop_after: null, data: null, json: false, lr: DEFAULTS.lr_x1000, threads: null, gpu: 'off',
    attack: null, audit_rate: null, attackSpec: null };
  for (const k of ['steps', 'width', 'seq_len', 'batch', 'layers', 'heads', 'seed', 'exchange', 'local_steps']) args[k] = DEFAULTS[k];
  const unknown = [];
  for (let i = 0; i < argv.length; i++) {
    const tok = argv[i];
    if (tok === '-h' || tok === '--help') return { help: true };
    if (!tok.startsWith('--') || tok === '--') { unknown.push(tok); continue; }
    const eq = tok.indexOf('=');
    const name = eq >= 0 ? tok.slice(0, eq) : tok;
    let flag = name in FLAGS ? name : null;
    if (!flag) {
      const matches = Object.keys(FLAGS).filter((f) => f.startsWith(name)).concat('--help'.startsWith(name) ? ['--help'] : []);
      if (matches.length > 1) throw new UsageError(`ambiguous option: ${name} could match ${matches.join(', ')}`);
      if (matches.length === 0) { unknown.push(tok); continue; }
      if (matches[0] === '--help') return { help: true };
      flag = matches[0];
    }
    const dest = FLAGS[flag][0];
    if (flag === '--json') {
      if (eq >= 0) throw new UsageError(`argument --json: ignored explicit argument '${tok.slice(eq + 1)}'`);
      args.json = true;
      continue;
    }
    let value;
    if (eq >= 0) value = tok.slice(eq + 1);
    else {
      const next = argv[i + 1];
      if (next === undefined || (next.startsWith('-') && !/^-\d+$|^-\d*\.\d+$/.test(next))) {
        throw new UsageError(`argument ${flag}: expected one argument`);
      }
      value = next; i++;
    }
    if (flag === '--save' || flag === '--resume') {
      throw new UsageError(`${flag}: checkpoints are not read or written by the JS CLI; use python -m daisy.train ${flag}`);
    }
    args[dest] = ['--data', '--roster', '--exchange', '--attack', '--audit-rate', '--gpu'].includes(flag) ? value : pyInt(flag, value);
  }
  if (unknown.length) throw new UsageError(`unrecognized arguments: ${unknown.join(' ')}`);
  if (args.peers !== null && args.roster !== null) {
    throw new UsageError('give --roster or --peers, not both (--peers N is the roster 0:N)');
  }
  if (args.threads !== null && !(args.threads >= 1 && args.threads <= MAX_THREADS)) {
    throw new UsageError(`threads (--threads) must be in 1..${MAX_THREADS}, got ${args.threads}`);
  }
  if (!GPU_MODES.includes(args.gpu)) throw new UsageError(`argument --gpu: invalid choice: '${args.gpu}' (choose from ${GPU_MODES.join(', ')})`);
  if (args.peers !== null && !(args.peers >= 1 && args.peers <= MAX_PEERS)) {
    throw new UsageError(`peers (--peers) must be in 1..${MAX_PEERS}, got ${args.peers}`);
  }
  args.schedule = args.roster === null ? [[0, args.peers ?? 2]] : rosterOrUsage(() => parseRoster(args.roster));
  if (args.attack !== null || args.audit_rate !== null) auditedArgs(args);
  let cfg;
  try {
    cfg = makeConfig({ width: args.width, seq_len: args.seq_len, batch: args.batch, steps: args.steps,
      lr_x1000: args.lr, layers: args.layers, heads: args.heads, seed: args.seed, exchange: args.exchange,
      local_steps: args.local_steps });
  } catch (e) {
    if (e instanceof ConfigError) throw new UsageError(e.message);
    throw e;
  }
  if (args.stop_after !== null && !(args.stop_after >= 1 && args.stop_after <= cfg.steps)) {
    throw new UsageError(`--stop-after must be in 1..${cfg.steps} (the run's steps), got ${args.stop_after}`);
  }
  if (args.roster !== null) rosterOrUsage(() => checkRoster(args.schedule, args.roster, 0, cfg.steps, cfg.local_steps));
  // (daisy.train's --save refusal for local steps stopped early: the JS CLI has no --save)
  if (cfg.local_steps > 1 && args.audit_rate !== null && args.stop_after !== null && args.stop_after !== cfg.steps
      && args.stop_after % cfg.local_steps !== 0) {
    throw new UsageError(`--stop-after with --local-steps ${cfg.local_steps} and audits ends at a round's exchange `
      + `(a multiple of ${cfg.local_steps}, or the run's steps), got ${args.stop_after}`);
  }
  if (args.attackSpec !== null) attackOrUsage(() => checkAttack(args.attackSpec, args.schedule[0][1], cfg.steps, cfg.local_steps));
  return { args, cfg };
}

// --attack / --audit-rate: an audited run (attack.js) of --peers from step 0 (daisy/cli.py audited_args)
function auditedArgs(args) {
  if (args.roster !== null) {
    throw new UsageError('--attack and --audit-rate run --peers P from step 0: drop --roster, --resume and --save');
  }
  args.audit_rate = args.audit_rate === null ? DEFAULT_AUDIT_RATE : attackOrUsage(() => parseAuditRate(args.audit_rate));
  if (args.attack !== null) args.attackSpec = attackOrUsage(() => parseAttack(args.attack));
}

function attackOrUsage(f) {
  try {
    return f();
  } catch (e) {
    if (e instanceof AttackError) throw new UsageError(e.message);
    throw e;
  }
}

function rosterOrUsage(f) {
  try {
    return f();
  } catch (e) {
    if (e instanceof RosterError) throw new UsageError(e.message);
    throw e;
  }
}

function readBytes(path) {
  try {
    return readFileSync(path);
  } catch (e) {
    if (e.code === 'ENOENT') throw new DataError(`--data: no such file: ${path}`);
    throw new DataError(`--data: cannot read ${path} (${e.code || e.message})`);
  }
}

// --data PATH -> Uint16Array token stream
export function loadStream(path) {
  if (path === null) return textStream(decodeText(readBytes(BUILTIN_CORPUS), BUILTIN_CORPUS));
  if (/\.parquet$/i.test(path)) {
    throw new DataError(`--data: ${path}: parquet is not read by the JS CLI; pass a text file or a raw `
      + 'uint16 token file (*.u16), or use python -m daisy.train');
  }
  const bytes = readBytes(path);
  if (/\.(u16|bin|tokens)$/i.test(path)) {
    if (bytes.length % 2) throw new DataError(`--data: ${path} has ${bytes.length} bytes, not a whole number of uint16 tokens`);
    const stream = new Uint16Array(bytes.length / 2);
    for (let i = 0; i < stream.length; i++) stream[i] = bytes[2 * i] | (bytes[2 * i + 1] << 8);
    const bad = stream.findIndex((t) => t >= VOCAB_SIZE);
    if (bad >= 0) throw new DataError(`--data: ${path}: token ${stream[bad]} at index ${bad} is outside the vocabulary 0..${VOCAB_SIZE - 1}`);
    return stream;
  }
  return textStream(decodeText(bytes, path));
}

// Node's WebGPU: the npm package `webgpu` (Dawn), found through NODE_PATH
async function nodeGpu() {
  const { createRequire } = await import('node:module');
  let webgpu;
  try {
    webgpu = createRequire(import.meta.url)('webgpu');
  } catch (e) {
    throw new Error(`--gpu needs the npm package webgpu (put its node_modules on NODE_PATH): ${e.message.split('\n')[0]}`);
  }
  Object.assign(globalThis, webgpu.globals);
  return webgpu.create([]);
}

export async function main(argv) {
  let parsed;
  try {
    parsed = parseArgs(argv);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stderr.write(`${USAGE}\n${PROG}: error: ${e.message}\n`);
    return 2;
  }
  if (parsed.help) { process.stdout.write(help() + '\n'); return 0; }
  const { args, cfg } = parsed;
  let stream;
  try {
    stream = loadStream(args.data);
    batchStarts(stream.length, cfg.seed, 0, 0, 1, cfg.seq_len);           // stream long enough?
  } catch (e) {
    if (!(e instanceof DataError)) throw e;
    process.stderr.write(`error: ${e.message}\n`);
    return 2;
  }
  let picked;
  try {
    picked = await pickBackend({ gpu: args.gpu === 'off' ? null : await nodeGpu(), mode: args.gpu, threads: args.threads ?? 1, settings: cfg,
      engineOpts: { log: { log: (line) => process.stderr.write(`${line}\n`) } } });
  } catch (e) {
    process.stderr.write(`error: ${e.message}\n`);
    return 2;
  }
  if (args.gpu !== 'off') {                      // what was picked, and why (stdout stays Python's)
    const say = ({ pathLabel, pathReason }) => process.stderr.write(`compute: ${pathLabel} (${pathReason})\n`);
    say(picked.describe());
    picked.onChange(say);
  }
  // the GPU's backend holds its engine, which computes on the CPU by itself after a fault; a
  // wrong result caught by an audit (GpuFault) redoes the step (nothing was applied yet)
  const group = new Group(cfg, peersAt(args.schedule, 0), stream, picked.backend, null, (c, r, b, o) => picked.trainer(c, r, b, o));
  const step = picked.gpuModule ? () => picked.gpuModule.withGpuFallback(picked.engine, () => group.step()) : () => group.step();
  if (args.audit_rate !== null) {
    const runner = cfg.local_steps > 1 ? RoundAuditedRun : AuditedRun;     // local steps: rounds are audited
    return runAudited(args, cfg, group, (line) => process.stdout.write(line + '\n'), (line) => process.stderr.write(line + '\n'), runner);
  }
  const n = args.stop_after === null ? cfg.steps : args.stop_after;
  for (let i = 0; i < n; i++) {
    let r;
    const s = group.replicas[0].step;
    group.resize(peersAt(args.schedule, s), leftAt(args.schedule, s));
    try {
      r = await step();
    } catch (e) {
      if (!(e instanceof RangeError)) throw e;
      process.stderr.write(`error: ${e.message}\n`);
      return 1;
    }
    const agree = new Set(r.hashes).size === 1;
    if (args.json) process.stdout.write(stepJsonLine(r) + '\n');
    else {
      process.stdout.write(`step ${String(r.step).padStart(5)}  loss ${r.loss.toFixed(4)}  hash ${short(r.hashes[0])}  `
        + `(${r.hashes.length} peers ${agree ? 'agree' : 'DISAGREE'})\n`);
    }
    if (!agree) { process.stderr.write('error: replicas diverged; stopping (never fork)\n'); return 3; }
  }
  return 0;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main(process.argv.slice(2)).then((rc) => { process.exitCode = rc; }, (e) => {
    process.stderr.write(`error: ${e && e.message ? e.message : e}\n`);
    process.exitCode = 1;
  });
}
