/**
 * The proof with the image operators use: Debian 12's cloud image
 * (`buildCloudImage`, a qcow2 of Debian's packages) installed by the real
 * agent onto two blank VMs booted through their BMCs (Redfish virtual
 * media), one whose disk sits behind a MegaRAID SAS controller under
 * SeaBIOS, one on NVMe under OVMF. `shepherd install` gives each its host
 * name, an SSH key and user data, and one a static address; the agent writes
 * the image and a config drive; each OS boots from its disk, cloud-init
 * reads the drive and phones home with its host keys. The test logs into
 * each OS over SSH with that key, checks its host name, address and user
 * data, and finds the machine `booted` in `shepherd status` with the host
 * key the OS presented. Prints each VM's time from `shepherd install` to its
 * SSH login with the load average.
 */
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { onPath } from '@bmaas/provider-static/testing';
import { type HostKeyPinStore, Ssh2Client, SshKey } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { bundleAgent } from '../../agent/test/bundle-agent.js';
import { buildCloudImage, CLOUD_IMAGE_CACHE, type CloudImage, LAB_SSH_PORT, Lab } from '../src/index.js';
import {
  enrolledWithHardwareReport,
  LabTimings,
  labEventually,
  missingForBlankLab,
  reportedHardware,
  seconds,
} from './support.js';

const missing = await missingForBlankLab();
if (!(await onPath('mmdebstrap'))) missing.push('mmdebstrap');
const root = process.getuid?.() === 0;
if (missing.length > 0) {
  console.warn(
    `lab cloud install test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`,
  );
} else if (!root) {
  console.warn('lab cloud install test skipped: building the cloud image needs root (mmdebstrap --mode=root)');
}

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const CACHE = path.join(ROOT, '.tmp/lab-cache');
const SHEPHERD = path.join(ROOT, 'packages/cli/bin/shepherd.js');
const execute = promisify(execFile);
/** The NVMe VM's static address; QEMU's user network is 10.0.2.0/24, its gateway 10.0.2.2, DNS 10.0.2.3. */
const STATIC_ADDRESS = '10.0.2.50';

describe.skipIf(missing.length > 0 || !root)(
  'the Debian 12 cloud image installed on blank VMs booted by their BMCs',
  () => {
    let db: TestDatabase;
    let dir: string;
    let lab: Lab;
    let image: CloudImage;
    let imageSha256: string;
    let imageServer: Server;
    let imageUrl: string;
    let imagePort: number;
    let key: SshKey;
    const timings = new LabTimings('lab cloud install');
    const timing = (line: string) => timings.record(line);

    beforeAll(async () => {
      // The lab runs the built packages: the CLI, and the agent's bundle.
      execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['--build'], { cwd: ROOT, stdio: 'inherit' });
      db = await createTestDatabase();
      dir = await mkdtemp(path.join(tmpdir(), 'lab-cloud-install-test-'));
      let before = Date.now();
      image = await buildCloudImage({ cacheDir: CLOUD_IMAGE_CACHE });
      timing(`cloud image ${image.cached ? 'from the cache' : 'built'} in ${seconds(before)}`);
      imageSha256 = createHash('sha256')
        .update(await readFile(image.path))
        .digest('hex');
      ({ server: imageServer, port: imagePort } = await serveFile(image.path));
      imageUrl = `http://10.0.2.2:${imagePort}/debian-12.qcow2`;
      key = await SshKey.loadOrGenerate(path.join(dir, 'operator_key'));
      const agentBundle = path.join(dir, 'agent.cjs');
      await bundleAgent(agentBundle);
      before = Date.now();
      lab = await Lab.start({
        agentBundle,
        vms: 2,
        dir: path.join(dir, 'lab'),
        cacheDir: CACHE,
        shepherd: SHEPHERD,
        bmdbUrl: db.url,
        webListen: `127.0.0.1:${await freePort()}`,
        heartbeatInterval: '1s',
        protocol: () => 'redfish',
        agentBoot: () => 'virtual-media',
        firmware: (index) => (index === 0 ? 'bios' : 'uefi'),
        diskController: (index) => (index === 0 ? 'megasas' : 'nvme'),
        sshGuestAddress: (index) => (index === 1 ? STATIC_ADDRESS : undefined),
        runFlags: { 'agent-booter-db-query-rate': '250ms,4', 'recoverer-first-heartbeat-timeout': '10m' },
      });
      timing(`agent image, 2 blank VMs, BMCs, shepherd run static and shepherd server started in ${seconds(before)}`);
    }, 1_200_000);
    afterAll(async () => {
      await lab?.stop();
      imageServer?.close();
      if (dir) await rm(dir, { recursive: true, force: true });
      timings.summarize();
    });

    const within = <T>(what: string, check: () => Promise<T | undefined>, timeout = 900_000) =>
      labEventually(lab, what, check, timeout, 1_000);

    test('each blank VM is booted into the agent by its BMC, which sees its disk behind megasas or on NVMe', async () => {
      await Promise.all(
        lab.machines.map(async (machine) => {
          const agent = await within(`${machine.id}'s agent enrolled with a hardware report`, () =>
            enrolledWithHardwareReport(db, machine),
          );
          timing(`${machine.id} (${machine.vm.options.diskController}): agent enrolled`);
          expect((await reportedHardware(db, agent.machineId)).serials).toContain(machine.diskSerial);
        }),
      );
    });

    test('installed with the image, each OS lets the key in and shows its host name, address, user data, and reads booted with the host key it presents', async () => {
      const results = await Promise.all(
        lab.machines.map(async (machine, index) => {
          const hostname = `cloud-${machine.id}`;
          const token = `user data of ${hostname} ${Date.now()}`;
          const files = path.join(dir, machine.id);
          await writeFile(`${files}.pub`, `${key.authorizedKey}\n`);
          await writeFile(
            `${files}.user-data`,
            ['#cloud-config', 'write_files:', '  - path: /run/lab-user-data', `    content: "${token}"`, ''].join('\n'),
          );
          const network = index === 1 ? [`--network`, `${files}.network`] : [];
          if (index === 1) {
            await writeFile(
              `${files}.network`,
              JSON.stringify({
                interfaces: [
                  {
                    kind: 'device',
                    name: 'lan0',
                    mac: machine.mac,
                    addresses: [`${STATIC_ADDRESS}/24`],
                    routes: [{ destination: '0.0.0.0/0', gateway: '10.0.2.2' }],
                  },
                ],
                nameservers: ['10.0.2.3'],
              }),
            );
          }
          const requested = Date.now();
          await execute(process.execPath, [
            SHEPHERD,
            'install',
            ...['--bmdb-url', db.url, '--provider', 'Static', '--provider-id', machine.id],
            ...['--image-url', imageUrl, '--image-sha256', imageSha256],
            ...['--root-device-hint', `serialNumber=${machine.diskSerial}`],
            ...['--hostname', hostname, '--ssh-key', `${files}.pub`, '--user-data', `${files}.user-data`],
            ...network,
            ...['--reason', 'lab cloud install test'],
          ]);
          await within(`${machine.id} installed`, async () => {
            const { rows } = await db.admin(
              `SELECT q.installation_state, q.installation_error FROM machine_os_installation_request q
             JOIN machine_provided p USING (machine_id) WHERE p.provider_id = $1`,
              [machine.id],
            );
            const row = rows[0];
            if (row?.installation_state === 'Failed') throw new Error(`installation failed: ${row.installation_error}`);
            return row?.installation_state === 'Succeeded' ? true : undefined;
          });
          timing(`${machine.id}: installed ${seconds(requested)} after shepherd install`);
          const presented: string[] = [];
          const ssh = await within(`${machine.id}'s installed OS lets the key in`, () =>
            new Ssh2Client({ privateKey: key.privateKey, username: 'debian', hostKeys: recordingPins(presented) })
              .dial({ host: machine.address, port: LAB_SSH_PORT }, { connectTimeout: 30_000 })
              .catch(() => undefined),
          );
          timing(
            `${machine.id} (${machine.vm.firmware}, ${machine.vm.options.diskController}): SSH login ${seconds(requested)} after shepherd install`,
          );
          try {
            const shell = async (command: string) =>
              Buffer.from((await ssh.execute(command, new Uint8Array())).stdout)
                .toString()
                .trim();
            return {
              machine,
              hostname,
              token,
              presented: presented.at(-1),
              seen: {
                hostname: await shell('hostname'),
                userData: await shell('cat /run/lab-user-data'),
                addresses: await shell('ip -o -4 addr show scope global'),
                // cloud-init's end: the phone home comes in its final stage.
                cloudInit: await shell('cloud-init status --wait >/dev/null; cloud-init status'),
              },
            };
          } finally {
            await ssh.close();
          }
        }),
      );
      for (const { machine, hostname, token, seen } of results) {
        expect(seen.hostname).toBe(hostname);
        expect(seen.userData).toBe(token);
        expect(seen.cloudInit).toContain('status: done');
        if (machine === lab.machines[1]) {
          // Static: no lease's lifetime on it, and no lease beside it. (cloud-init finds the NIC by its MAC
          // and keeps the kernel's name for it.)
          expect(seen.addresses).not.toContain('10.0.2.15');
          expect(seen.addresses).toMatch(
            new RegExp(`inet ${STATIC_ADDRESS.replaceAll('.', '\\.')}/24 .*valid_lft forever`),
          );
        } else {
          expect(seen.addresses).toMatch(/inet 10\.0\.2\.15\/24 .*dynamic/);
        }
      }
      const status = await within('both machines booted', async () => {
        const { stdout } = await execute(process.execPath, [SHEPHERD, 'status', '--json', '--bmdb-url', db.url]);
        const parsed = JSON.parse(stdout) as {
          installedOSes: { providerId: string | null; firstBoot: string; hostKeys: string[] }[];
        };
        const booted = parsed.installedOSes.filter((i) => i.firstBoot === 'booted');
        return booted.length === lab.machines.length ? parsed : undefined;
      });
      for (const { machine, presented } of results) {
        const installed = status.installedOSes.find((i) => i.providerId === machine.id);
        expect(installed?.firstBoot).toBe('booted');
        expect(installed?.hostKeys.map(fingerprint)).toContain(presented);
      }
    });
  },
);

/** A pin store that pins nothing for good: it records each fingerprint presented. */
function recordingPins(presented: string[]): HostKeyPinStore {
  return {
    get: async () => undefined,
    pin: async (_id, fingerprint) => {
      presented.push(fingerprint);
      return fingerprint;
    },
    unpin: async () => undefined,
  };
}

/** An OpenSSH public key line's fingerprint as SSH clients print it: `SHA256:` and the unpadded base64 of its blob's sha256. */
function fingerprint(line: string): string {
  const blob = Buffer.from(line.split(/\s+/)[1] ?? '', 'base64');
  return `SHA256:${createHash('sha256').update(blob).digest('base64').replace(/=+$/, '')}`;
}

/** Serves `file` over plain HTTP on 127.0.0.1 at any path, with one `Range: bytes=a-b` honoured (the agent reads a qcow2's tables by range). */
async function serveFile(file: string): Promise<{ server: Server; port: number }> {
  const size = (await stat(file)).size;
  const server = createServer((request, response) => {
    const range = /^bytes=(\d+)-(\d*)$/.exec(request.headers.range ?? '');
    if (!range) {
      response.writeHead(200, { 'content-length': size });
      createReadStream(file).pipe(response);
      return;
    }
    const start = Number(range[1]);
    const end = Math.min(range[2] ? Number(range[2]) : size - 1, size - 1);
    response.writeHead(206, { 'content-range': `bytes ${start}-${end}/${size}`, 'content-length': end - start + 1 });
    createReadStream(file, { start, end }).pipe(response);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, port: (server.address() as AddressInfo).port };
}
