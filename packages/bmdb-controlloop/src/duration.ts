import { InvalidSettingError } from './errors.js';

const UNIT_MS: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  µs: 1e-3,
  μs: 1e-3,
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};

const EXPECTED = "a Go duration such as '300ms', '1.5s', '2m' or '1h30m' (units ns, us, ms, s, m, h)";

/**
 * Parses a duration in Go's syntax (`300ms`, `1.5s`, `2h45m`, `0`) into
 * milliseconds. Negative durations are rejected: nothing here waits for a
 * negative time.
 *
 * @throws {@link InvalidSettingError} naming the value when it is malformed.
 */
export function parseDuration(value: string): number {
  const text = value.trim();
  if (text === '0') return 0;
  const part = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/y;
  let total = 0;
  let offset = 0;
  while (offset < text.length) {
    part.lastIndex = offset;
    const match = part.exec(text);
    if (!match) throw new InvalidSettingError(value, EXPECTED);
    const [whole, amount, unit] = match as unknown as [string, string, string];
    total += Number(amount) * (UNIT_MS[unit] as number);
    offset += whole.length;
  }
  if (offset === 0 || !Number.isFinite(total)) throw new InvalidSettingError(value, EXPECTED);
  return total;
}

/** Renders milliseconds the way Go prints a duration (`1m30s`, `250ms`). */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1000) return `${Number(ms.toFixed(3))}ms`;
  let rest = ms / 1000;
  const hours = Math.floor(rest / 3600);
  rest -= hours * 3600;
  const minutes = Math.floor(rest / 60);
  rest -= minutes * 60;
  const seconds = Number(rest.toFixed(3));
  return `${hours ? `${hours}h` : ''}${hours || minutes ? `${minutes}m` : ''}${seconds}s`;
}
