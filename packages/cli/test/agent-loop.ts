import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FakeEquinixApi } from '@bmaas/provider-equinix/testing';
import { SshKey } from '@bmaas/shepherd-manager';
import type { TestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { startTestSshServer, type TestSshServer } from '../../../test/support/sshd.js';
import { agentHeartbeaters, killQuietly, runEquinixArgs, type Shepherd, shepherd, start } from './helpers.js';

const TEST_AGENT = path.resolve('packages/shepherd-manager/bin/test-agent.js');

/** A `shepherd server` of an {@link AgentLoop}, listening. */
export interface LoopServer {
  readonly process: Shepherd;
  readonly port: number;
  /** Its data directory, with the self-signed `server.crt` agents are given. */
  readonly dir: string;
}

/**
 * The whole loop on real parts, for the end-to-end tests: a migrated BMDB,
 * the fake Equinix API whose `machines` devices are all this host, reached
 * at the test sshd (a real OpenSSH server, or ssh2's where none is
 * installed) with a key of the loop's own, and the bundled test agent behind
 * a wrapper at `<dir>/agent` that sets its environment (sshd passes none on).
 * `shepherd server` and `shepherd run equinix` are started by the test, and
 * everything is stopped by {@link AgentLoop.close}.
 */
export class AgentLoop {
  readonly #running: Shepherd[] = [];

  private constructor(
    readonly db: TestDatabase,
    readonly dir: string,
    readonly keyPath: string,
    readonly sshd: TestSshServer,
    readonly api: FakeEquinixApi,
  ) {}

  /** Sets the loop up; `agentEnv` is the test agent's environment (given the loop's directory). */
  static async start(
    db: TestDatabase,
    options: { name: string; machines: number; agentEnv: (dir: string) => Record<string, string> },
  ): Promise<AgentLoop> {
    const dir = await mkdtemp(path.join(tmpdir(), `${options.name}-`));
    const migrated = await shepherd(['migrate', '--bmdb-url', db.url]);
    if (migrated.code !== 0) throw new Error(`shepherd migrate exited ${migrated.code}: ${migrated.stderr}`);
    const keyPath = path.join(dir, 'ssh_key');
    const key = await SshKey.loadOrGenerate(keyPath);
    const sshd = await startTestSshServer({ authorizedKeys: [key.authorizedKey] });
    console.log(`${options.name}: devices reach ${sshd.description}`);
    const api = await FakeEquinixApi.start({
      reservations: options.machines,
      publicIpv4: '127.0.0.1',
      provisioningReads: 0,
    });
    const env = Object.entries(options.agentEnv(dir))
      .map(([name, value]) => `export ${name}=${shellQuote(value)}\n`)
      .join('');
    await writeFile(path.join(dir, 'agent'), `#!/bin/sh\n${env}exec ${process.execPath} ${TEST_AGENT}\n`, {
      mode: 0o755,
    });
    return new AgentLoop(db, dir, keyPath, sshd, api);
  }

  /** Starts `shepherd server` on a free port, with its data directory under the loop's, once it listens. */
  async startServer(): Promise<LoopServer> {
    const port = await freePort();
    const dir = path.join(this.dir, 'server');
    const server = this.#start([
      'server',
      '--bmdb-url',
      this.db.url,
      '--data-dir',
      dir,
      '--listen',
      `127.0.0.1:${port}`,
    ]);
    await server.logged(/BMaaS server listening/);
    return { process: server, port, dir };
  }

  /**
   * Starts `shepherd run equinix` against the fake API: the initializer
   * starts the agent at `<dir>/agent` through the test sshd, one start at a
   * time (every "machine" shares that one file), and points it at `server`;
   * devices come and reboots settle at once. `flags` adds to those (the
   * recoverer's timeouts).
   */
  startRun(server: LoopServer, name: { label: string; devicePrefix: string }, flags: Record<string, string>): Shepherd {
    return this.#start(
      runEquinixArgs(this.api, name, {
        'bmdb-url': this.db.url,
        'ssh-key-path': this.keyPath,
        'agent-executable-path': path.join(this.dir, 'agent'),
        'agent-target-path': path.join(this.dir, 'agent-on-machine'),
        'agent-endpoint': `127.0.0.1:${server.port}`,
        'agent-endpoint-ca-certificate-path': path.join(server.dir, 'server.crt'),
        'agent-ssh-port': String(this.sshd.port),
        'agent-ssh-exec-timeout': '20s',
        'equinix-reboot-wait': '100ms',
        'provisioner-device-creation-rate': '1ms,100',
        'initializer-loop-parallelism': '1',
        'initializer-db-query-rate': '1ms,1000',
        'recoverer-db-query-rate': '50ms,10',
        ...flags,
      }),
      { SHEPHERD_EQUINIX_API_KEY: this.api.apiKey },
    );
  }

  /** The detached test agents heartbeating for the loop's machines, by machine ID. */
  heartbeaters(): Promise<Map<string, number>> {
    return agentHeartbeaters(this.db);
  }

  /** Kills the processes and the detached agents, stops the API and sshd, removes the directory. */
  async close(): Promise<void> {
    for (const running of this.#running) {
      running.child.kill('SIGKILL');
      await running.exited;
    }
    for (const pid of (await this.heartbeaters()).values()) killQuietly(pid);
    await this.api.close();
    await this.sshd.stop();
    await rm(this.dir, { recursive: true, force: true });
  }

  #start(args: readonly string[], env: Record<string, string> = {}): Shepherd {
    const started = start(args, env);
    this.#running.push(started);
    return started;
  }
}

function shellQuote(value: string): string {
  return `'${value.replaceAll("'", "'\\''")}'`;
}
