import { inspect } from 'node:util';

const REDACTED = '[redacted]';

/**
 * A credential that does not leak: `String()`, `JSON.stringify` and
 * `util.inspect` all render it as `[redacted]`. Only {@link Secret.reveal}
 * gives the value back, at the one place that needs it (a request header).
 * Providers keep their API keys and BMC passwords in it.
 *
 * @example
 * ```ts
 * const apiKey = new Secret(process.env.SHEPHERD_EQUINIX_API_KEY ?? '');
 * console.log({ apiKey }); // { apiKey: Secret([redacted]) }
 * ```
 */
export class Secret {
  readonly #value: string;

  constructor(value: string) {
    this.#value = value;
  }

  /** The secret value itself. Never log it. */
  reveal(): string {
    return this.#value;
  }

  /** Removes every occurrence of the secret from `text` (for messages that might echo it). */
  scrub(text: string): string {
    return this.#value.length > 0 ? text.split(this.#value).join(REDACTED) : text;
  }

  toString(): string {
    return REDACTED;
  }

  toJSON(): string {
    return REDACTED;
  }

  [inspect.custom](): string {
    return `Secret(${REDACTED})`;
  }
}
