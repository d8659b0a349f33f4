// The user's question: does this group train faster than this device would alone? A pure rule
// over what the step loop measures (loop.js report): the group's recent step times and this
// device's own compute per step (its local step, then its Adam step and hash: what one step costs
// it with nobody to wait for). tokensPerDevice = batch * seq_len, P = devices in the run.
//   tokensPerS       = P * tokensPerDevice * (n - 1) * 1000 / (t[n-1] - t[0])   (the last n steps)
//   aloneTokensPerS  = tokensPerDevice * 1000 / mean(ownMs)                      (the same window)
//   ratio            = tokensPerS / aloneTokensPerS
//   suggestH         = ceil(X / C), X = the mean step minus this device's own C, when the group
//                      waits longer than it computes (P > 1): the local steps that would hide the
//                      exchange (docs/VERIFICATION.md "Local steps"), at most 64; else null
// -> {tokensPerS, aloneTokensPerS, ratio, suggestH}; a value is null until it can be measured.
export function groupSpeed({ stepTimes, ownMs, tokensPerDevice, P }) {
  const n = stepTimes.length;
  const span = n > 1 ? stepTimes[n - 1] - stepTimes[0] : 0;
  const tokensPerS = span > 0 ? (P * tokensPerDevice * (n - 1) * 1000) / span : null;
  let own = 0;
  for (const ms of ownMs) own += ms;
  const aloneTokensPerS = ownMs.length && own > 0 ? (tokensPerDevice * 1000 * ownMs.length) / own : null;
  const ratio = tokensPerS !== null && aloneTokensPerS !== null ? tokensPerS / aloneTokensPerS : null;
  let suggestH = null;
  if (ratio !== null && P > 1) {
    const C = own / ownMs.length, X = span / (n - 1) - C;
    if (X > C) suggestH = Math.min(64, Math.ceil(X / C));
  }
  return { tokensPerS, aloneTokensPerS, ratio, suggestH };
}

// the panel's words for it: "this group trains 1.9× as fast as this device alone"; in a run that
// exchanges every step (localSteps 1) and waits longer than it computes, the setting that would help
export function speedText(speed, P, localSteps = 1) {
  if (!speed || speed.ratio === null) return '–';
  if (P === 1) return `this device alone: ${Math.round(speed.tokensPerS).toLocaleString('en-US')} tokens/s`;
  const r = speed.ratio;
  const hint = localSteps === 1 && speed.suggestH !== null && speed.suggestH >= 2
    ? `; the exchange takes longer than a step here: local steps ${speed.suggestH} would hide it` : '';
  return `this group trains ${r >= 10 ? r.toFixed(0) : r.toFixed(1)}× as fast as this device alone `
    + `(${Math.round(speed.aloneTokensPerS).toLocaleString('en-US')} tokens/s alone)${hint}`;
}
