// Byte-level tokenizer, mirroring daisy/tokenizer.py: ids 0..255 are UTF-8 bytes, 256 is EOT.
export const TOKENIZER_ID = 'daisy-bytes-v1';
export const EOT = 256;
export const VOCAB_SIZE = 257;

const utf8Encoder = new TextEncoder();

// str -> Uint16Array token ids (its UTF-8 bytes)
export function encode(text) {
  return Uint16Array.from(utf8Encoder.encode(text));
}

// documents -> one token stream, each document followed by EOT
export function encodeDocuments(docs) {
  const parts = docs.map((d) => utf8Encoder.encode(d));
  const out = new Uint16Array(parts.reduce((n, p) => n + p.length + 1, 0));
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; out[o++] = EOT; }
  return out;
}

// token ids -> text; EOT becomes a blank line; invalid UTF-8 is replaced, never thrown
export function decode(ids) {
  const dec = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
  const out = [];
  let run = [];
  for (const t of ids) {
    if (t === EOT) { out.push(dec.decode(Uint8Array.from(run)), '\n\n'); run = []; }
    else if (Number.isInteger(t) && t >= 0 && t < 256) run.push(t);
    else throw new RangeError(`token id ${t} outside the vocabulary 0..${VOCAB_SIZE - 1}`);
  }
  out.push(dec.decode(Uint8Array.from(run)));
  return out.join('');
}
