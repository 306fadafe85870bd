import { randomBytes } from 'node:crypto';
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { describeError } from '@bmaas/common';
import { ShepherdError } from './provider.js';

/**
 * Remembers the first host key fingerprint seen per machine (trust on first
 * use), so that a machine whose host key later changes is refused rather
 * than handed the agent. Keys are machine IDs, or `host:port` for targets
 * without one.
 */
export interface HostKeyPinStore {
  /** The fingerprint pinned for `id`, if any. */
  get(id: string): Promise<string | undefined>;
  /**
   * Pins `fingerprint` for `id` unless a fingerprint is pinned already, in one
   * step. Resolves to the fingerprint pinned for `id` after the call.
   */
  pin(id: string, fingerprint: string): Promise<string>;
  /** Forgets the pin of `id`, e.g. after the machine was reinstalled on purpose. */
  unpin(id: string): Promise<void>;
}

/** A pin store file cannot be read, parsed or written. */
export class HostKeyStoreError extends ShepherdError {
  override name = 'HostKeyStoreError';
  constructor(
    readonly path: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(`host key pin store ${path}: ${problem}`, options);
  }
}

/** Pins kept in memory, for one process's lifetime (and tests). */
export class MemoryHostKeyPinStore implements HostKeyPinStore {
  readonly #pins = new Map<string, string>();

  async get(id: string): Promise<string | undefined> {
    return this.#pins.get(id);
  }

  async pin(id: string, fingerprint: string): Promise<string> {
    const pinned = this.#pins.get(id);
    if (pinned !== undefined) return pinned;
    this.#pins.set(id, fingerprint);
    return fingerprint;
  }

  async unpin(id: string): Promise<void> {
    this.#pins.delete(id);
  }
}

/**
 * Pins kept in a JSON file (`{"<id>": "SHA256:…"}`), created on the first
 * pin. Writes replace the file atomically. One process should own a file:
 * the file is read once, and concurrent writers would lose each other's pins.
 */
export class JsonFileHostKeyPinStore implements HostKeyPinStore {
  #pins: Promise<Map<string, string>> | undefined;
  // Serializes read-modify-write cycles so concurrent pins cannot interleave.
  #queue: Promise<unknown> = Promise.resolve();

  constructor(readonly path: string) {}

  async get(id: string): Promise<string | undefined> {
    return (await this.#load()).get(id);
  }

  pin(id: string, fingerprint: string): Promise<string> {
    return this.#serialized(async () => {
      const pins = await this.#load();
      const pinned = pins.get(id);
      if (pinned !== undefined) return pinned;
      pins.set(id, fingerprint);
      await this.#save(pins);
      return fingerprint;
    });
  }

  unpin(id: string): Promise<void> {
    return this.#serialized(async () => {
      const pins = await this.#load();
      if (pins.delete(id)) await this.#save(pins);
    });
  }

  #serialized<T>(operation: () => Promise<T>): Promise<T> {
    const result = this.#queue.then(operation);
    this.#queue = result.catch(() => {});
    return result;
  }

  #load(): Promise<Map<string, string>> {
    this.#pins ??= readPins(this.path).catch((error: unknown) => {
      this.#pins = undefined;
      throw error;
    });
    return this.#pins;
  }

  async #save(pins: Map<string, string>): Promise<void> {
    const temporary = `${this.path}.${randomBytes(6).toString('hex')}.tmp`;
    try {
      await mkdir(dirname(this.path), { recursive: true });
      await writeFile(temporary, `${JSON.stringify(Object.fromEntries(pins), null, 2)}\n`, { mode: 0o600 });
      await rename(temporary, this.path);
    } catch (error) {
      await rm(temporary, { force: true });
      throw new HostKeyStoreError(this.path, `cannot write: ${describeError(error)}`, { cause: error });
    }
  }
}

async function readPins(path: string): Promise<Map<string, string>> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    if (error instanceof Error && 'code' in error && error.code === 'ENOENT') return new Map();
    throw new HostKeyStoreError(path, `cannot read: ${describeError(error)}`, { cause: error });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new HostKeyStoreError(path, `is not JSON: ${describeError(error)}`, { cause: error });
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw new HostKeyStoreError(path, 'is not a JSON object of ID → fingerprint');
  }
  const pins = new Map<string, string>();
  for (const [id, fingerprint] of Object.entries(parsed)) {
    if (typeof fingerprint !== 'string') {
      throw new HostKeyStoreError(path, `pin of ${JSON.stringify(id)} is not a fingerprint string`);
    }
    pins.set(id, fingerprint);
  }
  return pins;
}
