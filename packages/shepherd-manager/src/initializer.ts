import type { Database } from '@bmaas/bmdb-controlloop';
import {
  type Backoff,
  type BMDB,
  type ControlLoop,
  type ControlLoopOptions,
  runControlLoop,
  type Selection,
  type Task,
} from '@bmaas/bmdb-controlloop';
import { agentStartSelection, Process, type ProvidedMachine } from '@bmaas/bmdb-model';
import type { Kysely } from 'kysely';
import { encodeTakeoverInit, parseTakeoverResponse, type TakeoverInitParams } from './agent-protocol.js';
import { detail, log } from './internal.js';
import { type Provider, ShepherdError } from './provider.js';
import type { SshClient, SshTarget } from './ssh-client.js';

/** How the initializer deploys the agent. */
export interface InitializerOptions {
  /** The agent executable, uploaded to every machine. */
  readonly agentExecutable: Uint8Array;
  /** Where the agent is uploaded to and run from on the machine. Default `/root/agent`. */
  readonly agentTargetPath?: string;
  /** Address of the BMaaS endpoint the agent connects to (`TakeoverInit.bmaas_endpoint`). */
  readonly agentEndpoint: string;
  /** DER X.509 CA certificate of the endpoint; absent, the agent trusts its system CAs. */
  readonly agentEndpointCaCertificate?: Uint8Array;
  /** Opens SSH connections (an `Ssh2Client` with the shepherd's key and SSH user, or a fake). */
  readonly sshClient: SshClient;
  /** SSH port on the machines. Default 22. */
  readonly sshPort?: number;
  /** Connect, handshake and authentication, in milliseconds. Default 2 s. */
  readonly sshConnectTimeout?: number;
  /** Upload and run of the agent together, in milliseconds. Default 60 s. */
  readonly sshExecTimeout?: number;
}

/** How soon a machine the provider has no address for yet is looked at again. */
const NOT_READY_BACKOFF: Backoff = { initial: 30_000, maximum: 30_000, exponent: 1 };

/** The agent ran but did not start: it exited non-zero or was killed. */
export class AgentExecutionError extends ShepherdError {
  override name = 'AgentExecutionError';
  constructor(
    readonly machineId: string,
    readonly exitCode: number | null,
    readonly exitSignal: string | null,
    readonly stderr: string,
  ) {
    const how = exitSignal ? `was killed by signal ${exitSignal}` : `exited with status ${exitCode}`;
    super(`agent on machine ${machineId} ${how}${stderr ? `: ${stderr.slice(-500)}` : ''}`);
  }
}

/** The machine cannot be reached: the provider has no address for it. */
export class NoAddressError extends ShepherdError {
  override name = 'NoAddressError';
  constructor(
    readonly machineId: string,
    readonly providerId: string,
  ) {
    super(`machine ${machineId} (provider ID ${providerId}) has no address to reach it at`);
  }
}

/**
 * Starts the agent on provided machines that do not run it yet (process
 * `ShepherdAgentStart`): SSH in, upload the agent, run it with a
 * `TakeoverInit` on stdin, check its `TakeoverResponse`, and record
 * AgentStarted with the agent's key. Failures back off 5 min → 4 h × 1.2.
 */
export class Initializer implements ControlLoop<ProvidedMachine> {
  readonly process = Process.ShepherdAgentStart;
  readonly processor = 'shepherd-initializer';
  readonly defaultBackoff: Backoff = { initial: 5 * 60_000, maximum: 4 * 3_600_000, exponent: 1.2 };

  readonly #targetPath: string;
  readonly #port: number;
  readonly #connectTimeout: number;
  readonly #execTimeout: number;

  constructor(
    private readonly provider: Provider,
    private readonly options: InitializerOptions,
  ) {
    if (options.agentExecutable.length === 0) throw new RangeError('initializer: the agent executable is empty');
    if (!options.agentEndpoint) throw new RangeError('initializer: the agent endpoint must be set');
    this.#targetPath = options.agentTargetPath ?? '/root/agent';
    if (!this.#targetPath.startsWith('/')) {
      throw new RangeError(
        `initializer: the agent target path must be absolute, got ${JSON.stringify(this.#targetPath)}`,
      );
    }
    this.#port = options.sshPort ?? 22;
    if (!Number.isInteger(this.#port) || this.#port < 1 || this.#port > 65535) {
      throw new RangeError(`initializer: SSH port must be 1-65535, got ${this.#port}`);
    }
    this.#connectTimeout = positive(options.sshConnectTimeout ?? 2_000, 'SSH connect timeout');
    this.#execTimeout = positive(options.sshExecTimeout ?? 60_000, 'SSH exec timeout');
  }

  /** Runs the initializer until `options.signal` aborts (see `runControlLoop`). */
  run(bmdb: BMDB, options: ControlLoopOptions): Promise<void> {
    return runControlLoop(bmdb, this, options);
  }

  /** Claimed from in one statement; parallel workers skip each other's machines. */
  selectMachines(q: Kysely<Database>): Selection<ProvidedMachine> {
    return agentStartSelection(q, { provider: this.provider.type });
  }

  async processMachine(task: Task<ProvidedMachine>): Promise<void> {
    const { machineId, providerId } = task.candidate;
    const machine = await this.provider.getMachine(providerId, task.signal);
    if (!machine.address) {
      // Still coming up at the provider: no failure of the agent, so look again soon.
      task.backoff = NOT_READY_BACKOFF;
      throw new NoAddressError(machineId, providerId);
    }
    detail.initializer('starting agent on machine %s (provider ID %s, %s)', machineId, providerId, machine.address);
    const key = await this.startAgent({ host: machine.address, port: this.#port, machineId }, task.signal);
    // The agent runs now; the library records it through a brief database
    // outage, in one statement shared with other workers' finishes.
    await task.work.finish({ set: { agentStarted: { publicKey: key } } });
    log.initializer('agent started on machine %s (provider ID %s)', machineId, providerId);
    detail.initializer('agent key of machine %s: %s', machineId, Buffer.from(key).toString('hex'));
  }

  /**
   * Deploys and runs the agent on `target`, returning the agent's public key.
   * The connect timeout bounds the dial; the exec timeout the upload and run.
   */
  async startAgent(target: SshTarget & { machineId: string }, signal: AbortSignal): Promise<Uint8Array> {
    const init: TakeoverInitParams = {
      machineId: target.machineId,
      bmaasEndpoint: this.options.agentEndpoint,
      caCertificate: this.options.agentEndpointCaCertificate,
    };
    const connection = await this.options.sshClient.dial(target, { connectTimeout: this.#connectTimeout, signal });
    const execTimeout = new AbortController();
    const timer = setTimeout(
      () => execTimeout.abort(new Error(`exec timeout of ${this.#execTimeout} ms (upload and run) passed`)),
      this.#execTimeout,
    );
    try {
      const execSignal = AbortSignal.any([signal, execTimeout.signal]);
      await connection.upload(this.#targetPath, this.options.agentExecutable, execSignal);
      const result = await connection.execute(this.#targetPath, encodeTakeoverInit(init), execSignal);
      const stderr = Buffer.from(result.stderr).toString('utf8').trim();
      if (stderr) log.initializer('agent stderr on machine %s: %s', target.machineId, stderr);
      if (result.exitCode !== 0) {
        throw new AgentExecutionError(target.machineId, result.exitCode, result.exitSignal, stderr);
      }
      const takeover = parseTakeoverResponse(result.stdout, init);
      for (const warning of takeover.warnings) {
        log.initializer('agent warning on machine %s: %s', target.machineId, warning);
      }
      return takeover.key;
    } finally {
      clearTimeout(timer);
      await connection.close();
    }
  }
}

function positive(ms: number, what: string): number {
  if (!(ms > 0) || !Number.isFinite(ms)) throw new RangeError(`initializer: ${what} must be > 0, got ${ms}ms`);
  return ms;
}
