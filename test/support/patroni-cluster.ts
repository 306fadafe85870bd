/**
 * A highly available BMDB as operators run one, on loopback: etcd, three
 * PostgreSQL 15 nodes managed by Patroni (leader election in etcd, streaming
 * replication, optionally synchronous) and HAProxy routing to the leader by
 * Patroni's REST checks. For the failover tests (test/ha/) and the failover
 * bench; the configuration written here is the one the README shows.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { freePort } from './ports.js';
import { eventually } from './wait.js';

const run = promisify(execFile);

/** Debian's PostgreSQL 15 (package postgresql-15), which Patroni runs. */
const POSTGRES_BIN = '/usr/lib/postgresql/15/bin';
/** Patroni's defaults, kept: the failover these tests measure is the one operators get. */
const TTL_SECONDS = 30;
const LOOP_WAIT_SECONDS = 10;
const RETRY_TIMEOUT_SECONDS = 10;

/** Why the cluster cannot be run here: a tool missing, or no postgres user to run PostgreSQL as root. */
export function patroniClusterUnavailable(): string | undefined {
  const tools = { etcd: '/usr/bin/etcd', patroni: '/usr/bin/patroni', haproxy: '/usr/sbin/haproxy' };
  for (const [name, file] of Object.entries(tools)) if (!existsSync(file)) return `${name} is not installed (${file})`;
  if (!existsSync(path.join(POSTGRES_BIN, 'postgres'))) return `PostgreSQL 15 is not installed (${POSTGRES_BIN})`;
  return undefined;
}

/** One Patroni-managed PostgreSQL node. */
export interface PatroniNode {
  readonly name: string;
  readonly dir: string;
  /** PostgreSQL's port. */
  readonly port: number;
  /** Patroni's REST API port (HAProxy's check). */
  readonly restPort: number;
}

/** A member as Patroni's REST API lists it (`GET /cluster`). */
export interface PatroniMember {
  readonly name: string;
  readonly role: 'leader' | 'sync_standby' | 'replica' | 'standby_leader';
  readonly state: string;
  readonly timeline?: number;
  readonly port: number;
}

/** The leader killed, and when. */
export interface LeaderKill {
  readonly name: string;
  /** Date.now() right after the kill signals were sent. */
  readonly at: number;
}

export interface PatroniClusterOptions {
  /** Patroni's `synchronous_mode`: a commit returns once the synchronous standby has it. */
  readonly synchronous: boolean;
  /** Members; 3 unless given. */
  readonly nodes?: number;
  /**
   * Patroni's `maximum_lag_on_failover` in bytes (its default 1 MiB unless
   * given): a standby further behind the leader's last known position is
   * not promoted.
   */
  readonly maximumLagOnFailover?: number;
}

/**
 * etcd, Patroni nodes and HAProxy, each a process group of its own, all
 * stopped by {@link PatroniCluster.stop} (and SIGKILLed if the test process
 * exits first). Trust authentication on 127.0.0.1; the data is in a
 * temporary directory the postgres user can enter.
 */
export class PatroniCluster {
  readonly #children: ChildProcess[] = [];
  readonly #killed = new Set<string>();
  readonly #onExit = () => this.#killEverything();

  private constructor(
    readonly dir: string,
    readonly nodes: readonly PatroniNode[],
    /** HAProxy's port: the one the BMDB's URL names. */
    readonly port: number,
    private readonly options: PatroniClusterOptions,
    private readonly user: { uid: number; gid: number } | undefined,
  ) {
    process.once('exit', this.#onExit);
  }

  /** Patroni's `synchronous_mode`. */
  get synchronous(): boolean {
    return this.options.synchronous;
  }

  /** Starts etcd, the nodes and HAProxy, and waits for a leader (and its synchronous standby) behind HAProxy. */
  static async start(options: PatroniClusterOptions): Promise<PatroniCluster> {
    const unavailable = patroniClusterUnavailable();
    if (unavailable) throw new Error(`cannot start a Patroni cluster: ${unavailable}`);
    const dir = await mkdtemp(path.join(tmpdir(), 'bmdb-ha-'));
    // The postgres user walks into its nodes' directories below.
    await chmod(dir, 0o755);
    const user = process.getuid?.() === 0 ? await postgresUser() : undefined;
    const nodes: PatroniNode[] = [];
    for (let i = 1; i <= (options.nodes ?? 3); i++) {
      nodes.push({
        name: `node${i}`,
        dir: path.join(dir, `node${i}`),
        port: await freePort(),
        restPort: await freePort(),
      });
    }
    const cluster = new PatroniCluster(dir, nodes, await freePort(), options, user);
    try {
      await cluster.#startEtcd();
      for (const node of nodes) await cluster.#startNode(node);
      await cluster.#startHaproxy();
      await cluster.waitForLeader();
    } catch (error) {
      const logs = await cluster.logs();
      await cluster.stop();
      throw new Error(`${(error as Error).message}\n${logs}`, { cause: error });
    }
    return cluster;
  }

  /** The BMDB's URL through HAProxy, for `database`. */
  url(database = 'postgres'): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${database}`;
  }

  /** Creates a database on the leader and returns its URL through HAProxy. */
  async createDatabase(name: string): Promise<string> {
    await this.query('postgres', `CREATE DATABASE ${name}`);
    return this.url(name);
  }

  /** A query through HAProxy on a connection of its own. */
  async query<R extends pg.QueryResultRow>(database: string, text: string, values?: unknown[]): Promise<R[]> {
    const client = new pg.Client({ connectionString: this.url(database) });
    client.on('error', () => {});
    await client.connect();
    try {
      return (await client.query<R>(text, values)).rows;
    } finally {
      await client.end().catch(() => {});
    }
  }

  /** The members as a live node's REST API lists them; undefined while none answers. */
  async members(): Promise<PatroniMember[] | undefined> {
    for (const node of this.nodes) {
      if (this.#killed.has(node.name)) continue;
      try {
        const response = await fetch(`http://127.0.0.1:${node.restPort}/cluster`, {
          signal: AbortSignal.timeout(2_000),
        });
        if (!response.ok) continue;
        return ((await response.json()) as { members: PatroniMember[] }).members;
      } catch {}
    }
    return undefined;
  }

  /**
   * Waits for a running leader that is not `not` (the one just killed), with
   * a streaming synchronous standby in synchronous mode, and for HAProxy to
   * route new connections to it alone. Returns the leader's name.
   */
  async waitForLeader(options: { not?: string; timeout?: number } = {}): Promise<string> {
    const leader = await eventually(
      `a Patroni leader${options.not ? ` other than ${options.not}` : ''}${this.synchronous ? ' with a synchronous standby' : ''}`,
      async () => {
        const members = await this.members();
        const found = members?.find((m) => m.role === 'leader' && m.state === 'running' && m.name !== options.not);
        if (!found) return undefined;
        // A synchronous standby needs a second live node: after the second kill of three there is none.
        const alive = this.nodes.length - this.#killed.size;
        const standby = members?.some((m) => m.role === 'sync_standby' && ['running', 'streaming'].includes(m.state));
        if (this.synchronous && alive > 1 && !standby) {
          return undefined;
        }
        return found;
      },
      options.timeout ?? 120_000,
      200,
    );
    await this.waitForRouting(leader.port, options.timeout);
    return leader.name;
  }

  /** Waits until five new connections in a row through HAProxy land on the writable node at `port`. */
  async waitForRouting(port: number, timeout = 60_000): Promise<void> {
    let inARow = 0;
    await eventually(
      `HAProxy routing to the leader on port ${port}`,
      async () => {
        try {
          const [row] = await this.query<{ port: number; standby: boolean }>(
            'postgres',
            'SELECT inet_server_port() AS port, pg_is_in_recovery() AS standby',
          );
          inARow = row && row.port === port && !row.standby ? inARow + 1 : 0;
        } catch {
          inARow = 0;
        }
        return inARow >= 5 ? true : undefined;
      },
      timeout,
      100,
    );
  }

  /** The current leader, from Patroni's REST API. */
  async leader(): Promise<PatroniNode> {
    const members = await eventually('the Patroni members', () => this.members(), 30_000);
    const leader = members.find((m) => m.role === 'leader');
    const node = this.nodes.find((n) => n.name === leader?.name);
    if (!node) throw new Error(`no leader among ${JSON.stringify(members)}`);
    return node;
  }

  /**
   * SIGSTOPs the leader's WAL senders: from now on its commits reach no
   * standby, as when the network to them is slow or cut, until
   * {@link killLeader} (which kills them with the rest). Returns how many
   * were stopped.
   *
   * @throws Error when the leader has no WAL sender (no standby streams from it)
   */
  async stopReplication(): Promise<number> {
    const leader = await this.leader();
    const postmaster = postmasterPid(leader);
    const senders = (postmaster === undefined ? [] : childrenOf(postmaster)).filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('walsender');
      } catch {
        return false;
      }
    });
    if (senders.length === 0) throw new Error(`the leader ${leader.name} has no WAL sender to stop`);
    for (const pid of senders) signal(pid, 'SIGSTOP');
    return senders.length;
  }

  /**
   * SIGKILLs the leader's Patroni and every process of its PostgreSQL (the
   * postmaster and its backends): the node is gone as a crashed machine is.
   */
  async killLeader(): Promise<LeaderKill> {
    const leader = await this.leader();
    const postmaster = postmasterPid(leader);
    const pids = postmaster === undefined ? [] : [postmaster, ...childrenOf(postmaster)];
    const patroni = this.#children.find((child) => child.spawnargs.includes(configPath(leader)));
    if (patroni?.pid !== undefined) signalGroup(patroni.pid, 'SIGKILL');
    for (const pid of pids) signal(pid, 'SIGKILL');
    const at = Date.now();
    this.#killed.add(leader.name);
    return { name: leader.name, at };
  }

  /** What the nodes, etcd and HAProxy logged (the end of each), for a failure's message. */
  async logs(): Promise<string> {
    const files = ['etcd.log', 'haproxy.log', ...this.nodes.map((n) => `${n.name}/patroni.log`)];
    const parts = await Promise.all(
      files.map(async (file) => {
        const text = await readFile(path.join(this.dir, file), 'utf8').catch(() => '(none)');
        return `--- ${file}\n${text.slice(-3000)}`;
      }),
    );
    return parts.join('\n');
  }

  /** Stops every process of the cluster and removes its directory. */
  async stop(): Promise<void> {
    this.#killEverything();
    await Promise.all(
      this.#children.map((child) =>
        child.exitCode === null && child.signalCode === null
          ? new Promise((resolve) => child.once('exit', resolve))
          : undefined,
      ),
    );
    process.off('exit', this.#onExit);
    await rm(this.dir, { recursive: true, force: true });
  }

  #killEverything(): void {
    for (const node of this.nodes) {
      const postmaster = postmasterPid(node);
      if (postmaster === undefined) continue;
      for (const pid of [postmaster, ...childrenOf(postmaster)]) signal(pid, 'SIGKILL');
    }
    for (const child of this.#children) if (child.pid !== undefined) signalGroup(child.pid, 'SIGKILL');
  }

  async #startEtcd(): Promise<void> {
    const [client, peer] = [await freePort(), await freePort()];
    this.#etcdPort = client;
    this.#spawn(
      '/usr/bin/etcd',
      [
        '--name=etcd1',
        `--data-dir=${path.join(this.dir, 'etcd')}`,
        `--listen-client-urls=http://127.0.0.1:${client}`,
        `--advertise-client-urls=http://127.0.0.1:${client}`,
        `--listen-peer-urls=http://127.0.0.1:${peer}`,
        `--initial-advertise-peer-urls=http://127.0.0.1:${peer}`,
        `--initial-cluster=etcd1=http://127.0.0.1:${peer}`,
      ],
      'etcd.log',
      false,
    );
    await eventually(
      'etcd answering',
      async () => {
        try {
          return (await fetch(`http://127.0.0.1:${client}/health`)).ok ? true : undefined;
        } catch {
          return undefined;
        }
      },
      30_000,
      100,
    );
  }

  #etcdPort = 0;

  async #startNode(node: PatroniNode): Promise<void> {
    await mkdir(node.dir, { mode: 0o700 });
    await writeFile(configPath(node), JSON.stringify(patroniConfig(node, this.#etcdPort, this.options), null, 2));
    if (this.user) {
      await chown(node.dir, this.user.uid, this.user.gid);
      await chown(configPath(node), this.user.uid, this.user.gid);
    }
    this.#spawn('/usr/bin/patroni', [configPath(node)], path.join(node.name, 'patroni.log'), true);
  }

  async #startHaproxy(): Promise<void> {
    const file = path.join(this.dir, 'haproxy.cfg');
    await writeFile(file, haproxyConfig(this.port, this.nodes));
    this.#spawn('/usr/sbin/haproxy', ['-db', '-f', file], 'haproxy.log', false);
  }

  /** Spawns `command` in a process group of its own, as the postgres user when `asPostgres` and root. */
  #spawn(command: string, args: readonly string[], log: string, asPostgres: boolean): void {
    const [file, argv] =
      asPostgres && this.user ? ['/usr/sbin/runuser', ['-u', 'postgres', '--', command, ...args]] : [command, args];
    const child = spawn(file, argv, { cwd: this.dir, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    const out = path.join(this.dir, log);
    let text = '';
    const append = (chunk: Buffer) => {
      text = (text + chunk.toString('utf8')).slice(-256 * 1024);
      void writeFile(out, text).catch(() => {});
    };
    child.stdout?.on('data', append);
    child.stderr?.on('data', append);
    this.#children.push(child);
  }
}

/** Patroni's configuration of one node (JSON is YAML). */
export function patroniConfig(
  node: PatroniNode,
  etcdPort: number,
  options: PatroniClusterOptions,
): Record<string, unknown> {
  return {
    scope: 'bmdb',
    name: node.name,
    restapi: { listen: `127.0.0.1:${node.restPort}`, connect_address: `127.0.0.1:${node.restPort}` },
    etcd3: { hosts: `127.0.0.1:${etcdPort}` },
    bootstrap: {
      dcs: {
        ttl: TTL_SECONDS,
        loop_wait: LOOP_WAIT_SECONDS,
        retry_timeout: RETRY_TIMEOUT_SECONDS,
        synchronous_mode: options.synchronous,
        ...(options.maximumLagOnFailover === undefined
          ? {}
          : { maximum_lag_on_failover: options.maximumLagOnFailover }),
        postgresql: {
          use_pg_rewind: true,
          parameters: { max_connections: 300, wal_level: 'replica', hot_standby: 'on', max_wal_senders: 10 },
        },
      },
      initdb: [{ encoding: 'UTF8' }, { locale: 'C' }],
      pg_hba: [
        'local all all trust',
        'host all all 127.0.0.1/32 trust',
        'host replication replicator 127.0.0.1/32 trust',
      ],
    },
    postgresql: {
      listen: `127.0.0.1:${node.port}`,
      connect_address: `127.0.0.1:${node.port}`,
      data_dir: path.join(node.dir, 'data'),
      bin_dir: POSTGRES_BIN,
      pgpass: path.join(node.dir, 'pgpass'),
      authentication: {
        superuser: { username: 'postgres', password: 'postgres' },
        replication: { username: 'replicator', password: 'replicator' },
      },
      // Durability on disk is not what these tests are about (a SIGKILL keeps the page cache): spare the CI's disk.
      parameters: { unix_socket_directories: node.dir, fsync: 'off' },
    },
  };
}

/**
 * HAProxy in TCP mode, checking each node's Patroni REST API: `/primary`
 * answers 200 on the leader alone. A node marked down has its connections
 * cut (`on-marked-down shutdown-sessions`), so no client stays on a node
 * that stopped being the primary.
 */
export function haproxyConfig(port: number, nodes: readonly PatroniNode[]): string {
  return [
    'global',
    '  maxconn 1000',
    'defaults',
    '  mode tcp',
    '  retries 2',
    '  timeout connect 4s',
    '  timeout client 30m',
    '  timeout server 30m',
    '  timeout check 2s',
    'listen bmdb',
    `  bind 127.0.0.1:${port}`,
    '  option httpchk OPTIONS /primary',
    '  http-check expect status 200',
    '  default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions',
    ...nodes.map((n) => `  server ${n.name} 127.0.0.1:${n.port} maxconn 300 check port ${n.restPort}`),
    '',
  ].join('\n');
}

function configPath(node: PatroniNode): string {
  return path.join(node.dir, 'patroni.yml');
}

function postmasterPid(node: PatroniNode): number | undefined {
  try {
    const pid = Number.parseInt(readFileSync(path.join(node.dir, 'data', 'postmaster.pid'), 'utf8'), 10);
    return Number.isInteger(pid) ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** The processes whose parent is `pid` (a postmaster's backends), from /proc. */
function childrenOf(pid: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat = '';
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {}
    if (parentOf(stat) === pid) children.push(Number(entry));
  }
  return children;
}

/** The parent PID in a /proc/<pid>/stat line (after the command's closing parenthesis). */
function parentOf(stat: string): number | undefined {
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return fields[1] === undefined ? undefined : Number(fields[1]);
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {}
}

function signalGroup(pid: number, name: NodeJS.Signals): void {
  signal(-pid, name);
}

async function postgresUser(): Promise<{ uid: number; gid: number }> {
  const [uid, gid] = await Promise.all([run('id', ['-u', 'postgres']), run('id', ['-g', 'postgres'])]);
  return { uid: Number.parseInt(uid.stdout, 10), gid: Number.parseInt(gid.stdout, 10) };
}
