/**
 * How long a failed (machine, process) pair stays out of its process's
 * selection queries. Intervals are whole seconds; the first failure waits
 * `initial`, each following failure `exponent` times longer, up to `maximum`.
 * A successful finish forgets the history.
 *
 * Durations are milliseconds. Out-of-range values are clamped rather than
 * rejected, as the original did: `exponent < 1` acts as 1, `initial < 1s` as
 * 1s, and `maximum < initial` as `initial`.
 */
export interface Backoff {
  /** First interval, in milliseconds. */
  readonly initial: number;
  /** Largest interval, in milliseconds. */
  readonly maximum: number;
  /** Growth factor from one failure to the next; 1 means a constant interval. */
  readonly exponent: number;
}

const SECOND = 1000;

/** The backoff with its out-of-range values clamped, in milliseconds. */
export function normalizeBackoff(backoff: Backoff): Backoff {
  const exponent = Number.isFinite(backoff.exponent) && backoff.exponent >= 1 ? backoff.exponent : 1;
  const initial = backoff.initial >= SECOND ? backoff.initial : SECOND;
  const maximum = backoff.maximum >= initial ? backoff.maximum : initial;
  return { initial, maximum, exponent };
}

/**
 * The next backoff interval in whole seconds.
 *
 * @param backoff - the policy; `undefined` repeats the previous interval (or 1 s)
 * @param previousSeconds - the interval of the last failure, if one is recorded
 */
export function nextBackoffSeconds(backoff: Backoff | undefined, previousSeconds: number | undefined): number {
  const previous = previousSeconds !== undefined && previousSeconds > 1 ? previousSeconds : 1;
  if (backoff === undefined) return Math.ceil(previous);
  const { initial, maximum, exponent } = normalizeBackoff(backoff);
  if (exponent === 1 || previousSeconds === undefined) return Math.ceil(initial / SECOND);
  const next = Math.min(previous * exponent * SECOND, maximum);
  // Rounding the product itself would drift on float noise (60 * 1.1 is
  // 66.00000000000001), so round to microseconds before taking the ceiling.
  return Math.max(1, Math.ceil(Math.round(next * 1000) / 1_000_000));
}
