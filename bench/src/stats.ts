/** Summary statistics of a set of samples. */
export interface Summary {
  readonly median: number;
  readonly min: number;
  readonly max: number;
}

/** Percentiles of a latency distribution, in milliseconds. */
export interface Latency {
  readonly p50: number;
  readonly p99: number;
  readonly samples: number;
}

function sorted(values: readonly number[]): number[] {
  if (values.length === 0) throw new RangeError('no samples');
  return [...values].sort((a, b) => a - b);
}

/** The `p`-th percentile (0–100) by the nearest-rank method. */
export function percentile(values: readonly number[], p: number): number {
  const ordered = sorted(values);
  const rank = Math.max(1, Math.ceil((p / 100) * ordered.length));
  return ordered[rank - 1] as number;
}

/** Median with min and max: how the rounds of one figure spread. */
export function summarize(values: readonly number[]): Summary {
  const ordered = sorted(values);
  return { median: percentile(ordered, 50), min: ordered[0] as number, max: ordered.at(-1) as number };
}

export function latency(values: readonly number[]): Latency {
  return { p50: percentile(values, 50), p99: percentile(values, 99), samples: values.length };
}

/** Milliseconds since `start` (a `performance.now()` reading). */
export function since(start: number): number {
  return performance.now() - start;
}
