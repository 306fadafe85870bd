import { readFile, stat } from 'node:fs/promises';
import { type BMDB, runRounds, type Session } from '@bmaas/bmdb-controlloop';
import {
  addProvided,
  newMachine,
  type PowerState,
  ProviderStatus,
  providedMachines,
  setAgentBootMethods,
  updateProviderStatus,
} from '@bmaas/bmdb-model';
import { describeError, Secret } from '@bmaas/common';
import {
  type AcceptedPowerCommand,
  type AgentBootControl,
  type AgentBootEnd,
  AgentBootError,
  type AgentBootMedia,
  type AgentBootStarted,
  Availability,
  type CreateMachineRequest,
  type Machine,
  MachineNotFoundError,
  type PowerControl,
  type Provider,
} from '@bmaas/shepherd-manager';
import type { Bmc } from './bmc.js';
import { BmcCredentialsError, NoBmcError, StaticProviderError, VirtualMediaUnsupportedError } from './errors.js';
import { log } from './internal/log.js';
import { type InventoryMachine, InventorySource } from './inventory.js';
import { IpmiBmc } from './ipmi/bmc.js';
import { IpmiClient } from './ipmi/client.js';
import { RedfishBmc } from './redfish/bmc.js';
import type { RedfishClient } from './redfish/client.js';
import type { ResetType } from './redfish/reset-types.js';
import { mediaName } from './redfish/virtual-media.js';

/** The provider name in the BMDB. */
export const STATIC_PROVIDER = 'Static';

/** A machine of the inventory as the provisioner sees it. */
export interface StaticMachine extends Machine {
  readonly id: string;
  /** `undefined` for a machine whose BMC boots its agent and whose inventory entry gives none. */
  readonly address: string | undefined;
  readonly location: string | undefined;
}

/** Fleet-wide BMC credentials, for machines whose inventory entry gives none. */
export interface DefaultBmcCredentials {
  /** `--redfish-username`, or `--ipmi-username` for IPMI BMCs. */
  readonly username?: string | undefined;
  /** `--redfish-password-file` (or `--ipmi-password-file`): read at each BMC request, so a rotated password is picked up. */
  readonly passwordFile?: string | undefined;
}

/** Options of the {@link StaticProvider}. */
export interface StaticProviderOptions {
  /** `--inventory`: a file path or an `http(s)://` URL, read on every `listMachines`. */
  readonly inventory: string | InventorySource;
  /** The Redfish client BMC requests go through (its concurrency bound is fleet-wide). */
  readonly redfish: RedfishClient;
  /**
   * The IPMI client commands to IPMI BMCs go through (its concurrency bound
   * is fleet-wide). Default: one with {@link IpmiClient}'s defaults, made
   * when the first IPMI BMC is used.
   */
  readonly ipmi?: IpmiClient | undefined;
  /** Credentials of BMCs whose inventory entry gives none (`--redfish-username`, `--redfish-password-file`). */
  readonly defaultCredentials?: DefaultBmcCredentials | undefined;
  /**
   * Credentials of IPMI BMCs whose inventory entry gives none
   * (`--ipmi-username`, `--ipmi-password-file`); each one unset here falls
   * back to {@link StaticProviderOptions.defaultCredentials}, as one BMC
   * account often serves both protocols.
   */
  readonly defaultIpmiCredentials?: DefaultBmcCredentials | undefined;
  /** `--redfish-reset-type`: power-cycle with this reset type instead of the preferred one the BMC allows. */
  readonly resetType?: ResetType | undefined;
}

/**
 * The shepherd's provider for machines the operator owns: every machine of
 * the inventory is the shepherd's (`PossiblyUsed`, settled against the BMDB
 * by the provisioner), and its power is controlled through its BMC (a
 * {@link Bmc}: Redfish, or IPMI through ipmitool): its power state is read,
 * and the power switched on, off and cycled, for the recoverer, the power
 * sync and the operator's power actions.
 *
 * The inventory is read anew on every `listMachines`, i.e. on every
 * reconciliation pass; a bad one fails that pass (nothing in the BMDB
 * changes) and the next pass reads it again. Changed addresses and locations
 * are written to the BMDB by {@link StaticProvider.run}.
 *
 * Machines whose inventory says `agentBoot` `virtual-media` or `network` get
 * their agent booted through their BMC ({@link StaticProvider.bootAgent}).
 */
export class StaticProvider implements Provider, PowerControl, AgentBootControl {
  /** The provider name in the BMDB: `Static`. */
  readonly type = STATIC_PROVIDER;
  readonly inventory: InventorySource;
  readonly #redfish: RedfishClient;
  #ipmi: IpmiClient | undefined;
  readonly #defaults: DefaultBmcCredentials;
  readonly #ipmiDefaults: DefaultBmcCredentials;
  readonly #resetType: ResetType | undefined;
  /** The last inventory read that was good: what power control and lookups go by between passes. */
  #lastGood: ReadonlyMap<string, InventoryMachine> | undefined;
  /** Bumped on every good read; `run` syncs when it changes. */
  #generation = 0;
  #wake: (() => void) | undefined;

  constructor(options: StaticProviderOptions) {
    this.inventory = typeof options.inventory === 'string' ? new InventorySource(options.inventory) : options.inventory;
    this.#redfish = options.redfish;
    this.#ipmi = options.ipmi;
    this.#defaults = options.defaultCredentials ?? {};
    const ipmi = options.defaultIpmiCredentials ?? {};
    this.#ipmiDefaults = {
      username: ipmi.username ?? this.#defaults.username,
      passwordFile: ipmi.passwordFile ?? this.#defaults.passwordFile,
    };
    this.#resetType = options.resetType;
  }

  /**
   * Every machine of the inventory, read now, each `PossiblyUsed`.
   *
   * @throws {@link InventoryError} when the inventory is unreadable or bad
   */
  async listMachines(signal?: AbortSignal): Promise<StaticMachine[]> {
    const machines = await this.inventory.read(signal);
    this.#lastGood = new Map(machines.map((m) => [m.id, m]));
    this.#generation++;
    this.#wake?.();
    log.inventory('%s: %d machine(s)', this.inventory.name, machines.length);
    return machines.map((m) => toMachine(m, Availability.PossiblyUsed));
  }

  /**
   * One machine by ID, from the last good inventory (read now if there is none yet).
   *
   * @throws {@link MachineNotFoundError} when the inventory does not have it
   */
  async getMachine(id: string, signal?: AbortSignal): Promise<StaticMachine> {
    return toMachine(await this.#entry(id, signal), Availability.PossiblyUsed);
  }

  /**
   * Records `request.unusedMachine` (an inventory machine the BMDB lacks) in
   * the BMDB: a new machine with its Provided tag (provider ID, address,
   * location, status `Unknown`). One already recorded gets its address and
   * location refreshed instead.
   */
  async createMachine(session: Session, request: CreateMachineRequest, signal?: AbortSignal): Promise<StaticMachine> {
    const { id } = request.unusedMachine;
    if (id === undefined) {
      throw new StaticProviderError(
        'createMachine: the machine has no ID; pass one StaticProvider.listMachines returned',
      );
    }
    const entry = await this.#entry(id, signal);
    // No address in the entry (its BMC boots its agent): a recorded one is kept.
    const facts = {
      ...(entry.address === undefined ? {} : { providerIpAddress: entry.address }),
      providerLocation: entry.location ?? null,
    };
    const machineId = await session.transact(async (q) => {
      if (await updateProviderStatus(q, STATIC_PROVIDER, id, facts)) return undefined;
      const machineId = await newMachine(q);
      await addProvided(q, machineId, {
        provider: STATIC_PROVIDER,
        providerId: id,
        providerStatus: ProviderStatus.Unknown,
        providerIpAddress: entry.address ?? null,
        providerLocation: entry.location ?? null,
      });
      // In the same transaction: a BMC-booted machine is never the SSH initializer's, not even for a moment.
      await setAgentBootMethods(q, STATIC_PROVIDER, new Map([[id, entry.agentBoot]]));
      return machineId;
    });
    if (machineId === undefined) log.provider('machine %s was already recorded; address and location refreshed', id);
    else log.provider('machine %s (%s) recorded as machine %s', id, entry.address ?? 'no address', machineId);
    return toMachine(entry, Availability.KnownUsed);
  }

  /** The machine's power state, from its BMC; `Unknown` when the BMC leaves it out. */
  async readPowerState(id: string, signal?: AbortSignal): Promise<PowerState> {
    return (await this.bmcOf(id, signal)).powerState(signal);
  }

  async powerOn(id: string, signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    return (await this.bmcOf(id, signal)).powerOn(signal);
  }

  async powerOff(
    id: string,
    options: { readonly graceful: boolean },
    signal?: AbortSignal,
  ): Promise<AcceptedPowerCommand> {
    return (await this.bmcOf(id, signal)).powerOff(options, signal);
  }

  /**
   * Power-cycles the machine through its BMC (see {@link Bmc.powerCycle}).
   *
   * @throws {@link MachineNotFoundError} when the inventory does not have it
   * @throws {@link NoBmcError} when its entry has no `bmc`
   * @throws {@link BmcCredentialsError} when no user name or password can be had, or the BMC refuses them
   * @throws {@link BmcError} subclasses (the protocol a field) when the BMC does not power-cycle it
   * @throws {@link PowerOutcomeUnknownError} when the power cycle went out and no answer came: it is not sent again
   */
  async powerCycle(id: string, signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    const accepted = await (await this.bmcOf(id, signal)).powerCycle(signal);
    log.provider('machine %s: BMC accepted %s', id, accepted.command);
    return accepted;
  }

  /**
   * Boots the machine into the agent through its BMC, as its inventory
   * entry's `agentBoot` says. `virtual-media` (Redfish): the ISO at
   * `media.isoUrl` inserted in the CD virtual media (what was inserted
   * ejected first), a one-time boot override to `Cd`; a BMC without usable
   * virtual media gets a network boot instead when the entry has MACs.
   * `network`: a one-time PXE boot (Redfish override `Pxe`, IPMI `chassis
   * bootdev pxe`). Each override is read back and set again while the BMC
   * ignores it. Then the machine is powered on when off, else power-cycled
   * (`ForceRestart`, `chassis power reset`).
   *
   * @throws {@link MachineNotFoundError} when the inventory does not have it
   * @throws {@link AgentBootError} when its entry says `agentBoot` `ssh`
   * @throws {@link NoBmcError}, {@link BmcCredentialsError} as {@link StaticProvider.bmcOf} does
   * @throws {@link VirtualMediaUnsupportedError} when its BMC has no virtual media and its entry no MACs
   * @throws {@link BmcResponseError} when the BMC refuses the InsertMedia
   * @throws {@link BootOverrideIgnoredError} when the BMC did not keep the boot override
   * @throws {@link BmcError} subclasses, {@link PowerOutcomeUnknownError} as the power requests do
   */
  async bootAgent(id: string, media: AgentBootMedia, signal?: AbortSignal): Promise<AgentBootStarted> {
    const entry = await this.#entry(id, signal);
    if (entry.agentBoot === 'ssh') {
      throw new AgentBootError(
        id,
        `the inventory ${this.inventory.name} says its agent arrives over SSH (agentBoot ssh, the default); set agentBoot to virtual-media or network`,
      );
    }
    const bmc = await this.bmcOf(id, signal);
    const steps: string[] = [];
    let method: AgentBootStarted['method'] = entry.agentBoot;
    if (method === 'virtual-media') {
      // The inventory allows virtual-media with a Redfish BMC only.
      if (!(bmc instanceof RedfishBmc)) throw new AgentBootError(id, 'virtual-media needs a Redfish BMC');
      const isoUrl = media.isoUrl;
      if (isoUrl === undefined) {
        throw new AgentBootError(id, 'virtual-media, but no ISO was made for this boot (its inventory said network)');
      }
      const inserted = await bmc.insertVirtualMedia(isoUrl, signal).catch((error: unknown) => {
        if (error instanceof VirtualMediaUnsupportedError && entry.macs.length > 0) return error;
        throw error;
      });
      if (inserted instanceof VirtualMediaUnsupportedError) {
        log.provider('machine %s: %s; network boot instead (its MACs are in the inventory)', id, inserted.message);
        steps.push(`no virtual media (${inserted.message}): network boot instead`);
        method = 'network';
      } else {
        steps.push(
          `${inserted.ejected ? 'ejected, then ' : ''}inserted ${mediaName(isoUrl)} in virtual media ${inserted.media}`,
        );
        steps.push(await bmc.setCdBootOnce(entry.bootMode, signal));
      }
    }
    if (method === 'network') steps.push(await bmc.setNetworkBootOnce(entry.bootMode, signal));
    const power = await bmc.powerState(signal);
    const accepted =
      power === 'Off' || power === 'PoweringOff' ? await bmc.powerOn(signal) : await bmc.powerCycle(signal);
    steps.push(accepted.command);
    const detail = steps.join('; ');
    log.provider('machine %s: agent boot (%s): %s', id, method, detail);
    return { method, detail };
  }

  /**
   * Ends one agent boot of the machine: a boot started with virtual media
   * has its image ejected if the CD still holds it (`boot.media.isoUrl`);
   * another boot's image, inserted since, stays. The method is the one the
   * boot started with, whatever the inventory says now. Nothing for a
   * network boot, nor when the BMC has no virtual media.
   *
   * @throws {@link MachineNotFoundError} when the inventory does not have it
   * @throws {@link BmcError} subclasses when the BMC does not eject
   */
  async endAgentBoot(id: string, boot: AgentBootEnd, signal?: AbortSignal): Promise<void> {
    const image = boot.media.isoUrl;
    if (boot.method !== 'virtual-media' || image === undefined) return;
    const bmc = await this.bmcOf(id, signal);
    if (!(bmc instanceof RedfishBmc)) return;
    try {
      await bmc.ejectVirtualMedia(image, signal);
    } catch (error) {
      if (!(error instanceof VirtualMediaUnsupportedError)) throw error;
    }
  }

  /**
   * The BMC of inventory machine `id`, with its credentials (a password
   * file is read now, so a rotated password is picked up).
   *
   * @throws {@link MachineNotFoundError} when the inventory does not have it
   * @throws {@link NoBmcError} when its entry has no `bmc`
   * @throws {@link BmcCredentialsError} when no user name or password can be had
   */
  async bmcOf(id: string, signal?: AbortSignal): Promise<Bmc> {
    const entry = await this.#entry(id, signal);
    const bmc = entry.bmc;
    if (bmc === undefined) throw new NoBmcError(id);
    const ipmi = bmc.protocol === 'ipmi';
    const protocol = ipmi ? 'ipmi' : 'redfish';
    const defaults = ipmi ? this.#ipmiDefaults : this.#defaults;
    const flags = ipmi ? '--ipmi' : '--redfish';
    const username = bmc.username ?? defaults.username;
    if (username === undefined) {
      throw new BmcCredentialsError(
        id,
        protocol,
        undefined,
        `no BMC user name: set bmc.username in the inventory or ${flags}-username`,
      );
    }
    let password: Secret;
    if (bmc.password?.kind === 'inline') password = bmc.password.password;
    else {
      const file = bmc.password?.path ?? defaults.passwordFile;
      if (file === undefined) {
        throw new BmcCredentialsError(
          id,
          protocol,
          undefined,
          `no BMC password: set bmc.passwordFile (or bmc.password) in the inventory or ${flags}-password-file`,
        );
      }
      password = await readPasswordFile(file, (problem) => new BmcCredentialsError(id, protocol, undefined, problem));
    }
    if (bmc.protocol === 'ipmi') {
      this.#ipmi ??= new IpmiClient();
      return new IpmiBmc(this.#ipmi, {
        machine: id,
        host: bmc.host,
        port: bmc.port,
        username,
        password,
        cipherSuite: bmc.cipherSuite,
      });
    }
    return new RedfishBmc(
      this.#redfish,
      { machine: id, url: bmc.url, username, password, insecure: bmc.insecure },
      { resetType: this.#resetType },
    );
  }

  /**
   * Writes addresses and locations the last good inventory has for machines
   * the BMDB holds with other ones, through `session`. Returns the provider
   * IDs it updated.
   */
  async syncAddresses(session: Session): Promise<string[]> {
    const inventory = this.#lastGood;
    if (inventory === undefined) return [];
    return session.transact(async (q) => {
      const updated: string[] = [];
      for (const machine of await providedMachines(q, STATIC_PROVIDER)) {
        const entry = inventory.get(machine.providerId);
        if (entry === undefined) continue;
        const location = entry.location ?? null;
        // An entry without an address (its BMC boots its agent) leaves the recorded one as it is.
        const address = entry.address ?? machine.providerIpAddress;
        if (machine.providerIpAddress === address && machine.providerLocation === location) continue;
        await updateProviderStatus(q, STATIC_PROVIDER, entry.id, {
          providerIpAddress: address,
          providerLocation: location,
        });
        log.provider(
          'machine %s: address %s -> %s, location %s -> %s (from the inventory)',
          entry.id,
          machine.providerIpAddress,
          address,
          machine.providerLocation,
          location,
        );
        updated.push(entry.id);
      }
      return updated;
    });
  }

  /**
   * After every good inventory read (the provisioner's passes), brings the
   * BMDB's addresses and locations in line with it; until `signal` aborts
   * (the rules of `runRounds`). A failed sync is logged and tried again.
   */
  async run(bmdb: BMDB, options: { signal: AbortSignal }): Promise<void> {
    let synced = 0;
    await runRounds(
      {
        signal: options.signal,
        session: { bmdb, processor: 'shepherd-static-inventory' },
        before: (signal) => this.#readSince(synced, signal),
        onFailure: (error, during) =>
          log.provider(
            during === 'close' ? 'closing session failed: %s' : 'syncing addresses from the inventory failed: %s',
            describeError(error),
          ),
      },
      (session) => {
        synced = this.#generation;
        return this.syncAddresses(session);
      },
    );
  }

  /** Resolves once the inventory was read again since read `synced`, or `signal` aborted. */
  async #readSince(synced: number, signal: AbortSignal): Promise<void> {
    while (this.#generation === synced && !signal.aborted) {
      await new Promise<void>((resolve) => {
        const done = () => {
          signal.removeEventListener('abort', done);
          this.#wake = undefined;
          resolve();
        };
        this.#wake = done;
        signal.addEventListener('abort', done, { once: true });
      });
    }
  }

  async #entry(id: string, signal: AbortSignal | undefined): Promise<InventoryMachine> {
    if (this.#lastGood === undefined) await this.listMachines(signal);
    const entry = this.#lastGood?.get(id);
    if (entry === undefined) throw new MachineNotFoundError(STATIC_PROVIDER, id);
    return entry;
  }
}

/**
 * A password file's first line. Refused when group or others may read it,
 * as OpenSSH refuses such private keys.
 */
export async function readPasswordFile(file: string, fail: (problem: string) => Error): Promise<Secret> {
  let text: string;
  let mode: number;
  try {
    [text, mode] = await Promise.all([readFile(file, 'utf8'), stat(file).then((s) => s.mode)]);
  } catch (error) {
    throw fail(
      `cannot read BMC password file ${file} (${(error as NodeJS.ErrnoException).code ?? describeError(error)})`,
    );
  }
  if ((mode & 0o077) !== 0) {
    throw fail(
      `BMC password file ${file} is readable by group or others (mode ${(mode & 0o777).toString(8).padStart(4, '0')}); chmod 600 it`,
    );
  }
  const password = text.split(/\r?\n/)[0] ?? '';
  if (password === '') throw fail(`BMC password file ${file} is empty`);
  return new Secret(password);
}

function toMachine(entry: InventoryMachine, availability: Availability): StaticMachine {
  return {
    id: entry.id,
    address: entry.address,
    location: entry.location,
    availability,
    failed: false,
    agentBoot: entry.agentBoot,
    macs: entry.macs,
  };
}
