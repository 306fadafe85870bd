/** `grpc-timeout`: at most eight digits and a unit (hours, minutes, seconds, milli-, micro-, nanoseconds). */
const TIMEOUT = /^(\d{1,8})([HMSmun])$/;

const UNIT_MS: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1_000, m: 1, u: 1e-3, n: 1e-6 };

/** The milliseconds a `grpc-timeout` value gives the call, or `undefined` if it is no such value. */
export function parseGrpcTimeout(value: string): number | undefined {
  const match = TIMEOUT.exec(value);
  if (match === null) return undefined;
  return Number(match[1]) * (UNIT_MS[match[2] as string] as number);
}

/** Printable ASCII but '%': what `grpc-message` carries as it is. */
const VERBATIM = /^[\x20-\x24\x26-\x7e]*$/;

/**
 * `message` as `grpc-message` carries it: printable ASCII as it is, every
 * other byte of its UTF-8 (and '%') as %XX, as the gRPC spec says. Clients
 * decode it with decodeURI (grpc-js) or decodeURIComponent (connect), which
 * read this alike; encodeURIComponent's escapes of ':' or '/' would reach
 * grpc-js users undecoded.
 */
export function encodeGrpcMessage(message: string): string {
  if (VERBATIM.test(message)) return message;
  let encoded = '';
  for (const byte of Buffer.from(message, 'utf8')) {
    encoded +=
      byte >= 0x20 && byte <= 0x7e && byte !== 0x25
        ? String.fromCharCode(byte)
        : `%${byte.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return encoded;
}
