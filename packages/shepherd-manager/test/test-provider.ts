import { randomUUID } from 'node:crypto';
import type { Session } from '@bmaas/bmdb-controlloop';
import type { AgentBootMethod, PowerState } from '@bmaas/bmdb-model';
import { addProvided, newMachine } from '@bmaas/bmdb-model';
import { expect } from 'vitest';
import {
  type AcceptedPowerCommand,
  Availability,
  type CreateMachineRequest,
  type Machine,
  MachineNotFoundError,
  type PowerControl,
  type Provider,
} from '../src/index.js';

interface TestMachine extends Machine {
  id: string;
  availability: Availability;
  failed: boolean;
  agentBoot: AgentBootMethod;
}

/**
 * A provider like the original's provider_test.go dummy: `capacity` machines,
 * those created listed as used and the rest as fresh unused capacity on every
 * listing. Tests reach into `machines` to stage discrepancies and failures.
 * Its power control knows its machines, every one `On`, and counts power
 * cycles; {@link TestPower} is the one with states and failures to stage.
 */
export class TestProvider implements Provider, PowerControl {
  readonly type = 'TestProvider';
  readonly machines = new Map<string, TestMachine>();
  /** Provider IDs power-cycled, oldest first. */
  readonly powerCycles: string[] = [];
  readonly createAttempts: string[] = [];
  /** How often the machines were listed: a provisioner's passes. */
  listings = 0;
  /** Provider IDs whose creation fails. */
  readonly failCreation = new Set<string>();
  /** Address of every machine; by default 127.0.0.1 so a local sshd can stand in. */
  address = '127.0.0.1';
  /** How the agent of every machine created from now on arrives; tests change a machine's in `machines`. */
  agentBoot: AgentBootMethod = 'ssh';

  constructor(readonly capacity: number) {}

  async listMachines(): Promise<Machine[]> {
    this.listings++;
    const unused = Math.max(0, this.capacity - this.machines.size);
    return [
      ...this.machines.values(),
      ...Array.from({ length: unused }, () => ({
        id: `unused-${randomUUID()}`,
        address: undefined,
        availability: Availability.KnownUnused,
        failed: false,
        agentBoot: this.agentBoot,
        macs: [],
      })),
    ];
  }

  async getMachine(id: string): Promise<Machine> {
    const machine = this.machines.get(id);
    if (!machine) throw new MachineNotFoundError(this.type, id);
    return machine;
  }

  async createMachine(session: Session, request: CreateMachineRequest): Promise<Machine> {
    const id = `machine-${this.createAttempts.length}`;
    this.createAttempts.push(id);
    if (this.failCreation.has(id)) throw new Error(`provider refused to create ${id}`);
    const machine: TestMachine = {
      id,
      address: this.address,
      availability: Availability.KnownUsed,
      failed: false,
      agentBoot: this.agentBoot,
      macs: [],
    };
    await session.transact(async (q) => {
      const machineId = await newMachine(q);
      await addProvided(q, machineId, { provider: this.type, providerId: id, providerIpAddress: this.address });
    });
    expect(request.unusedMachine.availability).not.toBe(Availability.KnownUsed);
    this.machines.set(id, machine);
    return machine;
  }

  async readPowerState(id: string): Promise<PowerState> {
    this.#known(id);
    return 'On';
  }

  async powerOn(id: string): Promise<AcceptedPowerCommand> {
    this.#known(id);
    return { command: 'test on' };
  }

  async powerOff(id: string): Promise<AcceptedPowerCommand> {
    this.#known(id);
    return { command: 'test off' };
  }

  async powerCycle(id: string): Promise<AcceptedPowerCommand> {
    this.#known(id);
    this.powerCycles.push(id);
    return { command: 'test cycle' };
  }

  #known(id: string): void {
    if (!this.machines.has(id)) throw new MachineNotFoundError(this.type, id);
  }
}

/**
 * Power control over pretend machines, for the recoverer, power actions and
 * the power sync: a state per provider ID (`On` unless set), every action
 * recorded, failures to inject, and a gate to hold reads in flight.
 */
export class TestPower implements PowerControl {
  readonly states = new Map<string, PowerState>();
  /** `<action> <id>` for every action taken, oldest first. */
  readonly actions: string[] = [];
  /** Provider IDs whose every call fails with this message. */
  readonly failing = new Map<string, string>();
  /** Provider IDs whose power state reads (only) fail with this message. */
  readonly unreadable = new Map<string, string>();
  /** Reads in flight now, and the most at once. */
  inFlight = 0;
  peakInFlight = 0;
  reads = 0;
  /** While set, reads wait for it. */
  gate: Promise<void> | undefined;

  constructor(readonly type: string) {}

  async readPowerState(id: string): Promise<PowerState> {
    this.reads++;
    this.inFlight++;
    this.peakInFlight = Math.max(this.peakInFlight, this.inFlight);
    try {
      await this.gate;
      this.#check(id);
      const failure = this.unreadable.get(id);
      if (failure !== undefined) throw new Error(failure);
      return this.states.get(id) ?? 'On';
    } finally {
      this.inFlight--;
    }
  }

  async powerOn(id: string): Promise<AcceptedPowerCommand> {
    return this.#act('on', id, 'On');
  }

  async powerOff(id: string, options: { graceful: boolean }): Promise<AcceptedPowerCommand> {
    return this.#act(options.graceful ? 'shutdown' : 'off', id, 'Off');
  }

  async powerCycle(id: string): Promise<AcceptedPowerCommand> {
    if ((this.states.get(id) ?? 'On') === 'Off')
      throw new Error(`test BMC of ${id}: cannot cycle a machine that is off`);
    return this.#act('cycle', id, 'On');
  }

  #act(action: string, id: string, after: PowerState): AcceptedPowerCommand {
    this.#check(id);
    this.actions.push(`${action} ${id}`);
    this.states.set(id, after);
    return { command: `test ${action}` };
  }

  #check(id: string): void {
    const failure = this.failing.get(id);
    if (failure !== undefined) throw new Error(failure);
  }
}
