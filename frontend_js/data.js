// Training data, mirroring daisy/data.py: a token stream and the batch addressing rule.
//   k = prng.key(PURPOSE_DATA, seed, step, slot)        step counts from 0
//   start_b = prng.draw(k, b) mod (len(stream) - T)     b = 0..B-1
//   x_b = stream[start_b : start_b + T],  y_b = stream[start_b + 1 : start_b + T + 1]
import { key, draw, PURPOSE_DATA } from './prng.js';
import { encodeDocuments } from './tokenizer.js';

export const DOC_SEPARATOR = '\n\n\n';

export class DataError extends Error {
  constructor(msg) { super(msg); this.name = 'DataError'; }
}

// Python's str.isspace() set (str.strip() with no argument strips exactly these)
const PY_SPACE = '\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005'
  + '\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000';
const isBlank = (d) => [...d].every((ch) => PY_SPACE.includes(ch));
const stripNewlines = (d) => d.replace(/^\n+|\n+$/g, '');

// Corpus text -> documents, as data.builtin_documents (split on two blank lines, strip '\n').
// The text must be what Python's read_text gives: universal newlines (\r\n and \r -> \n).
export function textDocuments(text) {
  return text.split(DOC_SEPARATOR).filter((d) => !isBlank(d)).map(stripNewlines);
}

// UTF-8 file bytes -> text like Python's Path.read_text(encoding='utf-8'): strict, BOM kept,
// universal newlines.
export function decodeText(bytes, name = 'the text') {
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch {
    throw new DataError(`--data: ${name} is not valid UTF-8 text`);
  }
  return text.replace(/\r\n?/g, '\n');
}

export function textStream(text) {
  return encodeDocuments(textDocuments(text));
}

// (B,) start offsets of the batch of (seed, step, slot) in a stream of nTokens
export function batchStarts(nTokens, seed, step, slot, B, T) {
  if (nTokens < T + 1) {
    throw new DataError(`the token stream has ${nTokens} tokens; at least seq_len+1 = ${T + 1} needed`);
  }
  const k = key(PURPOSE_DATA, seed, step, slot);
  const starts = new Array(B);
  for (let b = 0; b < B; b++) starts[b] = draw(k, b) % (nTokens - T);
  return starts;
}

// -> { x: Int32Array (B*T), y: Int32Array (B*T) } row-major (B, T)
export function getBatch(stream, seed, step, slot, B, T) {
  const starts = batchStarts(stream.length, seed, step, slot, B, T);
  const x = new Int32Array(B * T), y = new Int32Array(B * T);
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      x[b * T + t] = stream[starts[b] + t];
      y[b * T + t] = stream[starts[b] + t + 1];
    }
  }
  return { x, y };
}
