import { execFileSync } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import type { IncomingHttpHeaders } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FakeEquinixApi } from '@bmaas/provider-equinix/testing';
import { selfSignedServerTls } from '@bmaas/server';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { allFlagNames, FLAG_GROUPS, flagNames } from '../src/flags.js';
import { DEFAULT_LOG_NAMESPACES } from '../src/logging.js';
import { buildOnce, eventually, expectUsageError, runEquinixArgs, shepherd, start } from './helpers.js';

let dir: string;

const db = await createTestDatabase();

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'shepherd-cli-'));
  // The tests read the BMDB while shepherds start: give it its schema first.
  expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
});
afterAll(() => rm(dir, { recursive: true, force: true }));

const count = async (sql: string, values: unknown[] = []) => (await db.admin(sql, values)).rows[0].n as number;
const testAgent = path.resolve('packages/shepherd-manager/bin/test-agent.js');

/** A GET over TLS, the server's certificate verified against `ca` alone. */
function overTls(
  url: string,
  ca: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const request = httpsRequest(url, { ca, headers }, (response) => {
      let body = '';
      response.setEncoding('utf8').on('data', (chunk: string) => {
        body += chunk;
      });
      response.on('end', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body }));
    });
    request.on('error', reject);
    request.end();
  });
}

async function metrics(port: number): Promise<string> {
  const response = await fetch(`http://127.0.0.1:${port}/metrics`);
  expect(response.status).toBe(200);
  return response.text();
}

describe('help', () => {
  test('every command has --help, and run --help lists every flag with its default', async () => {
    const top = await shepherd(['--help']);
    expect(top.code).toBe(0);
    for (const command of ['run <provider>', 'migrate', 'status', 'ssh-key']) expect(top.stdout).toContain(command);

    const run = await shepherd(['run', '--help'], { SHEPHERD_EQUINIX_API_KEY: 'do-not-print-me' });
    expect(run.code).toBe(0);
    for (const group of FLAG_GROUPS) {
      for (const flag of flagNames(group)) expect(run.stdout).toContain(`--${flag}`);
    }
    expect(run.stdout).toContain('[default: "250ms,8"]');
    expect(run.stdout).toContain('[default: "1m,1"]');
    expect(run.stdout).not.toContain('do-not-print-me');

    expect((await shepherd(['status', '--help'])).stdout).toContain('--json');
    expect((await shepherd(['ssh-key', '--help'])).stdout).toContain('--ssh-key-path');
    expect((await shepherd(['migrate', '--help'])).stdout).toContain('--bmdb-url');
  });
});

describe('help and usage texts', () => {
  /** The help text with its line wrapping undone. */
  const flat = (text: string) => text.replace(/\s+/g, ' ');

  test('each flag says its type and default apart from its description', async () => {
    const help = flat((await shepherd(['run', '--help'])).stdout);
    expect(help).toContain('--agent-ssh-port SSH port of the machines [number] [default: 22]');
    expect(help).toContain('0 for no limit [number] [default: 50]');
    expect(help).toContain('[duration] [default: "30m"]');
    expect(help).toContain('[rate] [default: "250ms,8"]');
    // Nothing runs into its type.
    expect(help).not.toMatch(/[^\s]\[(string|number|duration|rate|path|boolean)\]/);
  });

  test('ssh-key lists only the flags it uses', async () => {
    const help = (await shepherd(['ssh-key', '--help'])).stdout;
    expect(help).toContain('--ssh-key-path');
    expect(help).toContain('--data-dir');
    for (const flag of ['--bmdb-url', '--component-name', '--bmdb-session-interval']) expect(help).not.toContain(flag);
  });

  test('the default of DEBUG in --help is the one the code uses', async () => {
    expect(flat((await shepherd(['--help'])).stdout)).toContain(`(default ${DEFAULT_LOG_NAMESPACES})`);
  });
});

describe('the environment', () => {
  /** The flags a command's --help lists. */
  const flagsOf = async (command: string) =>
    new Set([...(await shepherd([command, '--help'])).stdout.matchAll(/--([a-z][a-z-]+)/g)].map((m) => m[1]));

  test.each([
    ['migrate', () => ['migrate', '--bmdb-url', db.url], /schema up to date/],
    ['status', () => ['status', '--bmdb-url', db.url], /Machines: /],
    ['ssh-key', () => ['ssh-key', '--ssh-key-path', path.join(dir, 'env-key')], /^ssh-ed25519 /],
  ])('%s works with every other command’s SHEPHERD_* variables set', async (command, args, output) => {
    const own = await flagsOf(command);
    const others = allFlagNames().filter((flag) => !own.has(flag));
    expect(others).toContain('equinix-api-key');
    const env = Object.fromEntries(others.map((flag) => [`SHEPHERD_${flag.replaceAll('-', '_').toUpperCase()}`, 'x']));
    const result = await shepherd(args(), { ...env, DEBUG: '' });
    expect(result.stderr).toBe('');
    expect(result.stdout).toMatch(output);
    expect(result.code).toBe(0);
  });

  test('a SHEPHERD_* variable no command knows is named once, as written, and the command still works', async () => {
    const result = await shepherd(['migrate', '--bmdb-url', db.url], {
      SHEPHERD_BMDB_URLL: 'postgres://typo',
      Shepherd_lower: 'not ours',
      DEBUG: '',
    });
    expect(result.code).toBe(0);
    expect(result.stdout).toBe('schema up to date\n');
    expect(result.stderr).toBe(
      'shepherd: warning: SHEPHERD_BMDB_URLL is set, but no shepherd command has such a flag; ignored\n',
    );
  });

  test('a command’s own variables still count, and the command line wins over them', async () => {
    const fromEnv = await shepherd(['status'], { SHEPHERD_BMDB_URL: db.url, SHEPHERD_JSON: 'true', DEBUG: '' });
    expect(fromEnv.code).toBe(0);
    expect(JSON.parse(fromEnv.stdout)).toHaveProperty('machines');
    const overridden = await shepherd(['status', '--no-json', '--bmdb-url', db.url], {
      SHEPHERD_BMDB_URL: 'postgres://nobody@127.0.0.1:1/none',
      SHEPHERD_JSON: 'true',
      DEBUG: '',
    });
    expect(overridden.code).toBe(0);
    expect(overridden.stdout).toMatch(/^Machines: /);
  });

  test('DEBUG= (empty) turns the logs off', async () => {
    const quiet = await shepherd(['migrate', '--bmdb-url', db.url], { DEBUG: '' });
    expect(quiet.code).toBe(0);
    expect(quiet.stderr).toBe('');
    const noisy = await shepherd(['migrate', '--bmdb-url', db.url], { DEBUG: 'bmdb:*' });
    expect(noisy.stderr).toMatch(/bmdb:connection/);
  });
});

describe('bad input exits 2 with one line naming the flag, before anything is touched', () => {
  let notCert: string;
  beforeAll(async () => {
    notCert = path.join(dir, 'not-a-cert.pem');
    await writeFile(notCert, 'hello\n');
  });

  const equinix = (overrides: Record<string, string>) =>
    runEquinixArgs(
      { url: 'https://api.equinix.com/metal/v1', projectId: 'p' },
      { label: 'shepherd-test', devicePrefix: 'shepherd-test-' },
      { 'agent-executable-path': testAgent, 'agent-endpoint': 'bmaas.example.com:443', ...overrides },
    );
  const cases: [string, () => string[], RegExp][] = [
    [
      'a malformed rate',
      () => ['run', 'dummy', '--initializer-db-query-rate', 'fast'],
      /--initializer-db-query-rate: invalid value "fast": want 'duration,count'/,
    ],
    [
      'a malformed duration',
      () => ['run', 'dummy', '--agent-ssh-exec-timeout', '10'],
      /--agent-ssh-exec-timeout: invalid value "10": want a duration/,
    ],
    [
      'a missing agent executable',
      () => ['run', 'dummy', '--agent-executable-path', path.join(dir, 'nope')],
      /--agent-executable-path: cannot read ".*nope" \(ENOENT\)/,
    ],
    [
      'no agent executable for equinix',
      () => ['run', 'equinix'],
      /--agent-executable-path: required for run equinix \(or set SHEPHERD_AGENT_EXECUTABLE_PATH\)/,
    ],
    [
      'an unreadable CA file',
      () => ['run', 'dummy', '--agent-endpoint-ca-certificate-path', path.join(dir, 'missing.pem')],
      /--agent-endpoint-ca-certificate-path: cannot read/,
    ],
    [
      'a CA file that is no certificate',
      () => ['run', 'dummy', '--agent-endpoint-ca-certificate-path', notCert],
      /--agent-endpoint-ca-certificate-path: ".*" is not a PEM X.509 certificate/,
    ],
    [
      'a device prefix still saying FIXME',
      () => equinix({ 'equinix-device-prefix': 'FIXME-', 'equinix-api-key': 'k' }),
      /--equinix-device-prefix: invalid value "FIXME-": want a real value/,
    ],
    [
      'a key label still saying FIXME',
      () => equinix({ 'equinix-ssh-key-label': 'alice-FIXME', 'equinix-api-key': 'k' }),
      /--equinix-ssh-key-label: invalid value "alice-FIXME"/,
    ],
    [
      'no API key',
      () => equinix({}),
      /--equinix-api-key: required for run equinix \(or set SHEPHERD_EQUINIX_API_KEY\)/,
    ],
    [
      'an unreachable database',
      () => ['run', 'dummy', '--bmdb-url', 'postgres://shepherd:hunter2@127.0.0.1:1/bmdb'],
      /--bmdb-url: could not connect to the BMDB at postgres:\/\/shepherd:\*\*\*@127.0.0.1:1\/bmdb/,
    ],
    [
      'a share out of range',
      () => ['run', 'dummy', '--dummy-agent-failure-rate', '1.5'],
      /--dummy-agent-failure-rate: invalid value "1.5": want a share between 0 and 1/,
    ],
    [
      'a session interval of part seconds',
      () => ['run', 'dummy', '--bmdb-session-interval', '1500ms'],
      /--bmdb-session-interval: invalid value "1500ms": want whole seconds/,
    ],
    [
      'a port out of range',
      () => ['run', 'dummy', '--agent-ssh-port', '65536'],
      /--agent-ssh-port: invalid value "65536": want a whole number from 1 to 65535/,
    ],
    [
      'an agent start log in a missing directory',
      () => ['run', 'dummy', '--dummy-agent-start-log', path.join(dir, 'missing', 'starts.jsonl')],
      /--dummy-agent-start-log: invalid value ".*starts.jsonl": want a file in an existing directory/,
    ],
    [
      'a negative agent start duration',
      () => ['run', 'dummy', '--dummy-agent-start-duration=-1s'],
      /--dummy-agent-start-duration: invalid value "-1s"/,
    ],
    [
      'a bad power sync rate',
      () => ['run', 'dummy', '--power-sync-rate', 'often'],
      /--power-sync-rate: invalid value "often": want 'duration,count'/,
    ],
    [
      'a power sync concurrency out of range',
      () => ['run', 'dummy', '--power-sync-concurrency', '1001'],
      /--power-sync-concurrency: invalid value "1001": want a whole number from 0 to 1000/,
    ],
    [
      'a bad power sync interval',
      () => ['run', 'dummy', '--power-sync-interval', 'hourly'],
      /--power-sync-interval: invalid value "hourly": want a duration/,
    ],
    [
      'a bad stop grace period',
      () => ['run', 'dummy', '--stop-grace-period', 'a while'],
      /--stop-grace-period: invalid value "a while": want a duration/,
    ],
    ['an unknown flag', () => ['run', 'dummy', '--nope'], /--nope: unknown flag for run; see --help/],
    [
      'a value starting with a dash after a space (yargs would read short flags and keep the default)',
      () => ['run', 'dummy', '--agent-ssh-exec-timeout', '-30s'],
      /-30s: unknown flag for run; see --help \(a value starting with "-" is written --flag=value\)/,
    ],
    ['an unknown short flag', () => ['run', 'dummy', '-x'], /-x: unknown flag for run/],
    ['an unknown provider', () => ['run', 'vmware'], /run: unknown provider "vmware": want dummy, equinix or static/],
    [
      'a word too many (yargs would find it only after the command ran)',
      () => ['migrate', 'now'],
      /^shepherd: migrate: unexpected argument "now"; see --help\n$/,
    ],
    ['a word after the provider', () => ['run', 'dummy', 'fast'], /^shepherd: run: unexpected argument "fast"/],
    [
      'no command',
      () => [],
      /^shepherd: say which command to run: run, migrate, status, ssh-key, server, decommission, recommission, hold, unhold, install, power, web or agent-image; see --help\n$/,
    ],
    [
      'run without a provider',
      () => ['run'],
      /^shepherd: run: say which provider: dummy, equinix or static \(e.g. shepherd run dummy\)\n$/,
    ],
    [
      'bad metrics address',
      () => ['run', 'dummy', '--metrics-listen', 'everywhere'],
      /--metrics-listen: invalid value "everywhere": want host:port/,
    ],
  ];

  test.each(cases)('%s', async (_, args, message) => {
    const dataDir = path.join(dir, `untouched-${Math.random().toString(36).slice(2)}`);
    const result = await shepherd([...args(), ...(args().length ? ['--data-dir', dataDir] : [])]);
    await expectUsageError(result, message, dataDir);
  });

  test('environment variables are read like flags', async () => {
    const result = await shepherd(['run', 'dummy'], { SHEPHERD_RECOVERER_DB_QUERY_RATE: 'often' });
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/--recoverer-db-query-rate: invalid value "often"/);
  });
});

describe('a data directory that cannot be made', () => {
  const root = process.getuid?.() === 0;
  const cases: [string, () => Promise<string>, RegExp][] = [
    [
      'under a regular file',
      async () => {
        await writeFile(path.join(dir, 'plain-file'), '');
        return path.join(dir, 'plain-file', 'data');
      },
      /^shepherd: --data-dir: cannot use ".*plain-file\/data": ".*plain-file" is not a directory\n$/,
    ],
    [
      'where the file system allows none (/proc; Node’s recursive mkdir never returns there)',
      async () => '/proc/forbidden',
      /^shepherd: --data-dir: cannot create "\/proc\/forbidden": ENOENT \(the file system does not allow a directory there\)\n$/,
    ],
  ];
  test.each(cases)('%s: run and migrate exit 2 with one line', async (_, dataDir, message) => {
    const value = await dataDir();
    for (const command of [['run', 'dummy'], ['migrate'], ['ssh-key']]) {
      const result = await shepherd([...command, '--data-dir', value], { DEBUG: '' });
      expect(result.stderr).toMatch(message);
      expect(result.code).toBe(2);
    }
  });

  test.skipIf(root)('in a directory this user cannot write (not as root)', async () => {
    const locked = path.join(dir, 'locked');
    await mkdir(locked, { mode: 0o500 });
    const result = await shepherd(['run', 'dummy', '--data-dir', path.join(locked, 'data')], { DEBUG: '' });
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(
      /^shepherd: --data-dir: cannot create ".*locked\/data": EACCES \(permission denied\)\n$/,
    );
  });

  test('a signal stops start-up while it waits on the file system', async () => {
    // Reading a FIFO nobody writes to never returns: start-up is stuck reading the agent executable.
    const fifo = path.join(dir, 'agent-fifo');
    execFileSync('mkfifo', [fifo]);
    const run = start(['run', 'dummy', '--bmdb-url', db.url, '--agent-executable-path', fifo]);
    await run.logged(/starting with the dummy provider/);
    run.child.kill('SIGTERM');
    const result = await run.exited;
    // The read never returns; the process ends by the signal, after saying so.
    expect(result.signal).toBe('SIGTERM');
    expect(result.stderr).toContain('SIGTERM: stopping start-up');
    expect(result.stderr).toContain('start-up is still waiting on the file system: ending the process by SIGTERM');
  });
});

describe('run dummy', () => {
  test('brings N machines to AgentStarted, status --json agrees, metrics are served, SIGTERM stops cleanly', async () => {
    const port = await freePort();
    const run = start([
      'run',
      'dummy',
      '--bmdb-url',
      db.url,
      '--metrics-listen',
      `127.0.0.1:${port}`,
      '--dummy-capacity',
      '8',
      '--dummy-agent-failure-rate',
      '0',
      '--dummy-heartbeat-failure-rate',
      '0',
      '--dummy-heartbeat-interval',
      '200ms',
      '--provisioner-device-creation-rate',
      '1ms,100',
      '--initializer-loop-parallelism',
      '4',
    ]);
    await eventually(async () =>
      (await count('SELECT count(*)::int AS n FROM machine_agent_heartbeat')) === 8 ? true : undefined,
    );
    const status = await shepherd(['status', '--json', '--bmdb-url', db.url]);
    expect(status.code).toBe(0);
    const parsed = JSON.parse(status.stdout);
    expect(parsed.machines).toBe(8);
    expect(parsed.stages.heartbeating).toBe(8);
    expect(parsed.held).toBe(0);
    // The power sync reads the dummy's simulated power of every machine.
    await eventually(async () =>
      (await count(`SELECT count(*)::int AS n FROM machine_power_state WHERE power_state = 'On'`)) === 8
        ? true
        : undefined,
    );
    expect(await count('SELECT count(*)::int AS n FROM machine_agent_started')).toBe(8);

    const text = await metrics(port);
    expect(text).toMatch(
      /bmdb_work_finished_total\{processor="shepherd-initializer",process="ShepherdAgentStart",result="finished"\} 8/,
    );
    expect(text).toContain('bmdb_session_started_total');
    expect(text).toContain('process_cpu_seconds_total');

    // A human-readable status too.
    const table = await shepherd(['status', '--bmdb-url', db.url]);
    expect(table.stdout).toMatch(/heartbeating\s+8/);

    run.child.kill('SIGTERM');
    const result = await run.exited;
    expect(result.code).toBe(0);
    expect(result.stderr).toContain('SIGTERM: stopping cleanly');
    expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
    expect(await count("SELECT count(*)::int AS n FROM sessions WHERE component_name = 'shepherd'")).toBe(0);
    // One line per event, each naming its machine and provider IDs.
    expect(result.stderr).toMatch(
      /shepherd:initializer agent started on machine [0-9a-f-]{36} \(provider ID dummy-\d{6}\)/,
    );
  });

  test('SIGTERM mid-run, with work in flight, leaves nothing claimed', async () => {
    await db.admin('DELETE FROM machines');
    const run = start([
      'run',
      'dummy',
      '--bmdb-url',
      db.url,
      '--dummy-capacity',
      '200',
      '--provisioner-device-creation-rate',
      '1ms,1000',
      '--provisioner-reservation-chunk-size',
      '200',
      '--provisioner-max-machines',
      '0',
      '--initializer-loop-parallelism',
      '8',
      '--initializer-db-query-rate',
      '1ms,1000',
      '--bmdb-session-interval',
      '3s',
    ]);
    await run.logged(/agent started on machine/);
    const intervals = await db.admin(
      "SELECT DISTINCT interval_seconds FROM sessions WHERE component_name = 'shepherd'",
    );
    expect(intervals.rows).toEqual([{ interval_seconds: 3 }]);
    run.child.kill('SIGTERM');
    const result = await run.exited;
    expect(result.code).toBe(0);
    expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
    expect(await count('SELECT count(*)::int AS n FROM sessions WHERE deadline > now()')).toBe(0);
    // Everything claimed was ended: each Started has a Finished, Failed or Canceled.
    const open = await count(`
      SELECT count(*)::int AS n FROM (
        SELECT machine_id, process FROM work_history GROUP BY machine_id, process
        HAVING count(*) FILTER (WHERE event = 'Started') > count(*) FILTER (WHERE event <> 'Started')) x`);
    expect(open).toBe(0);
  });
});

describe('the default logs: one line per event a person cares about', () => {
  /** The log lines of `stderr` (timestamped), without their timestamps. */
  const lines = (stderr: string) =>
    stderr
      .split('\n')
      .filter((line) => /^\d{4}-\d\d-\d\dT/.test(line))
      .map((line) => line.replace(/^\S+ /, ''));

  test('machines provided and agents started: a line each, no steps, at most one heartbeat summary', async () => {
    await db.admin('DELETE FROM machines');
    const run = start(
      [
        'run',
        'dummy',
        '--bmdb-url',
        db.url,
        '--dummy-capacity',
        '4',
        '--dummy-agent-failure-rate',
        '0',
        '--dummy-heartbeat-failure-rate',
        '0',
        '--dummy-heartbeat-interval',
        '100ms',
        '--provisioner-device-creation-rate',
        '300ms,1',
      ],
      { DEBUG: undefined },
    );
    await eventually(async () =>
      (await count('SELECT count(*)::int AS n FROM machine_agent_heartbeat')) === 4 ? true : undefined,
    );
    // Heartbeat rounds every 100 ms while the fleet grew from 0 to 4: summaries at most once a minute.
    await run.logged(/4 of 4 started agents heartbeated|agent started on machine(.|\n)*agent started on machine/);
    run.child.kill('SIGTERM');
    const result = await run.exited;
    expect(result.code).toBe(0);
    const logged = lines(result.stderr);
    expect(
      logged.filter((line) => /^shepherd:provisioner provided machine dummy-\d{6} at Dummy/.test(line)),
    ).toHaveLength(4);
    expect(
      logged.filter((line) =>
        /^shepherd:initializer agent started on machine [0-9a-f-]{36} \(provider ID dummy-\d{6}\)$/.test(line),
      ),
    ).toHaveLength(4);
    expect(logged.filter((line) => line.includes('started agents heartbeated')).length).toBeLessThanOrEqual(1);
    for (const step of [/claimed machine/, /starting agent/, /^bmdb:session /, /worker\(s\)/, /created machine/]) {
      expect(logged.filter((line) => step.test(line))).toEqual([]);
    }
  });

  test('a failed agent start is one line with its cause and backoff; the steps stay under :detail', async () => {
    await db.admin('DELETE FROM machines');
    const args = ['run', 'dummy', '--bmdb-url', db.url, '--dummy-capacity', '1', '--dummy-agent-failure-rate', '1'];
    const run = start(args, { DEBUG: undefined });
    await run.logged(/failed, backing off/);
    run.child.kill('SIGTERM');
    const result = await run.exited;
    expect(result.code).toBe(0);
    const { rows } = await db.admin('SELECT machine_id FROM machines');
    const machine = rows[0].machine_id as string;
    const failures = lines(result.stderr).filter((line) => line.includes(machine) && /fail/.test(line));
    expect(failures).toHaveLength(1);
    expect(failures[0]).toMatch(
      /^bmdb:work machine \S+ ShepherdAgentStart failed, backing off \d+s: .*simulated failure/,
    );

    // The steps, with DEBUG widened to every namespace.
    await db.admin('DELETE FROM machines');
    const detailed = start(args, { DEBUG: 'shepherd:*,bmdb:*,-bmdb:embedded' });
    await detailed.logged(/failed, backing off/);
    detailed.child.kill('SIGTERM');
    const all = (await detailed.exited).stderr;
    expect(all).toMatch(/bmdb:work:detail session \S+ claimed machine/);
    expect(all).toMatch(/shepherd:initializer:detail starting agent on machine/);
    expect(all).toMatch(/shepherd:dummy:detail simulating a failed agent start/);
  });
});

describe('run on an embedded BMDB', () => {
  test('says it initialises the database, and a clean stop prints no error lines', async () => {
    // As root the server runs as `postgres`, which must reach the data directory.
    await chmod(dir, 0o755);
    const run = start([
      'run',
      'dummy',
      '--data-dir',
      path.join(dir, 'embedded'),
      '--dummy-capacity',
      '20',
      '--provisioner-device-creation-rate',
      '1ms,100',
      '--initializer-loop-parallelism',
      '8',
      '--dummy-heartbeat-interval',
      '100ms',
      '--dummy-agent-failure-rate',
      '0',
    ]);
    await run.logged(
      /shepherd:cli initialising a new embedded BMDB in .*embedded \(the first start takes a few seconds\)/,
    );
    await run.logged(/agent started on machine/, 120_000);
    run.child.kill('SIGINT');
    const result = await run.exited;
    expect(result.code).toBe(0);
    const afterStop = result.stderr.slice(result.stderr.indexOf('SIGINT: stopping cleanly'));
    expect(afterStop).not.toMatch(/57P01|administrator command|failed/);
  });
});

describe('run with machines of another provider in the BMDB', () => {
  test('names them at start, and leaves them alone', async () => {
    await db.admin('DELETE FROM machines');
    const { rows } = await db.admin('INSERT INTO machines DEFAULT VALUES RETURNING machine_id');
    const foreign = rows[0].machine_id as string;
    await db.admin("INSERT INTO machine_provided (machine_id, provider, provider_id) VALUES ($1, 'Bogus', 'b-1')", [
      foreign,
    ]);
    const run = start(['run', 'dummy', '--bmdb-url', db.url, '--dummy-capacity', '1']);
    await run.logged(
      /the BMDB holds 0 machine\(s\) of provider Dummy; machines of other providers, left alone by this shepherd: Bogus 1/,
    );
    run.child.kill('SIGTERM');
    expect((await run.exited).code).toBe(0);
    expect(await count('SELECT count(*)::int AS n FROM work_history WHERE machine_id = $1', [foreign])).toBe(0);
    await db.admin('DELETE FROM machines');
  });
});

describe('run equinix', () => {
  let api: FakeEquinixApi;
  let silent: Server;
  let silentPort: number;
  beforeAll(async () => {
    // Devices answer SSH at 127.0.0.1:<silent port>: accepted, never answered.
    api = await FakeEquinixApi.start({ reservations: 3, publicIpv4: '127.0.0.1', provisioningReads: 0 });
    silent = createServer(() => {});
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    silentPort = (silent.address() as { port: number }).port;
  });
  afterAll(async () => {
    await api.close();
    silent.close();
  });

  const equinixArgs = (extra: string[]) => [
    ...runEquinixArgs(
      api,
      { label: 'shepherd-cli-test', devicePrefix: 'cli-test-' },
      {
        'bmdb-url': db.url,
        'ssh-key-path': path.join(dir, 'equinix_key'),
        'agent-executable-path': testAgent,
        'agent-endpoint': 'bmaas.example.com:443',
        'agent-ssh-port': String(silentPort),
        'provisioner-device-creation-rate': '1ms,100',
      },
    ),
    ...extra,
  ];

  test('brings its reservations in, serves BMDB and API metrics, never shows the API key', async () => {
    await db.admin('DELETE FROM machines');
    const port = await freePort();
    const run = start(equinixArgs(['--metrics-listen', `127.0.0.1:${port}`, '--agent-ssh-connect-timeout', '300ms']), {
      SHEPHERD_EQUINIX_API_KEY: api.apiKey,
    });
    await eventually(async () =>
      (await count("SELECT count(*)::int AS n FROM machine_provided WHERE provider = 'Equinix'")) === 3
        ? true
        : undefined,
    );
    const rows = (await db.admin("SELECT provider_id FROM machine_provided WHERE provider = 'Equinix'")).rows;
    expect(rows.map((r) => r.provider_id).sort()).toEqual(api.devices.map((d) => d.id).sort());
    const text = await metrics(port);
    expect(text).toContain('equinix_api_request_duration_seconds');
    expect(text).toContain('bmdb_transaction_executed_total');
    // The silent SSH server fails agent starts into backoff, with a cause.
    await eventually(async () => ((await count('SELECT count(*)::int AS n FROM work_backoff')) > 0 ? true : undefined));
    run.child.kill('SIGTERM');
    const result = await run.exited;
    expect(result.code).toBe(0);
    expect(result.stderr).not.toContain(api.apiKey);
    expect(result.stderr).toMatch(/connect timeout of 300 ms/);
  });

  test('a second signal exits at once, while a clean stop waits for in-flight work', async () => {
    await db.admin('DELETE FROM work_backoff'); // the machines are due for an agent start again
    const run = start(equinixArgs(['--agent-ssh-connect-timeout', '120s']), { SHEPHERD_EQUINIX_API_KEY: api.apiKey });
    await run.logged(/starting agent on machine/);
    run.child.kill('SIGTERM');
    await run.logged(/SIGTERM: stopping cleanly/);
    // Still waiting for the SSH dial (grace period): had the clean stop not waited, the process
    // would have exited 0 before this second signal, not 143 by it.
    expect(run.child.exitCode).toBeNull();
    run.child.kill('SIGTERM');
    const result = await run.exited;
    expect(result.code).toBe(143);
    expect(result.stderr).toContain('second SIGTERM: exiting at once');
  });
});

describe('ssh-key and migrate', () => {
  test('ssh-key generates the key once (mode 0400) and prints its public half', async () => {
    const keyPath = path.join(dir, 'keys', 'id_shepherd');
    const first = await shepherd(['ssh-key', '--ssh-key-path', keyPath]);
    expect(first.code).toBe(0);
    expect(first.stdout).toMatch(/^ssh-ed25519 AAAA[0-9A-Za-z+/]+=* \S+\n$/);
    expect((await stat(keyPath)).mode & 0o777).toBe(0o400);
    const again = await shepherd(['ssh-key', '--ssh-key-path', keyPath]);
    expect(again.stdout).toBe(first.stdout);
    expect(await readFile(keyPath, 'utf8')).toContain('OPENSSH PRIVATE KEY');
  });

  test('migrate brings a new database up to date, then is a no-op', async () => {
    // (The suite's own database was migrated by `shepherd migrate` in beforeAll.)
    const fresh = await createTestDatabase();
    const first = await shepherd(['migrate', '--bmdb-url', fresh.url]);
    expect(first.code).toBe(0);
    expect(first.stdout).toMatch(/^applied 0001_initial/);
    const again = await shepherd(['migrate', '--bmdb-url', fresh.url]);
    expect(again.stdout).toBe('schema up to date\n');
  });

  test('status on a data directory without a BMDB says how to get one', async () => {
    const result = await shepherd(['status', '--data-dir', path.join(dir, 'empty')]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/--data-dir: no BMDB under .*empty yet/);
  });
});

describe('fleet page', () => {
  const TOKEN = 'a-web-token-long-enough';

  test('web --help lists its flags; a token from the environment is never shown', async () => {
    const help = await shepherd(['web', '--help'], { SHEPHERD_WEB_TOKEN: 'do-not-print-me-ever' });
    expect(help.code).toBe(0);
    for (const flag of ['--web-listen', '--web-token', '--bmdb-url', '--recoverer-heartbeat-timeout']) {
      expect(help.stdout).toContain(flag);
    }
    expect(help.stdout).toContain('127.0.0.1:8080 for web');
    expect(help.stdout).not.toContain('do-not-print-me-ever');
    expect((await shepherd(['--help'])).stdout).toContain('web');
  });

  test('beyond loopback without a token, web and run refuse with exit 2 naming --web-token, touching nothing', async () => {
    // An unreachable BMDB: the refusal comes before any connection.
    const nowhere = 'postgres://u:p@127.0.0.1:1/none';
    const webRefused = await shepherd(['web', '--bmdb-url', nowhere, '--web-listen', '0.0.0.0:8080']);
    expect(webRefused.code).toBe(2);
    expect(webRefused.stderr).toContain(
      'shepherd: --web-token: required to serve the fleet page on 0.0.0.0:8080, beyond loopback (or set SHEPHERD_WEB_TOKEN',
    );
    const runRefused = await shepherd(['run', 'dummy', '--bmdb-url', nowhere, '--web-listen', ':8080']);
    expect(runRefused.code).toBe(2);
    expect(runRefused.stderr).toContain('--web-token: required');
    const short = await shepherd(['web', '--bmdb-url', nowhere, '--web-listen', '0.0.0.0:8080'], {
      SHEPHERD_WEB_TOKEN: 'short-secret',
    });
    expect(short.code).toBe(2);
    expect(short.stderr).toContain('--web-token: the web token must be at least 16 characters long');
    expect(short.stderr).not.toContain('short-secret');
  });

  test('beyond loopback without TLS, web and run refuse with exit 2 naming the flags, touching nothing', async () => {
    const nowhere = 'postgres://u:p@127.0.0.1:1/none';
    const dataDir = path.join(dir, 'web-refused');
    const env = { SHEPHERD_WEB_TOKEN: TOKEN };
    const page = ['--bmdb-url', nowhere, '--data-dir', dataDir, '--web-listen', '0.0.0.0:8080'];
    const noTls =
      /--web-tls-cert: serving the fleet page on 0\.0\.0\.0:8080, beyond loopback, needs TLS: give --web-tls-cert and --web-tls-key, or --web-tls-self-signed for a certificate made once under --data-dir, or --web-insecure-http if a TLS proxy in front terminates TLS/;
    await expectUsageError(await shepherd(['web', ...page], env), noTls, dataDir);
    await expectUsageError(await shepherd(['run', 'dummy', ...page], env), noTls, dataDir);
    await expectUsageError(
      await shepherd(['web', ...page, '--web-tls-cert', 'page.crt'], env),
      /--web-tls-key: required with --web-tls-cert/,
      dataDir,
    );
    await expectUsageError(
      await shepherd(
        ['web', ...page, '--web-tls-cert', 'a.crt', '--web-tls-key', 'a.key', '--web-tls-self-signed'],
        env,
      ),
      /--web-tls-self-signed: not with --web-tls-cert and --web-tls-key/,
      dataDir,
    );
    await expectUsageError(
      await shepherd(['web', ...page, '--web-tls-self-signed', '--web-insecure-http'], env),
      /--web-insecure-http: not with a certificate/,
      dataDir,
    );
    await expectUsageError(
      await shepherd(
        [
          'web',
          ...page,
          '--web-tls-cert',
          path.join(dir, 'no-such.crt'),
          '--web-tls-key',
          path.join(dir, 'no-such.key'),
        ],
        env,
      ),
      /--web-tls-cert: .*no-such\.crt.*ENOENT/,
      dataDir,
    );
  });

  test('web serves the page over HTTPS from its own process, with a self-signed certificate made once', async () => {
    const port = await freePort();
    const dataDir = path.join(dir, 'web-tls');
    const args = ['web', '--bmdb-url', db.url, '--data-dir', dataDir, '--web-listen', `0.0.0.0:${port}`];
    const web = start([...args, '--web-tls-self-signed'], { SHEPHERD_WEB_TOKEN: TOKEN });
    await web.logged(/serving the fleet page at https:\/\/0\.0\.0\.0:\d+\/ \(token required\)/);
    const certPath = path.join(dataDir, 'web.crt');
    expect(web.stderr).toContain(`made a self-signed certificate for the fleet page, ${certPath}`);
    await eventually(async () => web.stdout.includes(`fleet page at https://0.0.0.0:${port}/`) || undefined);
    const ca = await readFile(certPath, 'utf8');
    // A real TLS client that trusts only that certificate.
    const url = `https://127.0.0.1:${port}/api/overview`;
    expect((await overTls(url, ca)).status).toBe(401);
    const overview = await overTls(url, ca, { authorization: `Bearer ${TOKEN}` });
    expect(overview.status).toBe(200);
    expect(JSON.parse(overview.body)).toHaveProperty('stages');
    expect(overview.headers['strict-transport-security']).toBe('max-age=31536000');
    web.child.kill('SIGTERM');
    const result = await web.exited;
    expect(result.code).toBe(0);
    expect(result.stderr).not.toContain(TOKEN);

    // The next start serves the same certificate.
    const again = start([...args, '--web-tls-self-signed'], { SHEPHERD_WEB_TOKEN: TOKEN });
    await again.logged(/serving the fleet page at https:/);
    expect(again.stderr).not.toContain('made a self-signed certificate');
    expect(await readFile(certPath, 'utf8')).toBe(ca);
    expect((await overTls(url, ca, { authorization: `Bearer ${TOKEN}` })).status).toBe(200);
    again.child.kill('SIGTERM');
    expect((await again.exited).code).toBe(0);
  });

  test('web --web-insecure-http serves plain HTTP for a TLS proxy in front, and says so at every start', async () => {
    const port = await freePort();
    const args = ['web', '--bmdb-url', db.url, '--web-listen', `0.0.0.0:${port}`, '--web-insecure-http'];
    for (let i = 0; i < 2; i++) {
      const web = start(args, { SHEPHERD_WEB_TOKEN: TOKEN });
      await web.logged(/serving the fleet page at http:\/\/0\.0\.0\.0:\d+\//);
      expect(web.stderr).toContain('serving the fleet page as plain HTTP (--web-insecure-http)');
      const login = await fetch(`http://127.0.0.1:${port}/login`, {
        method: 'POST',
        redirect: 'manual',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ token: TOKEN, next: '/' }).toString(),
      });
      // Browsers reach it through the proxy's HTTPS: the cookie is for HTTPS only.
      expect(login.headers.get('set-cookie')).toMatch(/; Secure$/);
      web.child.kill('SIGTERM');
      expect((await web.exited).code).toBe(0);
    }
  });

  test('run serves the page on --web-listen next to its loops, over HTTPS with the certificate given', async () => {
    const port = await freePort();
    const certificates = path.join(dir, 'page-certificate');
    const tls = await selfSignedServerTls(certificates, { name: 'page' });
    const run = start([
      'run',
      'dummy',
      '--bmdb-url',
      db.url,
      '--web-listen',
      `127.0.0.1:${port}`,
      '--web-tls-cert',
      tls.certPath,
      '--web-tls-key',
      path.join(certificates, 'page.key'),
      '--dummy-capacity',
      '2',
    ]);
    await run.logged(/serving the fleet page at https:\/\/127\.0\.0\.1:\d+\//);
    const page = await overTls(`https://127.0.0.1:${port}/machines`, tls.cert);
    expect(page.status).toBe(200);
    expect(page.body).toContain('<h1>Machines</h1>');
    expect(page.headers['strict-transport-security']).toBe('max-age=31536000');
    await eventually(async () => {
      const body = JSON.parse((await overTls(`https://127.0.0.1:${port}/api/overview`, tls.cert)).body) as {
        sessions: { processor: string }[];
      };
      return body.sessions.some((s: { processor: string }) => s.processor === 'shepherd-provisioner')
        ? true
        : undefined;
    });
    run.child.kill('SIGTERM');
    expect((await run.exited).code).toBe(0);
  });
});
