import { createHash } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import type { Session } from '@bmaas/bmdb-controlloop';
import type { AgentBootMethod, PowerState } from '@bmaas/bmdb-model';
import { addProvided, newMachine } from '@bmaas/bmdb-model';
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
  TakeoverResponseSchema,
} from '@bmaas/shepherd-manager';
import { FakeSshClient } from '@bmaas/shepherd-manager/testing';
import { create, toBinary } from '@bufbuild/protobuf';
import createDebug from 'debug';
import { DummyPower } from './dummy-power.js';

/** The fake's own steps, below the shepherd's events (the CLI's default logs leave them out). */
const detail = createDebug('shepherd:dummy:detail');

/** The provider name the dummy records its machines under. */
export const DUMMY_PROVIDER = 'Dummy';

/** Options of the {@link DummyProvider}. */
export interface DummyProviderOptions {
  /** Machines the provider can hand out (at most 16,777,215). */
  readonly capacity: number;
  /** Share (0–1) of agent starts that fail with an agent error. Default 0. */
  readonly agentFailureRate?: number;
  /** Share (0–1) of started agents that never send a heartbeat. Default 0. */
  readonly heartbeatFailureRate?: number;
  /** Source of randomness for agent failures (tests make it deterministic). Default `Math.random`. */
  readonly random?: () => number;
  /**
   * Milliseconds each fake agent start takes before it answers, as a real
   * upload and agent start would. Default 0 (answers at once).
   */
  readonly agentStartDuration?: number;
  /**
   * Told as each fake agent start begins and as it ends, whether or not the
   * shepherd is still waiting for it: what happened on the pretend machines,
   * independent of what the BMDB recorded (`shepherd run dummy
   * --dummy-agent-start-log` writes these to a file).
   */
  readonly onAgentStart?: (event: AgentStartEvent) => void;
  /** Milliseconds a simulated power change takes (`PoweringOn`/`PoweringOff` meanwhile). Default 0. */
  readonly powerTransition?: number;
  /**
   * How every pretend machine's agent arrives, as listed. Default `ssh` (the
   * fake agent's takeover); `virtual-media` or `network` make them machines
   * whose agent a (pretend) BMC boots, each `network` one with a MAC.
   */
  readonly agentBoot?: AgentBootMethod;
}

/** One fake agent start beginning or ending on a pretend machine. */
export interface AgentStartEvent {
  /** `begin` when the agent is run, `end` when it answered. */
  readonly phase: 'begin' | 'end';
  /** The BMDB machine ID the shepherd gave the agent. */
  readonly machineId: string | undefined;
  /** The machine's address, as dialed. */
  readonly address: string;
  /** At `end`: whether the agent started (`started`) or answered with a simulated failure (`failed`). */
  readonly outcome?: 'started' | 'failed';
  readonly at: Date;
}

/** The largest capacity: machine addresses are 10.0.0.1 onwards. */
const MAX_CAPACITY = 2 ** 24 - 1;
const ID_PREFIX = 'dummy-';

/**
 * A provider of pretend machines with a fixed capacity, and a fake agent to
 * go with them ({@link DummyProvider.sshClient}).
 *
 * It keeps no state of its own but its machines' simulated power: slot `i`
 * is always machine `dummy-<i>` at 10.x.y.z, and whether a slot is in use is
 * the BMDB's to say (every slot is listed `PossiblyUsed`). A shepherd
 * restarted over the same BMDB therefore carries on without a provider/BMDB
 * discrepancy. Its power control is simulated ({@link DummyPower}): each
 * process has its own, every machine `On` at start.
 */
export class DummyProvider implements Provider, PowerControl, AgentBootControl {
  readonly type = DUMMY_PROVIDER;
  readonly capacity: number;
  /** How every machine's agent arrives (the option `agentBoot`). */
  readonly agentBoot: AgentBootMethod;
  /** The pretend virtual media inserted now (or the network boot set up), by provider ID; an agent boot's end removes it. */
  readonly agentBootMedia = new Map<string, AgentBootMedia>();
  /** Power cycles made so far, by provider ID. */
  readonly powerCycles = new Map<string, number>();
  /** The fake agent: answers like the real one, failing `agentFailureRate` of starts. */
  readonly sshClient: FakeSshClient;
  /** The machines' simulated power. */
  readonly power: DummyPower;
  readonly #heartbeatFailureRate: number;

  constructor(options: DummyProviderOptions) {
    const { capacity } = options;
    if (!Number.isSafeInteger(capacity) || capacity < 0 || capacity > MAX_CAPACITY) {
      throw new RangeError(`dummy provider capacity must be a whole number 0–${MAX_CAPACITY}, got ${capacity}`);
    }
    this.capacity = capacity;
    this.agentBoot = options.agentBoot ?? 'ssh';
    const agentFailureRate = share(options.agentFailureRate ?? 0, 'agent failure rate');
    this.#heartbeatFailureRate = share(options.heartbeatFailureRate ?? 0, 'heartbeat failure rate');
    const random = options.random ?? Math.random;
    const startDuration = options.agentStartDuration ?? 0;
    if (!(startDuration >= 0) || !Number.isFinite(startDuration)) {
      throw new RangeError(`dummy provider agent start duration must be >= 0 ms, got ${startDuration}`);
    }
    this.power = new DummyPower(options.powerTransition ?? 0);
    const report = options.onAgentStart ?? (() => {});
    this.sshClient = new FakeSshClient({
      dial: (target) => {
        if (slotOfAddress(target.host, this.capacity) === undefined) {
          throw new Error(`no dummy machine at ${target.host}`);
        }
      },
      execute: async ({ target }) => {
        const machine = { machineId: target.machineId, address: target.host };
        report({ phase: 'begin', ...machine, at: new Date() });
        if (startDuration > 0) await delay(startDuration);
        const succeeds = random() >= agentFailureRate;
        report({ phase: 'end', ...machine, outcome: succeeds ? 'started' : 'failed', at: new Date() });
        if (succeeds) return undefined; // the fake agent's success
        detail('simulating a failed agent start on machine %s (%s)', target.machineId, target.host);
        const failure = create(TakeoverResponseSchema, {
          result: {
            case: 'error',
            value: { message: `simulated failure (dummy provider, agent failure rate ${agentFailureRate})` },
          },
        });
        return {
          stdout: toBinary(TakeoverResponseSchema, failure),
          stderr: new Uint8Array(),
          exitCode: 0,
          exitSignal: null,
        };
      },
    });
  }

  async listMachines(): Promise<Machine[]> {
    return Array.from({ length: this.capacity }, (_, slot) =>
      machineAt(slot, Availability.PossiblyUsed, this.agentBoot),
    );
  }

  async getMachine(id: string): Promise<Machine> {
    const slot = slotOfId(id, this.capacity);
    if (slot === undefined) throw new MachineNotFoundError(this.type, id);
    return machineAt(slot, Availability.KnownUsed, this.agentBoot);
  }

  async createMachine(session: Session, request: CreateMachineRequest): Promise<Machine> {
    const { id } = request.unusedMachine;
    const slot = id === undefined ? undefined : slotOfId(id, this.capacity);
    if (id === undefined || slot === undefined) throw new MachineNotFoundError(this.type, id ?? '(none)');
    const machine = machineAt(slot, Availability.KnownUsed, this.agentBoot);
    const machineId = await session.transact(async (q) => {
      const created = await newMachine(q);
      await addProvided(q, created, {
        provider: this.type,
        providerId: id,
        providerIpAddress: machine.address ?? null,
        providerLocation: 'dummy-1',
        providerStatus: 'Running',
      });
      return created;
    });
    detail('created machine %s (provider ID %s, %s)', machineId, id, machine.address);
    return machine;
  }

  async readPowerState(id: string): Promise<PowerState> {
    return this.power.state(this.#known(id));
  }

  async powerOn(id: string): Promise<AcceptedPowerCommand> {
    this.power.on(this.#known(id));
    detail('powered on %s', id);
    return { command: 'simulated power on' };
  }

  async powerOff(id: string, options: { readonly graceful: boolean }): Promise<AcceptedPowerCommand> {
    this.power.off(this.#known(id));
    detail('powered off %s%s', id, options.graceful ? ' (gracefully)' : '');
    return { command: options.graceful ? 'simulated shutdown' : 'simulated power off' };
  }

  /**
   * Power-cycles the pretend machine (counted in `powerCycles`).
   *
   * @throws Error when the machine is (simulated) off
   */
  async powerCycle(id: string): Promise<AcceptedPowerCommand> {
    this.power.cycle(this.#known(id));
    this.powerCycles.set(id, (this.powerCycles.get(id) ?? 0) + 1);
    detail('power-cycled %s', id);
    return { command: 'simulated power cycle' };
  }

  /**
   * A pretend agent boot: the media is kept in {@link DummyProvider.agentBootMedia},
   * and the machine powered on (when off) or power-cycled. No agent comes of
   * it: a test enrolls one for the machine.
   *
   * @throws {@link AgentBootError} when the machines take their agent over SSH (`agentBoot` left `ssh`)
   */
  async bootAgent(id: string, media: AgentBootMedia): Promise<AgentBootStarted> {
    this.#known(id);
    const method = this.agentBoot;
    if (method === 'ssh') {
      throw new AgentBootError(id, "the dummy provider's machines take their agent over SSH (agentBoot ssh)");
    }
    this.agentBootMedia.set(id, media);
    const off = this.power.state(id) === 'Off';
    const power = off ? await this.powerOn(id) : await this.powerCycle(id);
    // The media's URL is never shown: its path keeps the boot's token unguessable.
    const how = method === 'virtual-media' ? 'simulated virtual media' : 'simulated network boot';
    detail('agent boot of %s: %s; %s', id, how, power.command);
    return { method, detail: `${how}; ${power.command}` };
  }

  /** Ends a pretend agent boot: its media is removed if it is this boot's (another boot's stays). */
  async endAgentBoot(id: string, boot: AgentBootEnd): Promise<void> {
    if (this.agentBootMedia.get(this.#known(id))?.isoUrl === boot.media.isoUrl) this.agentBootMedia.delete(id);
  }

  #known(id: string): string {
    if (slotOfId(id, this.capacity) === undefined) throw new MachineNotFoundError(this.type, id);
    return id;
  }

  /**
   * Whether the agent started on `machineId` at `startedAt` heartbeats. Fixed
   * per start (a hash, not a coin flip), so every heartbeat round and every
   * restart agrees; a restarted agent gets a new chance.
   */
  agentHeartbeats(machineId: string, startedAt: Date): boolean {
    const digest = createHash('sha256').update(`${machineId}/${startedAt.toISOString()}`).digest();
    return digest.readUInt32BE(0) / 2 ** 32 >= this.#heartbeatFailureRate;
  }
}

function machineAt(slot: number, availability: Availability, agentBoot: AgentBootMethod): Machine {
  const n = slot + 1;
  const bytes = [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  return {
    id: `${ID_PREFIX}${String(slot).padStart(6, '0')}`,
    address: `10.${bytes.join('.')}`,
    availability,
    failed: false,
    agentBoot,
    // A locally administered MAC per slot, for a pretend network boot.
    macs:
      agentBoot === 'network'
        ? [['02', '00', '0a', ...bytes.map((b) => b.toString(16).padStart(2, '0'))].join(':')]
        : [],
  };
}

function slotOfId(id: string, capacity: number): number | undefined {
  if (!id.startsWith(ID_PREFIX)) return undefined;
  const digits = id.slice(ID_PREFIX.length);
  if (!/^\d{6,}$/.test(digits)) return undefined;
  const slot = Number(digits);
  return slot < capacity ? slot : undefined;
}

function slotOfAddress(address: string, capacity: number): number | undefined {
  const octets = address.split('.').map(Number);
  if (octets.length !== 4 || octets[0] !== 10 || octets.some((o) => !Number.isInteger(o) || o < 0 || o > 255)) {
    return undefined;
  }
  const [, a = 0, b = 0, c = 0] = octets;
  const slot = ((a << 16) | (b << 8) | c) - 1;
  return slot >= 0 && slot < capacity ? slot : undefined;
}

function share(value: number, what: string): number {
  if (!(value >= 0 && value <= 1)) throw new RangeError(`dummy provider ${what} must be between 0 and 1, got ${value}`);
  return value;
}
