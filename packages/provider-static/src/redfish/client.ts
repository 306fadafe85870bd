import { Semaphore } from '@bmaas/common';
import { BmcUnsupportedError } from '../errors.js';
import { log } from '../internal/log.js';
import {
  type RedfishBootMode,
  type RedfishBootOverrideResult,
  type RedfishBootTarget,
  setBootOverrideOnce,
} from './boot-override.js';
import { clientSettings, type RedfishClientOptions, type RedfishClientSettings } from './client-settings.js';
import { actsTwice, chooseAllowed, chooseResetType, type ResetType } from './reset-types.js';
import { type RedfishSystem, readSystem } from './system.js';
import type { RedfishTarget } from './target.js';
import { RedfishTransport } from './transport.js';
import { ejectMedia, findCdMedia, insertMedia, mediaName } from './virtual-media.js';

/**
 * What the BMC accepted of a `#ComputerSystem.Reset` action, the one Redfish
 * action behind every power request (on, off and power cycle alike).
 */
export interface RedfishResetResult {
  readonly resetType: ResetType;
  /** The action URL it was posted to. */
  readonly target: string;
  /** The HTTP status of the acceptance: 200, 202 or 204. */
  readonly status: number;
}

/** What a virtual media request did. */
export interface RedfishMediaResult {
  /** The CD or DVD virtual media resource used. */
  readonly media: string;
  /** Whether an inserted image was ejected (before an insert, or as asked). */
  readonly ejected: boolean;
}

/**
 * A small Redfish client: just what power control of a machine through its
 * BMC takes (its power state, power on, off, and the reset that power-cycles
 * it), and what booting it into the agent takes (virtual media, a one-time
 * boot override). HTTP basic authentication; TLS verified against the system trust
 * store or the given CA; timeouts on every request; retries with jitter for
 * network errors, timeouts and 5xx (never 4xx), except that a restart is
 * posted again only when it never went out or the BMC answered 5xx; a bound
 * on resets in flight across the fleet.
 *
 * @example
 * ```ts
 * const client = new RedfishClient({ timeout: 10_000 });
 * const reset = await client.powerCycleSystem({ machine: 'node07', url: 'https://10.1.7.7/redfish/v1/Systems/1',
 *   username: 'admin', password: new Secret(secret) });
 * console.log(reset.resetType); // ForceRestart
 * await client.close();
 * ```
 */
export class RedfishClient {
  readonly settings: RedfishClientSettings;
  readonly #transport: RedfishTransport;
  readonly #slots: Semaphore;

  constructor(options: RedfishClientOptions = {}) {
    this.settings = clientSettings(options);
    this.#transport = new RedfishTransport(this.settings, options.ca);
    this.#slots = new Semaphore(this.settings.concurrency);
  }

  /**
   * Power-cycles the machine: reads its ComputerSystem, picks the reset type
   * (`resetType` if given and allowed, else the first of
   * {@link RESTART_PREFERENCE} the system allows) and posts the reset.
   *
   * @throws {@link BmcCredentialsError} on 401/403
   * @throws {@link BmcUnsupportedError} without a reset action or a usable reset type
   * @throws {@link BmcTimeoutError}, {@link BmcUnreachableError}, {@link RedfishHttpError} after retries
   * @throws {@link PowerOutcomeUnknownError} when the reset went out and no answer came (a timeout, a broken
   *   connection): the BMC may have reset the machine, so it is not posted again
   */
  async powerCycleSystem(
    target: RedfishTarget,
    options: { resetType?: ResetType | undefined } = {},
    signal?: AbortSignal,
  ): Promise<RedfishResetResult> {
    return this.#reset(target, (allowable) => chooseResetType(target, allowable, options.resetType), signal);
  }

  /**
   * Posts the first of `resetTypes` the system allows (the first of them
   * when it lists none): `['On', 'ForceOn']` to power it on, `['ForceOff']`
   * or `['GracefulShutdown']` to power it off.
   *
   * @param purpose - what the reset is for, for the error when none is allowed (`power on`)
   * @throws {@link BmcUnsupportedError} without a reset action or an allowed type of `resetTypes`
   * @throws {@link RedfishHttpError} when the BMC refuses (a 409 for a system in the wrong state, say)
   */
  async powerSystem(
    target: RedfishTarget,
    resetTypes: readonly ResetType[],
    purpose: string,
    signal?: AbortSignal,
  ): Promise<RedfishResetResult> {
    return this.#reset(target, (allowable) => chooseAllowed(target, allowable, resetTypes, purpose), signal);
  }

  async #reset(
    target: RedfishTarget,
    choose: (allowable: readonly string[] | undefined) => ResetType,
    signal: AbortSignal | undefined,
  ): Promise<RedfishResetResult> {
    const release = await this.#slots.acquire(signal);
    try {
      const system = await readSystem(this.#transport, target, signal);
      if (system.resetTarget === undefined) {
        throw new BmcUnsupportedError(
          target.machine,
          'redfish',
          target.url,
          'the ComputerSystem has no #ComputerSystem.Reset action with a target',
        );
      }
      const resetType = choose(system.allowableResetTypes);
      const status = await this.#transport.send(target, 'POST', system.resetTarget, { ResetType: resetType }, signal, {
        actsTwice: actsTwice(resetType) ? resetType : undefined,
      });
      log.redfish(
        'machine %s: %s accepted by %s (HTTP %d)',
        target.machine,
        resetType,
        system.resetTarget,
        status.status,
      );
      return { resetType, target: system.resetTarget, status: status.status };
    } finally {
      release();
    }
  }

  /**
   * Inserts `image` (an `http(s)://` URL of an ISO) into the system's CD or
   * DVD virtual media: the System's `VirtualMedia`, else its Manager's
   * (`Links.ManagedBy`). An image already inserted is ejected first.
   *
   * @throws {@link BmcUnsupportedError} when the BMC has no CD or DVD virtual media, or no InsertMedia action
   * @throws {@link BmcResponseError} when the BMC refuses the InsertMedia
   */
  async insertVirtualMedia(target: RedfishTarget, image: string, signal?: AbortSignal): Promise<RedfishMediaResult> {
    return this.#withSlot(signal, async () => {
      const media = await findCdMedia(
        this.#transport,
        target,
        await readSystem(this.#transport, target, signal),
        signal,
      );
      if (media.inserted) await ejectMedia(this.#transport, target, media, signal);
      await insertMedia(this.#transport, target, media, image, signal);
      log.redfish('machine %s: %s inserted in %s', target.machine, mediaName(image), media.url);
      return { media: media.url, ejected: media.inserted };
    });
  }

  /**
   * Ejects the image of the system's CD or DVD virtual media if it is
   * `image`: another one (inserted by a later boot), or one the BMC does
   * not name, stays, and `ejected` is false.
   *
   * @throws {@link BmcUnsupportedError} when the BMC has no CD or DVD virtual media, or no EjectMedia action
   */
  async ejectVirtualMedia(target: RedfishTarget, image: string, signal?: AbortSignal): Promise<RedfishMediaResult> {
    return this.#withSlot(signal, async () => {
      const media = await findCdMedia(
        this.#transport,
        target,
        await readSystem(this.#transport, target, signal),
        signal,
      );
      if (!media.inserted) return { media: media.url, ejected: false };
      if (media.image !== image) {
        log.redfish(
          'machine %s: %s holds %s, not %s: left in place',
          target.machine,
          media.url,
          media.image === undefined ? 'an image the BMC does not name' : mediaName(media.image),
          mediaName(image),
        );
        return { media: media.url, ejected: false };
      }
      await ejectMedia(this.#transport, target, media, signal);
      log.redfish('machine %s: ejected %s from %s', target.machine, mediaName(image), media.url);
      return { media: media.url, ejected: true };
    });
  }

  /**
   * Sets a one-time boot override to `bootTarget` in `options.mode` (else
   * the system's own mode), read back and set again while the BMC ignores
   * it (see {@link setBootOverrideOnce}).
   *
   * @throws {@link BootOverrideIgnoredError} when the BMC still had not kept it after the last attempt
   * @throws {@link BmcUnsupportedError} when the BMC does not allow `bootTarget`
   */
  async setBootOverrideOnce(
    target: RedfishTarget,
    bootTarget: RedfishBootTarget,
    options: { readonly mode?: RedfishBootMode | undefined } = {},
    signal?: AbortSignal,
  ): Promise<RedfishBootOverrideResult> {
    return this.#withSlot(signal, () => setBootOverrideOnce(this.#transport, target, bootTarget, options.mode, signal));
  }

  async #withSlot<T>(signal: AbortSignal | undefined, run: () => Promise<T>): Promise<T> {
    const release = await this.#slots.acquire(signal);
    try {
      return await run();
    } finally {
      release();
    }
  }

  /** Reads a ComputerSystem: its reset action, allowable reset types and power state. */
  async getSystem(target: RedfishTarget, signal?: AbortSignal): Promise<RedfishSystem> {
    const release = await this.#slots.acquire(signal);
    try {
      return await readSystem(this.#transport, target, signal);
    } finally {
      release();
    }
  }

  /** Closes idle connections. */
  async close(): Promise<void> {
    await this.#transport.close();
  }
}
