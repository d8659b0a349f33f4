// Bit identity of float64 values, the comparison every gate and test makes: the same bits but
// for NaN's payload (+0 and -0 differ; every NaN equals every NaN).
export const sameBits = (a, b) => Object.is(a, b) || (a !== a && b !== b);

// the first index where two arrays' values differ in bits, or -1
export function firstDiff(got, want) {
  for (let i = 0; i < want.length; i++) if (!sameBits(got[i], want[i])) return i;
  return -1;
}
