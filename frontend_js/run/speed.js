// The user's question: does this group train faster than this device would alone? A pure rule
// over what the step loop measures (loop.js report): the group's recent step times and this
// device's own compute per step (its local step, then its Adam step and hash: what one step costs
// it with nobody to wait for). tokensPerDevice = batch * seq_len, P = devices in the run.
//   tokensPerS       = P * tokensPerDevice * (n - 1) * 1000 / (t[n-1] - t[0])   (the last n steps)
//   aloneTokensPerS  = tokensPerDevice * 1000 / mean(ownMs)                      (the same window)
//   ratio            = tokensPerS / aloneTokensPerS
//   suggestH         = ceil(10 X / C) in 2..16, X = the mean step minus this device's own C, when
//                      the group waits more than a quarter of what it computes (P > 1): the local
//                      steps after which the exchange adds at most ~10 % to a round
//                      (docs/VERIFICATION.md "Local steps"); at most 16, the largest H measured to
//                      reach one page's loss sooner at the default settings (TEST_RESULTS.md "Local
//                      steps judged by time to target": lan 1.49×, H 4 1.27×); else null
//   waitShare        = X / C (P > 1)
// -> {tokensPerS, aloneTokensPerS, ratio, suggestH, waitShare}; a value is null until it can be measured.
export function groupSpeed({ stepTimes, ownMs, tokensPerDevice, P }) {
  const n = stepTimes.length;
  const span = n > 1 ? stepTimes[n - 1] - stepTimes[0] : 0;
  const tokensPerS = span > 0 ? (P * tokensPerDevice * (n - 1) * 1000) / span : null;
  let own = 0;
  for (const ms of ownMs) own += ms;
  const aloneTokensPerS = ownMs.length && own > 0 ? (tokensPerDevice * 1000 * ownMs.length) / own : null;
  const ratio = tokensPerS !== null && aloneTokensPerS !== null ? tokensPerS / aloneTokensPerS : null;
  let suggestH = null, waitShare = null;
  if (ratio !== null && P > 1) {
    const C = own / ownMs.length, X = span / (n - 1) - C;
    waitShare = Math.max(0, X / C);
    if (X > C / 4) suggestH = Math.min(16, Math.max(2, Math.ceil((10 * X) / C)));
  }
  return { tokensPerS, aloneTokensPerS, ratio, suggestH, waitShare };
}

// the panel's words for it: "this group trains 1.9× as fast as this device alone"; in a run that
// exchanges every step (localSteps 1) and waits more than a quarter of its compute, the setting that would help
export function speedText(speed, P, localSteps = 1) {
  if (!speed || speed.ratio === null) return '–';
  if (P === 1) return `this device alone: ${Math.round(speed.tokensPerS).toLocaleString('en-US')} tokens/s`;
  const r = speed.ratio;
  const hint = localSteps === 1 && speed.suggestH !== null
    ? `; the exchange adds ${Math.round(100 * speed.waitShare)} % to each step here: local steps ${speed.suggestH} would hide it` : '';
  return `this group trains ${r >= 10 ? r.toFixed(0) : r.toFixed(1)}× as fast as this device alone `
    + `(${Math.round(speed.aloneTokensPerS).toLocaleString('en-US')} tokens/s alone)${hint}`;
}
