import { inspect } from 'node:util';

const REDACTED = '[redacted]';

/**
 * A BMC password that does not leak: `String()`, `JSON.stringify` and
 * `util.inspect` all render it as `[redacted]`; only {@link Password.reveal}
 * gives it back, where the Authorization header is made.
 */
export class Password {
  readonly #value: string;

  constructor(value: string) {
    this.#value = value;
  }

  /** The password itself. Never log it. */
  reveal(): string {
    return this.#value;
  }

  /** `text` with every occurrence of the password masked (for messages that might echo it). */
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
    return `Password(${REDACTED})`;
  }
}
