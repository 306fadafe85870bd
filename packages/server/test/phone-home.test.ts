/**
 * The installed OS's first boot over real TLS against a real BMDB: the
 * request's hostname, SSH keys and network reach the agent in the
 * heartbeat's answer; the Success report carries the hash of the secret
 * the agent put on the config drive; and the OS's report (an HTTPS POST as
 * cloud-init's phone_home sends it, no client certificate) marks the
 * installation booted only with that secret, once.
 */
import { createHash, randomBytes } from 'node:crypto';
import { request as httpsRequest } from 'node:https';
import { connect } from 'node:tls';
import type { Database } from '@bmaas/bmdb-controlloop';
import { osInstallation, requestOSInstallation } from '@bmaas/bmdb-model';
import type { Kysely } from 'kysely';
import { Registry } from 'prom-client';
import { beforeAll, describe, expect, test } from 'vitest';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { BmaasServer, selfSignedServerTls } from '../src/index.js';
import { agentClient, agentIdentity, startedMachine, startTestServer, type TestServer } from './helpers.js';

let t: TestServer;
let q: Kysely<Database>;
const registry = new Registry();

beforeAll(async () => {
  t = await startTestServer(registry);
  q = t.bmdb.db;
});

const OPERATOR_KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOp1bV7Yq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5Qe alice@ops';
const HOST_ED25519 = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH0st0Kq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5QeA root@db1';
const NETWORK = {
  interfaces: [
    { kind: 'device' as const, name: 'eno1', mac: '0c:c4:7a:00:00:01', addresses: [], dhcp: true, routes: [] },
  ],
  nameservers: ['192.0.2.53'],
};

/** A POST as cloud-init's phone_home makes it: form-encoded, N/A for the key types the OS lacks. */
function phoneHome(
  path: string,
  method = 'POST',
  keys: Record<string, string> = {},
): Promise<{ status: number; body: string }> {
  const form = new URLSearchParams({
    pub_key_rsa: 'N/A',
    pub_key_ecdsa: 'N/A',
    pub_key_ed25519: `${HOST_ED25519}\n`,
    ...keys,
    instance_id: path.split('/')[2] ?? '',
    hostname: 'db1',
    fqdn: 'db1.example.com',
  }).toString();
  return new Promise((resolve, reject) => {
    const request = httpsRequest(
      {
        host: '127.0.0.1',
        port: t.server.port,
        servername: 'localhost',
        ca: t.ca,
        path,
        method,
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
      },
      (response) => {
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => {
          body += chunk;
        });
        response.on('end', () => resolve({ status: response.statusCode ?? 0, body }));
      },
    );
    request.on('error', reject);
    request.end(method === 'POST' ? form : undefined);
  });
}

/** A machine whose agent was handed its request, installed it and reported Success with the secret's hash. */
async function installedWithSecret(): Promise<{ machineId: string; secret: string }> {
  const agent = agentIdentity();
  const machineId = await startedMachine(t.bmdb, agent);
  await requestOSInstallation(q, machineId, {
    imageUrl: 'https://images.example.com/debian.img',
    imageSha256: 'ab'.repeat(32),
    rootDevice: '/dev/vda',
    hostname: 'db1',
    sshPublicKeys: [OPERATOR_KEY],
    network: NETWORK,
    actor: 'test',
    reason: 'first boot test',
  });
  const client = agentClient(t.server.port, t.ca, agent);
  const answer = await client.heartbeat({ machineId });
  const image = answer.installationRequest?.type;
  expect(image?.case).toBe('diskImage');
  expect(image?.value).toMatchObject({ hostname: 'db1', sshPublicKeys: [OPERATOR_KEY] });
  expect(JSON.parse(image?.case === 'diskImage' ? image.value.networkJson : '')).toEqual(NETWORK);
  const secret = randomBytes(32).toString('base64url');
  const bootSecretSha256 = createHash('sha256').update(secret).digest();
  await client.heartbeat({
    machineId,
    installationReport: { generation: 1n, result: { case: 'success', value: { bootSecretSha256 } } },
  });
  expect((await osInstallation(q, machineId))?.state).toBe('Succeeded');
  return { machineId, secret };
}

describe('the first boot report', () => {
  test('a wrong secret is refused and changes nothing; the right one marks it booted with the host keys; again, nothing changes', async () => {
    const { machineId, secret } = await installedWithSecret();
    const logged = captureDebugLog('bmaas:*');
    try {
      const wrong = await phoneHome(`/phone-home/${machineId}/${randomBytes(32).toString('base64url')}`);
      expect(wrong.status).toBe(403);
      expect(wrong.body).toContain(`machine ${machineId}: no installation of it holds that secret`);
      expect(await osInstallation(q, machineId)).toMatchObject({ firstBoot: 'booting', bootedAt: null });

      const right = await phoneHome(`/phone-home/${machineId}/${secret}`);
      expect(right.status).toBe(200);
      const booted = await osInstallation(q, machineId);
      expect(booted).toMatchObject({ firstBoot: 'booted', bootedHostKeys: [HOST_ED25519] });
      expect(right.body).toBe(`machine ${machineId} booted at ${booted?.bootedAt?.toISOString()}\n`);

      const again = await phoneHome(`/phone-home/${machineId}/${secret}`);
      expect(again).toEqual(right);
      expect(await osInstallation(q, machineId)).toEqual(booted);
    } finally {
      logged.restore();
    }
    expect(logged.lines.some((line) => line.includes(`machine ${machineId} reported its first boot`))).toBe(true);
    expect(logged.lines.join('\n')).not.toContain(secret);
    const counted = await registry.getSingleMetricAsString('bmaas_server_requests_total');
    expect(counted).toContain('bmaas_server_requests_total{method="PhoneHome",code="ok"} 2');
    expect(counted).toContain('bmaas_server_requests_total{method="PhoneHome",code="permission_denied"} 1');
  });

  test('the report of Debian 12’s cloud-init, with the DSA host key it still makes, marks it booted with the keys sshd offers', async () => {
    const { machineId, secret } = await installedWithSecret();
    // cloud-init 22.4 makes an ssh-dss host key and posts it as pub_key_dsa; sshd offers none since OpenSSH 7.0.
    const blob = Buffer.concat([Buffer.from([0, 0, 0, 7]), Buffer.from('ssh-dss'), randomBytes(64)]);
    const report = await phoneHome(`/phone-home/${machineId}/${secret}`, 'POST', {
      pub_key_dsa: `ssh-dss ${blob.toString('base64')} root@db1\n`,
    });
    expect(report.status).toBe(200);
    expect(await osInstallation(q, machineId)).toMatchObject({ firstBoot: 'booted', bootedHostKeys: [HOST_ED25519] });
  });

  test('another machine’s secret, a malformed path or secret, and a GET are refused, naming what is wrong', async () => {
    const first = await installedWithSecret();
    const second = await installedWithSecret();
    expect((await phoneHome(`/phone-home/${second.machineId}/${first.secret}`)).status).toBe(403);
    const short = await phoneHome(`/phone-home/${second.machineId}/short`);
    expect(short).toEqual({
      status: 400,
      body: `first boot report of machine ${second.machineId}: the secret is not 43 base64url characters\n`,
    });
    expect((await phoneHome(`/phone-home/${second.machineId}`)).status).toBe(404);
    expect((await phoneHome(`/phone-home/${second.machineId}/${second.secret}`, 'GET')).status).toBe(405);
    expect(await osInstallation(q, second.machineId)).toMatchObject({ bootedAt: null });
    expect(await osInstallation(q, first.machineId)).toMatchObject({ bootedAt: null });
  });
});

describe('the first boot report and the server’s limits', () => {
  test('a report whose body never comes is cut off at requestTimeout, its connection closed unanswered, nothing written', async () => {
    const own = new Registry();
    // The file's server's certificate, which the clients trust.
    const tls = await selfSignedServerTls(t.dir);
    const server = await BmaasServer.start({
      bmdb: t.bmdb,
      listen: { host: '127.0.0.1', port: 0 },
      tls,
      metrics: own,
      limits: { requestTimeout: 300 },
    });
    try {
      const { machineId, secret } = await installedWithSecret();
      const socket = connect({
        host: '127.0.0.1',
        port: server.port,
        servername: 'localhost',
        ca: t.ca,
        ALPNProtocols: ['http/1.1'],
      });
      let answered = '';
      socket.setEncoding('utf8');
      socket.on('data', (chunk: string) => {
        answered += chunk;
      });
      const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
      const logged = captureDebugLog('bmaas:*');
      socket.once('secureConnect', () =>
        socket.write(
          `POST /phone-home/${machineId}/${secret} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\npub_key`,
        ),
      );
      try {
        await closed;
      } finally {
        logged.restore();
      }
      expect(answered).toBe('');
      expect(logged.lines.join('\n')).toContain(
        `cut off a first boot report of machine ${machineId}: request cut off: not whole within 300 ms`,
      );
      expect(logged.lines.join('\n')).not.toContain(secret);
      expect(await own.getSingleMetricAsString('bmaas_server_requests_cut_off_total')).toContain(
        'bmaas_server_requests_cut_off_total{limit="requestTimeout"} 1',
      );
      expect(await osInstallation(q, machineId)).toMatchObject({ bootedAt: null });

      // The parts swapped: what stands where the machine ID goes is not logged.
      const swapped = connect({
        host: '127.0.0.1',
        port: server.port,
        servername: 'localhost',
        ca: t.ca,
        ALPNProtocols: ['http/1.1'],
      });
      const swappedClosed = new Promise<void>((resolve) => swapped.once('close', () => resolve()));
      const swappedLog = captureDebugLog('bmaas:*');
      swapped.once('secureConnect', () =>
        swapped.write(
          `POST /phone-home/${secret}/${machineId} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n`,
        ),
      );
      try {
        await swappedClosed;
      } finally {
        swappedLog.restore();
      }
      expect(swappedLog.lines.join('\n')).toContain('cut off a first boot report of machine (not a machine ID)');
      expect(swappedLog.lines.join('\n')).not.toContain(secret);
    } finally {
      await server.close();
    }
  });
});
