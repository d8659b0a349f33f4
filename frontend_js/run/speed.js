// The user's question: does this group train faster than this device would alone? A pure rule
// over what the step loop measures (loop.js report): the group's recent step times and this
// device's own compute per step (its local step, then its Adam step and hash: what one step costs
// it with nobody to wait for). tokensPerDevice = batch * seq_len, P = devices in the run.
//   tokensPerS       = P * tokensPerDevice * (n - 1) * 1000 / (t[n-1] - t[0])   (the last n steps)
//   aloneTokensPerS  = tokensPerDevice * 1000 / mean(ownMs)                      (the same window)
//   ratio            = tokensPerS / aloneTokensPerS
// -> {tokensPerS, aloneTokensPerS, ratio}; a value is null until it can be measured.
export function groupSpeed({ stepTimes, ownMs, tokensPerDevice, P }) {
  const n = stepTimes.length;
  const span = n > 1 ? stepTimes[n - 1] - stepTimes[0] : 0;
  const tokensPerS = span > 0 ? (P * tokensPerDevice * (n - 1) * 1000) / span : null;
  let own = 0;
  for (const ms of ownMs) own += ms;
  const aloneTokensPerS = ownMs.length && own > 0 ? (tokensPerDevice * 1000 * ownMs.length) / own : null;
  const ratio = tokensPerS !== null && aloneTokensPerS !== null ? tokensPerS / aloneTokensPerS : null;
  return { tokensPerS, aloneTokensPerS, ratio };
}

// the panel's words for it: "this group trains 1.9× as fast as this device alone"
export function speedText(speed, P) {
  if (!speed || speed.ratio === null) return '–';
  if (P === 1) return `this device alone: ${Math.round(speed.tokensPerS).toLocaleString('en-US')} tokens/s`;
  const r = speed.ratio;
  return `this group trains ${r >= 10 ? r.toFixed(0) : r.toFixed(1)}× as fast as this device alone `
    + `(${Math.round(speed.aloneTokensPerS).toLocaleString('en-US')} tokens/s alone)`;
}
