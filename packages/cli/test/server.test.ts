/**
 * `shepherd server` as a process: its flags, its self-signed certificate, a
 * heartbeat through it over gRPC, its metrics and its clean stop.
 */

import { generateKeyPairSync } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { connect, type IncomingHttpHeaders } from 'node:http2';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';
import { AgentCallback } from '@bmaas/server';
import { createClient } from '@connectrpc/connect';
import { createGrpcTransport } from '@connectrpc/connect-node';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { eventually } from '../../../test/support/wait.js';
import { flagNames } from '../src/flags.js';
import { buildOnce, shepherd, start } from './helpers.js';

let dir: string;

const db = await createTestDatabase();

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'shepherd-server-'));
  expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
});
afterAll(() => rm(dir, { recursive: true, force: true }));

describe('shepherd server', () => {
  test('--help lists its flags; bad flags exit 2 naming the flag, before anything is touched', async () => {
    const help = await shepherd(['server', '--help']);
    expect(help.code).toBe(0);
    for (const flag of [...flagNames('server'), 'bmdb-url', 'metrics-listen'])
      expect(help.stdout).toContain(`--${flag}`);
    expect(help.stdout).not.toContain('--agent-ssh-user');

    const cases: Array<[string[], RegExp]> = [
      [['--listen', 'localhost'], /^shepherd: --listen: invalid value "localhost": want host:port/],
      [['--tls-cert', path.join(dir, 'x.crt')], /^shepherd: --tls-key: required with --tls-cert/],
      [
        ['--tls-cert', path.join(dir, 'missing.crt'), '--tls-key', path.join(dir, 'missing.key')],
        /^shepherd: --tls-cert: server TLS: .*missing\.crt: cannot read it \(ENOENT\)/,
      ],
      [['--agent-ssh-user', 'root'], /^shepherd: --agent-ssh-user: unknown flag for server/],
      [['--workers', '0'], /^shepherd: --workers: invalid value "0": want a whole number from 1 to 64/],
      [['--workers', 'two'], /^shepherd: --workers: invalid value "two"/],
      [
        ['--max-connections', '0'],
        /^shepherd: --max-connections: invalid value "0": want a whole number from 1 to 10000000/,
      ],
      [
        ['--max-streams-per-connection', '0'],
        /^shepherd: --max-streams-per-connection: invalid value "0": want a whole number from 1 to 4294967295/,
      ],
      [
        ['--max-buffered-bytes', 'lots'],
        /^shepherd: --max-buffered-bytes: invalid value "lots": want a size of at least 1024 bytes, such as 65536, 64KiB, 16MiB or 1GiB/,
      ],
      [
        ['--max-buffered-bytes-per-connection', '1GiB'],
        /^shepherd: --max-buffered-bytes-per-connection: 1GiB is more than --max-buffered-bytes \(256MiB\)/,
      ],
      [
        ['--request-timeout', '0s'],
        /^shepherd: --request-timeout: invalid value "0s": want a duration greater than zero/,
      ],
      [['--idle-timeout', 'soon'], /^shepherd: --idle-timeout: invalid value "soon": want a duration/],
      [
        ['--idle-timeout', '1000h'],
        /^shepherd: --idle-timeout: invalid value "1000h": want a duration of at most 596h/,
      ],
    ];
    for (const [args, message] of cases) {
      const result = await shepherd(['server', '--bmdb-url', db.url, '--data-dir', path.join(dir, 'bad'), ...args]);
      expect(result.code, args.join(' ')).toBe(2);
      expect(result.stderr).toMatch(message);
    }
    // Nothing was made under the data directory.
    await expect(readFile(path.join(dir, 'bad', 'server.crt'))).rejects.toThrow(/ENOENT/);
  });

  test('makes a self-signed certificate once, says where, takes heartbeats, counts them, stops on SIGTERM', async () => {
    const port = await freePort();
    const metricsPort = await freePort();
    const dataDir = path.join(dir, 'data');
    const args = ['server', '--data-dir', dataDir, '--metrics-listen', `127.0.0.1:${metricsPort}`];
    const env = { SHEPHERD_BMDB_URL: db.url, SHEPHERD_LISTEN: `127.0.0.1:${port}` };
    const first = start(args, env);
    await first.logged(/BMaaS server listening on 127\.0\.0\.1:\d+/);
    const certPath = path.join(dataDir, 'server.crt');
    expect(first.stdout).toContain(`generated a self-signed server certificate ${certPath}`);
    const ca = await readFile(certPath, 'utf8');

    const bmdb = await openTestBMDB(db);
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const machineId = await newMachine(bmdb.db);
    await setAgentStarted(bmdb.db, machineId, {
      publicKey: Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url'),
    });
    const client = createClient(
      AgentCallback,
      createGrpcTransport({
        baseUrl: `https://localhost:${port}`,
        nodeOptions: {
          ca,
          cert: certificatePem(selfSignedCertificate(privateKey, { commonName: 'agent' })),
          key: privateKey.export({ type: 'pkcs8', format: 'pem' }),
        },
      }),
    );
    await client.heartbeat({ machineId });
    expect((await db.admin('SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])).rowCount).toBe(
      1,
    );
    const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    expect(metrics).toMatch(/bmaas_server_requests_total\{method="Heartbeat",code="ok"\} 1/);
    expect(metrics).toMatch(/bmdb_agent_heartbeat_batch_size_count 1/);

    first.child.kill('SIGTERM');
    const ended = await first.exited;
    expect(ended.code, ended.stderr).toBe(0);
    expect(ended.stderr).toMatch(/SIGTERM: stopping cleanly/);

    // The second start reuses the certificate.
    const second = start(args, env);
    await second.logged(/BMaaS server listening/);
    expect(second.stdout).toContain(`using the self-signed server certificate ${certPath}`);
    expect(await readFile(certPath, 'utf8')).toBe(ca);
    second.child.kill('SIGINT');
    expect((await second.exited).code).toBe(0);
  });

  test('--max-connections, --max-streams-per-connection and --request-timeout hold its clients: a connection past the cap closed, told the stream cap, a slow body cut off naming the time', async () => {
    const port = await freePort();
    const dataDir = path.join(dir, 'limits');
    const server = start([
      'server',
      '--data-dir',
      dataDir,
      '--bmdb-url',
      db.url,
      '--listen',
      `127.0.0.1:${port}`,
      '--max-streams-per-connection',
      '3',
      '--request-timeout',
      '300ms',
      '--max-connections',
      '1',
    ]);
    try {
      await server.logged(/BMaaS server listening/);
      const { privateKey } = generateKeyPairSync('ed25519');
      const options = {
        ca: await readFile(path.join(dataDir, 'server.crt'), 'utf8'),
        cert: certificatePem(selfSignedCertificate(privateKey, { commonName: 'agent' })),
        key: privateKey.export({ type: 'pkcs8', format: 'pem' }),
      };
      const session = connect(`https://localhost:${port}`, options);
      try {
        const stream = session.request({
          ':method': 'POST',
          ':path': '/cloud.bmaas.server.api.AgentCallback/Heartbeat',
          'content-type': 'application/grpc',
          te: 'trailers',
        });
        const headers = new Promise<IncomingHttpHeaders>((resolve) => stream.on('response', resolve));
        // A length prefix promising 100 bytes, and 10 of them.
        stream.write(Buffer.concat([Buffer.from([0, 0, 0, 0, 100]), Buffer.alloc(10)]));
        expect(await headers).toMatchObject({
          'grpc-status': '4',
          'grpc-message': 'request cut off: not whole within 300 ms',
        });
        expect(session.remoteSettings.maxConcurrentStreams).toBe(3);
        // A second connection, past --max-connections 1, is closed as it is accepted.
        const second = connect(`https://localhost:${port}`, options);
        second.on('error', () => {});
        let connected = false;
        second.once('connect', () => {
          connected = true;
        });
        await eventually('the second connection closed', async () => (second.destroyed ? true : undefined));
        expect(connected).toBe(false);
      } finally {
        session.destroy();
      }
    } finally {
      server.child.kill('SIGTERM');
    }
    expect((await server.exited).code).toBe(0);
  });

  test('--web-listen serves the fleet page beside the heartbeats; beyond loopback it wants --web-token and TLS', async () => {
    const refused = await shepherd(['server', '--bmdb-url', db.url, '--web-listen', '0.0.0.0:18080']);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/^shepherd: --web-token: required to serve the fleet page/);
    const plain = await shepherd(['server', '--bmdb-url', db.url, '--web-listen', '0.0.0.0:18080'], {
      SHEPHERD_WEB_TOKEN: 'a-web-token-long-enough',
    });
    expect(plain.code).toBe(2);
    expect(plain.stderr).toMatch(
      /^shepherd: --web-tls-cert: serving the fleet page on 0\.0\.0\.0:18080, beyond loopback, needs TLS/,
    );

    const port = await freePort();
    const webPort = await freePort();
    const server = start([
      'server',
      '--data-dir',
      path.join(dir, 'web'),
      '--bmdb-url',
      db.url,
      '--listen',
      `127.0.0.1:${port}`,
      '--web-listen',
      `127.0.0.1:${webPort}`,
    ]);
    await server.logged(/BMaaS server listening/);
    await server.logged(/serving the fleet page at http:\/\/127\.0\.0\.1:\d+\//);
    const overview = await fetch(`http://127.0.0.1:${webPort}/api/overview`);
    expect(overview.status).toBe(200);
    expect(await overview.json()).toHaveProperty('machines');
    server.child.kill('SIGTERM');
    const ended = await server.exited;
    expect(ended.code, ended.stderr).toBe(0);
  });

  test('--workers 2: both workers take heartbeats on the one port, metrics say which, SIGTERM stops them all', async () => {
    const port = await freePort();
    const metricsPort = await freePort();
    const dataDir = path.join(dir, 'workers');
    const server = start([
      'server',
      '--data-dir',
      dataDir,
      '--bmdb-url',
      db.url,
      '--listen',
      `127.0.0.1:${port}`,
      '--metrics-listen',
      `127.0.0.1:${metricsPort}`,
      '--workers',
      '2',
    ]);
    await server.logged(/BMaaS server listening on 127\.0\.0\.1:\d+ \(2 workers\)/);
    const ca = await readFile(path.join(dataDir, 'server.crt'), 'utf8');

    const bmdb = await openTestBMDB(db);
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const machineId = await newMachine(bmdb.db);
    await setAgentStarted(bmdb.db, machineId, {
      publicKey: Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url'),
    });
    await bmdb.close();
    const cert = certificatePem(selfSignedCertificate(privateKey, { commonName: 'agent' }));
    const key = privateKey.export({ type: 'pkcs8', format: 'pem' });
    // Each client is a connection of its own; the primary hands connections to the workers in turn.
    const okByWorker = async () => {
      const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
      const counts = new Map<string, number>();
      for (const [, worker, count] of text.matchAll(
        /bmaas_server_requests_total\{method="Heartbeat",code="ok",worker="(\d+)"\} (\d+)/g,
      )) {
        counts.set(worker ?? '', Number(count));
      }
      return counts;
    };
    await eventually(async () => {
      const client = createClient(
        AgentCallback,
        createGrpcTransport({ baseUrl: `https://localhost:${port}`, nodeOptions: { ca, cert, key } }),
      );
      await client.heartbeat({ machineId });
      return (await okByWorker()).size === 2 ? true : undefined;
    });
    expect([...(await okByWorker()).keys()].sort()).toEqual(['1', '2']);
    expect((await db.admin('SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])).rowCount).toBe(
      1,
    );
    // The primary offers to read the fleet gauges, after the workers' metrics, without a worker label.
    const primary = await eventually('the primary reached the BMDB', async () => {
      const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
      return /^bmdb_up 1$/m.test(text) ? text : undefined;
    });
    expect(primary).toMatch(/^bmdb_fleet_reader_leading [01]$/m);
    expect(primary).toMatch(/^# TYPE bmdb_fleet_machines gauge$/m);
    const pids = [...server.stderr.matchAll(/server worker \d+ \(pid (\d+)\) started/g)].map(([, pid]) => Number(pid));

    server.child.kill('SIGTERM');
    const ended = await server.exited;
    expect(ended.code, ended.stderr).toBe(0);
    expect(ended.stderr).toMatch(/SIGTERM: stopping the server workers cleanly/);
    expect(ended.stderr.match(/the primary asks to stop: stopping cleanly/g)).toHaveLength(2);
    // No worker outlives the primary.
    expect(pids).toHaveLength(2);
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow(/ESRCH/);
  });

  test('--workers 2: a worker that dies stops the other, and the command fails naming it', async () => {
    const server = start([
      'server',
      '--data-dir',
      path.join(dir, 'workers'),
      '--bmdb-url',
      db.url,
      '--listen',
      `127.0.0.1:${await freePort()}`,
      '--workers',
      '2',
    ]);
    await server.logged(/BMaaS server listening on .* \(2 workers\)/);
    const pids = [...server.stderr.matchAll(/server worker (\d+) \(pid (\d+)\) started/g)].map(([, id, pid]) => ({
      id: Number(id),
      pid: Number(pid),
    }));
    expect(pids).toHaveLength(2);
    const [dead, other] = pids as [{ id: number; pid: number }, { id: number; pid: number }];
    process.kill(dead.pid, 'SIGKILL');
    const ended = await server.exited;
    expect(ended.code, ended.stderr).toBe(1);
    expect(ended.stderr).toContain(`server worker ${dead.id} (pid ${dead.pid}) exited on SIGKILL; stopped the others`);
    expect(() => process.kill(other.pid, 0)).toThrow(/ESRCH/);
  });
});
