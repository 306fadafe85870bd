import type { EquinixClient } from '../api/client.js';
import { keyMaterial, sameKey } from '../internal/authorized-key.js';
import { log } from '../internal/log.js';

/**
 * The shepherd's SSH key as a project key: looked up by label, added when
 * missing, replaced when the project holds another key under that label.
 * The key's ID is remembered after the first success until
 * {@link ProjectSshKey.forget}.
 */
export class ProjectSshKey {
  #id: Promise<string> | undefined;

  constructor(
    private readonly client: EquinixClient,
    private readonly projectId: string,
    readonly label: string,
    readonly publicKey: string,
  ) {
    if (label === '') throw new TypeError('the SSH key label must not be empty');
    if (keyMaterial(publicKey) === undefined) {
      throw new TypeError(`the shepherd's SSH public key is not in authorized_keys form: ${JSON.stringify(publicKey)}`);
    }
  }

  /** The project key's ID, creating or updating the key first if needed. */
  ensure(signal?: AbortSignal): Promise<string> {
    if (!this.#id) {
      const ensuring = this.#ensure(signal);
      this.#id = ensuring;
      ensuring.catch(() => {
        if (this.#id === ensuring) this.#id = undefined;
      });
    }
    return this.#id;
  }

  /** Forgets the remembered ID (the key may have been removed from the project). */
  forget(): void {
    this.#id = undefined;
  }

  async #ensure(signal: AbortSignal | undefined): Promise<string> {
    const keys = await this.client.listSshKeys(this.projectId, signal);
    const existing = keys.find((key) => key.label === this.label);
    const wanted = { label: this.label, key: this.publicKey.trim() };
    if (!existing) {
      const created = await this.client.createSshKey(this.projectId, wanted, signal);
      log.provider('added SSH key %s (%s) to project %s', created.id, this.label, this.projectId);
      return created.id;
    }
    if (!sameKey(existing.key, this.publicKey)) {
      await this.client.updateSshKey(existing.id, wanted, signal);
      log.provider(
        'replaced SSH key %s (%s) in project %s with the shepherd key',
        existing.id,
        this.label,
        this.projectId,
      );
    }
    return existing.id;
  }
}
