// The one config of a run, mirroring daisy/config.py: every field an int but `exchange` (the
// gradient exchange codec's name, exchange_codec.js), validated on creation with the same messages.
// `local_steps` (H, 1..64): steps each device takes between exchanges (train.js Group.localStep);
// the wire form leaves it out at 1, its default, so a run without it has the bytes it always had.
import { VOCAB_SIZE } from './tokenizer.js';

export { VOCAB_SIZE };

export const DEFAULTS = Object.freeze({
  width: 32, seq_len: 32, batch: 8, steps: 300, lr_x1000: 10, layers: 2, heads: 4, seed: 1234, exchange: 'int8', local_steps: 1,
});

// the exchange codecs (exchange_codec.js CODECS); daisy/config.py EXCHANGES is the twin
export const EXCHANGES = Object.freeze(['f64', 'int8']);

// name -> [min, max, what it is]; validate() reads it. The twin of daisy/config.py RANGES (the
// bounds of the page's sliders, of the Python validator and of state_codec.py): change both.
export const RANGES = Object.freeze({
  width: [16, 128, 'model width'],
  seq_len: [16, 128, 'sequence length'],
  batch: [2, 32, 'batch per device'],
  steps: [100, 10000, 'steps'],
  lr_x1000: [5, 50, 'learning rate x1000'],
  layers: [1, 8, 'layers'],
  heads: [1, 8, 'heads'],
  seed: [0, 2 ** 32 - 1, 'seed'],
  local_steps: [1, 64, 'local steps'],
});

export class ConfigError extends Error {
  constructor(msg) { super(msg); this.name = 'ConfigError'; }
}

// Python's repr() of a non-int setting, for the message (strings in single quotes)
const pyRepr = (v) => (typeof v === 'string' ? `'${v}'` : v === null || v === undefined ? 'None'
  : typeof v === 'boolean' ? (v ? 'True' : 'False') : String(v));

export function validate(cfg) {
  for (const [name, [lo, hi, label]] of Object.entries(RANGES)) {
    const v = cfg[name];
    if (typeof v !== 'number' || !Number.isInteger(v)) {
      throw new ConfigError(`${label} (${name}) must be an integer, got ${pyRepr(v)}`);
    }
    if (!(lo <= v && v <= hi)) throw new ConfigError(`${label} (${name}) must be in ${lo}..${hi}, got ${v}`);
  }
  if (!EXCHANGES.includes(cfg.exchange)) {
    throw new ConfigError(`gradient exchange (exchange) must be one of ${EXCHANGES.join(', ')}, got ${pyRepr(cfg.exchange)}`);
  }
  if (cfg.width % cfg.heads) {
    throw new ConfigError(`model width (${cfg.width}) must be a multiple of heads (${cfg.heads})`);
  }
}

// makeConfig({width: 48, ...}) -> a frozen, validated config with head_dim and lr derived.
export function makeConfig(settings = {}) {
  const unknown = Object.keys(settings).filter((k) => !(k in DEFAULTS)).sort();
  if (unknown.length) throw new ConfigError(`unknown setting(s): ${unknown.join(', ')}`);
  const cfg = { ...DEFAULTS, ...settings };
  validate(cfg);
  return Object.freeze({
    ...cfg,
    head_dim: Math.floor(cfg.width / cfg.heads),
    lr: cfg.lr_x1000 / 1000.0,                  // one IEEE division, same bits everywhere
  });
}

// the wire form: exactly the fields of DEFAULTS, in Python's field order
export function configToDict(cfg) {
  const d = {};
  for (const k of Object.keys(DEFAULTS)) d[k] = cfg[k];
  if (d.local_steps === 1 || d.local_steps === undefined) delete d.local_steps;   // the default is left out (daisy/config.py to_dict)
  return d;
}
