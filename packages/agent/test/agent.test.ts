import { execFile } from 'node:child_process';
import { createHash, X509Certificate } from 'node:crypto';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import {
  addProvided,
  cancelOSInstallation,
  hardwareReport,
  machineDetail,
  newMachine,
  osInstallation,
  requestDiskWipe,
  requestOSInstallation,
  setAgentStarted,
  startFleetMetrics,
} from '@bmaas/bmdb-model';
import { AgentHardwareReportSchema, BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { parseTakeoverResponse } from '@bmaas/shepherd-manager';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { type AgentEnd, runAgent } from '../src/agent.js';
import type { AgentService } from '../src/callback/heartbeat-client.js';
import { IN_PLACE_WARNING, takeover } from '../src/takeover.js';
import { gptDiskImage, LINUX_TYPE_GUID } from './disk-image-builder.js';
import { biosInformation, endOfTable, memoryDevice, systemInformation } from './smbios-builder.js';

const run = promisify(execFile);
const IMAGE_PARTITION = '11111111-2222-4333-8444-555555555555';

/**
 * The disk holds `written` as an installation leaves it: the image's body
 * byte for byte (its own backup GPT header, at its end, zeroed), its MBR's
 * boot code, and a GPT of the image's partition, unchanged, and the config
 * drive (config-2) at the disk's end.
 */
async function expectInstalled(disk: string, written: Buffer): Promise<void> {
  const bytes = await readFile(disk);
  expect(bytes.subarray(MiB, written.length - 512).equals(written.subarray(MiB, written.length - 512))).toBe(true);
  expect(bytes.subarray(0, 446).equals(written.subarray(0, 446))).toBe(true);
  const table = JSON.parse((await run('sfdisk', ['--json', disk])).stdout).partitiontable;
  expect(
    table.partitions.map((p: { start: number; size: number; uuid: string; name: string }) => [
      p.start,
      p.size,
      p.uuid,
      p.name,
    ]),
  ).toEqual([
    [2048, 6109 - 2048 + 1, IMAGE_PARTITION.toUpperCase(), 'part'],
    [bytes.length / 512 - 2048 - 64 * 2048, 64 * 2048, expect.any(String), 'config-2'],
  ]);
}

const fixture = fileURLToPath(new URL('./fixtures/bios-vm/', import.meta.url));
const { bmdb } = await testBMDB();
const q = bmdb.db;
const MiB = 2 ** 20;
/** When the machine's agent last heartbeated, as the server recorded it. */
const lastHeartbeat = async (machineId: string): Promise<Date | undefined> =>
  (
    await bmdb.db
      .selectFrom('machine_agent_heartbeat')
      .select('agent_heartbeat_at')
      .where('machine_id', '=', machineId)
      .executeTakeFirst()
  )?.agent_heartbeat_at;
/** A 3 MiB whole-disk image: a GPT with one Linux partition, its bytes a pattern. */
const image = gptDiskImage(3 * MiB, [{ type: LINUX_TYPE_GUID, guid: IMAGE_PARTITION, firstLba: 2048, lastLba: 6109 }]);
/** What a disk the agent installs onto holds: the image, then room for its config drive at the end. */
const INSTALL_DISK_BYTES = 72 * MiB;
const gzipped = gzipSync(image);
const sha256 = createHash('sha256').update(gzipped).digest('hex');

let server: BmaasServer;
let images: Server;
let imageUrl: string;
let dir: string;
let caDer: Uint8Array;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-loop-'));
  const tls = await selfSignedServerTls(dir);
  caDer = new X509Certificate(tls.cert).raw;
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  images = createServer((_request, response) => response.end(gzipped));
  await new Promise<void>((resolve) => images.listen(0, '127.0.0.1', resolve));
  imageUrl = `http://127.0.0.1:${(images.address() as AddressInfo).port}/image.raw.gz`;
});

afterAll(async () => {
  await server?.close();
  await new Promise((resolve) => images?.close(resolve));
  await rm(dir, { recursive: true, force: true });
});

/**
 * A machine whose agent took over as the shepherd's initializer sees it: the
 * agent's answer to a TakeoverInit passes the initializer's own checks, and
 * its key is recorded as AgentStarted. Then the agent runs, heartbeating
 * every 100 ms with the recorded BIOS VM as its hardware.
 */
async function startedAgent(
  service: AgentService,
  port = server.port,
  root = fixture,
  logFile?: string,
  inPlace?: string,
) {
  const machineId = await newMachine(q);
  const sent = { machineId, bmaasEndpoint: `localhost:${port}`, caCertificate: caDer };
  const answer = takeover(toBinary(TakeoverInitSchema, create(TakeoverInitSchema, sent)));
  if (!answer.ok) throw new Error(answer.message);
  const { key, warnings } = parseTakeoverResponse(answer.response, sent);
  expect(warnings).toEqual([IN_PLACE_WARNING]);
  await setAgentStarted(q, machineId, { publicKey: key });
  const lines: string[] = [];
  const stop = new AbortController();
  const ended: Promise<AgentEnd> = runAgent({
    init: answer.init,
    privateKey: answer.privateKey,
    intervalMs: 100,
    service,
    root,
    signal: stop.signal,
    log: (line) => lines.push(line),
    logFile,
    inPlace,
  });
  return { machineId, stop, ended, lines };
}

/** A copy of the recorded BIOS VM whose disk vda is a file of `bytes` (8 MiB) of `fill` under its dev/: `/dev/vda` to the agent. */
async function biosVmWithDisk(name: string, fill = 0xaa, bytes = 8 * MiB): Promise<{ root: string; disk: string }> {
  const root = path.join(dir, name);
  await cp(fixture, root, { recursive: true, verbatimSymlinks: true });
  await mkdir(path.join(root, 'dev'), { recursive: true });
  const disk = path.join(root, 'dev/vda');
  await writeFile(disk, Buffer.alloc(bytes, fill));
  return { root, disk };
}

describe('the agent against the BMaaS server, over TLS with its client certificate', () => {
  test.each(['cloud.agent.api', 'cloud.bmaas.server.api'] as const)(
    'under %s: heartbeats, and its hardware report is stored',
    async (service) => {
      const agent = await startedAgent(service);
      try {
        const stored = await eventually('hardware report stored', () => hardwareReport(q, agent.machineId));
        const report = fromBinary(AgentHardwareReportSchema, stored.raw);
        expect(report.report?.manufacturer).toBe('QEMU');
        expect(report.report?.blockDevice.map((disk) => disk.serialNumber)).toEqual(['0x1b2c3d4e', 'vm-disk-1']);
        expect(report.warning).toEqual([expect.stringMatching(/^SMBIOS table .* unreadable/)]);
        const first = await lastHeartbeat(agent.machineId);
        await eventually('a later heartbeat', async () => {
          const later = await lastHeartbeat(agent.machineId);
          return later && first && later > first ? later : undefined;
        });
      } finally {
        agent.stop.abort();
      }
      expect(await agent.ended).toBe('stopped');
      expect(agent.lines.filter((line) => line.includes('hardware report'))).toEqual([
        'hardware report: SMBIOS table /sys/firmware/dmi/tables/DMI unreadable: DMI names from /sys/class/dmi/id, memory from sysfs',
        'heartbeat accepted with a hardware report',
      ]);
    },
  );

  test('sends the tail of its log file when it changed, and not while it stays the same', async () => {
    const logFile = path.join(dir, 'agent-log-test.log');
    await writeFile(logFile, 'bmaas-init: starting the agent\n');
    const agent = await startedAgent('cloud.agent.api', server.port, fixture, logFile);
    try {
      const first = await eventually(
        'the log stored',
        async () => (await machineDetail(q, agent.machineId))?.agentLog ?? undefined,
      );
      expect(first.text).toBe('bmaas-init: starting the agent\n');
      // Unchanged, it is not sent again: heartbeats go on, and the stored log keeps its time.
      const at = await eventually('a heartbeat after the log', async () => {
        const heartbeat = await lastHeartbeat(agent.machineId);
        return heartbeat && heartbeat > first.receivedAt ? heartbeat : undefined;
      });
      await eventually('another heartbeat', async () => {
        const heartbeat = await lastHeartbeat(agent.machineId);
        return heartbeat && heartbeat > at ? heartbeat : undefined;
      });
      expect((await machineDetail(q, agent.machineId))?.agentLog).toEqual(first);
      await writeFile(logFile, 'installing generation 1\n', { flag: 'a' });
      const next = await eventually('the changed log stored', async () => {
        const log = (await machineDetail(q, agent.machineId))?.agentLog;
        return log && log.receivedAt > first.receivedAt ? log : undefined;
      });
      expect(next.text).toBe('bmaas-init: starting the agent\ninstalling generation 1\n');
    } finally {
      agent.stop.abort();
    }
    expect(await agent.ended).toBe('stopped');
  });

  test("from the recorded two-socket server: its report is the machine's detail, and its totals the fleet's hardware gauges", async () => {
    // The recorded tree with the SMBIOS table of its 12 DIMMs of 16 GiB, as the hardware tests build it.
    const root = path.join(dir, 'two-socket-server-report');
    await cp(fileURLToPath(new URL('./fixtures/two-socket-server/', import.meta.url)), root, {
      recursive: true,
      verbatimSymlinks: true,
    });
    await mkdir(path.join(root, 'sys/firmware/dmi/tables'), { recursive: true });
    await writeFile(
      path.join(root, 'sys/firmware/dmi/tables/DMI'),
      Buffer.concat([
        biosInformation(true),
        systemInformation('Dell Inc.', 'PowerEdge R640', '7XQ2K93'),
        ...Array.from({ length: 12 }, (_, i) => memoryDevice(0x1100 + i, 16384)),
        endOfTable(),
      ]),
    );
    const agent = await startedAgent('cloud.agent.api', server.port, root);
    // A place of its own, so the gauges' labels single it out of the file's other machines.
    await addProvided(q, agent.machineId, { provider: 'Static', providerId: 'r640-1', providerLocation: 'gauge-rack' });
    const registry = new Registry();
    const reader = startFleetMetrics(bmdb, { registry, interval: 1000 });
    try {
      await eventually('hardware report stored', () => hardwareReport(q, agent.machineId));
      const detail = await machineDetail(q, agent.machineId);
      expect(detail?.hardware?.unreadable).toBeUndefined();
      expect(detail?.hardware?.report).toMatchObject({
        system: { manufacturer: 'Dell Inc.', product: 'PowerEdge R640', serialNumber: '7XQ2K93' },
        boot: 'EFI',
        memory: { installedBytes: 192 * 2 ** 30 },
        cpus: [
          { vendor: 'GenuineIntel', model: 'Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz', cores: 16, threads: 32 },
          { vendor: 'GenuineIntel', model: 'Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz', cores: 16, threads: 32 },
        ],
        warnings: [],
      });
      expect(
        detail?.hardware?.report?.disks.map((d) => [
          d.model,
          d.serialNumber,
          d.wwn,
          d.sizeBytes,
          d.protocol,
          d.rotational,
        ]),
      ).toEqual([
        ['SAMSUNG MZQLB960HAJR-00007', 'S437NA0M512345', '0x0025385b71b0fa2e', 1875385008 * 512, 'NVMe', false],
        ['INTEL SSDSC2KB48', 'BTYF01234567480BGN', '0x55cd2e414f8a1b2c', 937703088 * 512, 'ATA', false],
        ['ST2000NM0135', 'ZC20ABCD0000C8123456', '0x5000c500a1b2c3d4', 3907029168 * 512, 'SCSI', true],
      ]);
      expect(detail?.hardware?.report?.disks.map((d) => d.health)).toEqual([
        { criticalWarning: false },
        { criticalWarning: false },
        { criticalWarning: false },
      ]);
      expect(detail?.hardware?.report?.nics).toEqual([
        { mac: 'b0:26:28:1a:2b:3c', driver: 'bnxt_en', linkUp: true, speedBytesPerSecond: 25e9 / 8 },
        { mac: 'b0:26:28:1a:2b:3d', driver: 'bnxt_en', linkUp: true, speedBytesPerSecond: 25e9 / 8 },
        { mac: 'b0:26:28:1a:2b:3e', driver: 'igb', linkUp: true, speedBytesPerSecond: 1e9 / 8 },
        { mac: 'b0:26:28:1a:2b:3f', driver: 'igb', linkUp: false, speedBytesPerSecond: 0 },
      ]);

      const place = 'location=gauge-rack,provider=Static';
      const gauge = async (name: string) => {
        const metric = registry.getSingleMetric(name);
        const sample = (await metric?.get())?.values.find(
          (v) => `location=${v.labels.location},provider=${v.labels.provider}` === place,
        );
        return sample?.value;
      };
      await eventually('the hardware gauges read', async () =>
        (await gauge('bmdb_fleet_hardware_machines')) === 1 ? true : undefined,
      );
      expect({
        cpuThreads: await gauge('bmdb_fleet_hardware_cpu_threads'),
        memoryBytes: await gauge('bmdb_fleet_hardware_memory_bytes'),
        disks: await gauge('bmdb_fleet_hardware_disks'),
        diskBytes: await gauge('bmdb_fleet_hardware_disk_bytes'),
      }).toEqual({
        cpuThreads: 64,
        memoryBytes: 192 * 2 ** 30,
        disks: 3,
        diskBytes: (1875385008 + 937703088 + 3907029168) * 512,
      });
    } finally {
      agent.stop.abort();
      await reader.close();
    }
  });

  test('wipes every disk when asked: the wipe is reported Succeeded, and the agent stops rather than reboots', async () => {
    const root = path.join(dir, 'two-socket-server-wipe');
    await cp(fileURLToPath(new URL('./fixtures/two-socket-server/', import.meta.url)), root, {
      recursive: true,
      verbatimSymlinks: true,
    });
    for (const disk of ['nvme0n1', 'sda', 'sdb'])
      await writeFile(path.join(root, 'dev', disk), Buffer.alloc(4 * MiB, 0xaa));
    const agent = await startedAgent('cloud.bmaas.server.api', server.port, root);
    try {
      const wipe = await requestDiskWipe(q, agent.machineId, { actor: 'test', reason: 'agent wipe test' });
      expect(wipe).toMatchObject({ kind: 'DiskWipe', imageUrl: '', rootDevice: undefined, decommission: false });
      expect(await agent.ended).toBe('wiped');
      expect(await osInstallation(q, agent.machineId)).toMatchObject({
        generation: wipe.generation,
        kind: 'DiskWipe',
        state: 'Succeeded',
        error: null,
      });
      for (const disk of ['nvme0n1', 'sda', 'sdb']) {
        const bytes = await readFile(path.join(root, 'dev', disk));
        expect(
          bytes.subarray(0, MiB).every((byte) => byte === 0),
          disk,
        ).toBe(true);
        expect(
          bytes.subarray(bytes.length - MiB).every((byte) => byte === 0),
          disk,
        ).toBe(true);
      }
      expect(agent.lines).toContain(`wiping every disk for generation ${wipe.generation}`);
      expect(agent.lines).toContain('wiped; stopping');
    } finally {
      agent.stop.abort();
    }
  });

  test('installs what it is asked: an Error report on a bad checksum, then Success on the next request, then stops', async () => {
    const { root, disk } = await biosVmWithDisk('bios-vm-install', 0xaa, INSTALL_DISK_BYTES);
    const agent = await startedAgent('cloud.agent.api', server.port, root);
    try {
      const request = {
        imageUrl,
        rootDevice: '/dev/vda',
        compression: 'gzip' as const,
        actor: 'test',
        reason: 'agent test',
      };
      const wrong = await requestOSInstallation(q, agent.machineId, { ...request, imageSha256: '0'.repeat(64) });
      const failed = await eventually('the first installation failed', async () => {
        const installation = await osInstallation(q, agent.machineId);
        return installation?.state === 'Failed' ? installation : undefined;
      });
      expect(failed.generation).toBe(wrong.generation);
      expect(failed.error).toContain(`sha256 of ${imageUrl} is ${sha256}, want ${'0'.repeat(64)}`);
      expect((await readFile(disk)).subarray(0, MiB).every((byte) => byte === 0)).toBe(true);

      const right = await requestOSInstallation(q, agent.machineId, { ...request, imageSha256: sha256 });
      expect(await agent.ended).toBe('installed');
      const installed = await osInstallation(q, agent.machineId);
      expect(installed).toMatchObject({ generation: right.generation, state: 'Succeeded', error: null });
      await expectInstalled(disk, image);
      expect(agent.lines).toContain('installed; no reboot command: stopping as if rebooted');
    } finally {
      agent.stop.abort();
    }
  });

  test('gives the installed OS a config drive with the request’s hostname, keys and network, whose phone home marks it booted', async () => {
    const { root, disk } = await biosVmWithDisk('bios-vm-first-boot', 0, INSTALL_DISK_BYTES);
    const agent = await startedAgent('cloud.agent.api', server.port, root);
    const key = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOp1bV7Yq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5Qe alice@ops';
    try {
      await requestOSInstallation(q, agent.machineId, {
        imageUrl,
        imageSha256: sha256,
        rootDevice: '/dev/vda',
        compression: 'gzip',
        hostname: 'db1',
        sshPublicKeys: [key],
        actor: 'test',
        reason: 'first boot',
      });
      expect(await agent.ended).toBe('installed');
      await expectInstalled(disk, image);
      const table = JSON.parse((await run('sfdisk', ['--json', disk])).stdout).partitiontable;
      const at = `${disk}@@${table.partitions[1].start * 512}`;
      const env = { ...process.env, MTOOLS_SKIP_CHECK: '1' };
      const read = async (name: string) =>
        JSON.parse((await run('mtype', ['-i', at, `::/openstack/latest/${name}`], { env })).stdout);
      expect(await read('meta_data.json')).toMatchObject({
        uuid: agent.machineId,
        hostname: 'db1',
        public_keys: { 'key-0': key },
      });
      // No network in the request: DHCP on the recorded VM's NIC, by its MAC.
      const network = await read('network_data.json');
      expect(network.networks).toEqual([{ id: 'network0', type: 'ipv4_dhcp', link: 'nic0' }]);
      expect(network.links).toEqual([
        { id: 'nic0', type: 'phy', ethernet_mac_address: expect.stringMatching(/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/) },
      ]);
      const cloudConfig = JSON.parse((await read('vendor_data.json'))['cloud-init'].replace('#cloud-config\n', ''));
      expect(cloudConfig.ca_certs.trusted).toEqual([new X509Certificate(caDer).toString()]);
      const url = new URL(cloudConfig.phone_home.url);
      expect(url.origin).toBe(`https://localhost:${server.port}`);
      expect(url.pathname).toMatch(new RegExp(`^/phone-home/${agent.machineId}/[A-Za-z0-9_-]{43}$`));
      expect(agent.lines.join('\n')).not.toContain(url.pathname.split('/')[3]);
      expect(await osInstallation(q, agent.machineId)).toMatchObject({ state: 'Succeeded', firstBoot: 'booting' });

      // The installed OS, come up, posts there as cloud-init's phone_home does.
      const status = await new Promise<number | undefined>((resolve, reject) =>
        httpsRequest(url, { method: 'POST', ca: cloudConfig.ca_certs.trusted[0] }, (response) => {
          response.resume();
          resolve(response.statusCode);
        })
          .on('error', reject)
          .end('pub_key_ed25519=N%2FA&instance_id=x'),
      );
      expect(status).toBe(200);
      expect(await osInstallation(q, agent.machineId)).toMatchObject({ firstBoot: 'booted' });
    } finally {
      agent.stop.abort();
    }
  });

  test('installs onto the disk its request names by serial number alone, from the recorded two-socket server', async () => {
    // The recorded sysfs tree, with files standing in for its SATA (sda) and SAS (sdb) disks' nodes.
    const root = path.join(dir, 'two-socket-server');
    await cp(fileURLToPath(new URL('./fixtures/two-socket-server/', import.meta.url)), root, {
      recursive: true,
      verbatimSymlinks: true,
    });
    await writeFile(path.join(root, 'dev/sda'), Buffer.alloc(8 * MiB, 0xaa));
    await writeFile(path.join(root, 'dev/sdb'), Buffer.alloc(INSTALL_DISK_BYTES, 0xaa));
    const agent = await startedAgent('cloud.agent.api', server.port, root);
    try {
      await requestOSInstallation(q, agent.machineId, {
        imageUrl,
        imageSha256: sha256,
        rootDeviceHints: { serialNumber: 'ZC20ABCD0000C8123456' },
        compression: 'gzip',
        actor: 'test',
        reason: 'agent test by serial',
      });
      expect(await agent.ended).toBe('installed');
      expect(await osInstallation(q, agent.machineId)).toMatchObject({ state: 'Succeeded', rootDevice: undefined });
      await expectInstalled(path.join(root, 'dev/sdb'), image);
      expect((await readFile(path.join(root, 'dev/sda'))).every((byte) => byte === 0xaa)).toBe(true);
    } finally {
      agent.stop.abort();
    }
  });

  test('a Success report of a request replaced while it finished is ignored: the agent installs the newer one, not reboots', async () => {
    // A server of its own, stopped while the older image finishes and the newer is requested, so
    // the agent's next heartbeat carries the older Success to a BMDB that already wants the newer.
    // The same certificate as the file's server: the one the agent's TakeoverInit trusts.
    const tls = await selfSignedServerTls(dir);
    let own = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
    const port = own.port;
    const older = gptDiskImage(
      3 * MiB,
      [{ type: LINUX_TYPE_GUID, guid: IMAGE_PARTITION, firstLba: 2048, lastLba: 6109 }],
      0x3c,
    );
    const olderGzipped = gzipSync(older);
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const gate = createServer((_request, response) => {
      response.write(olderGzipped.subarray(0, olderGzipped.length - 1));
      void released.then(() => response.end(olderGzipped.subarray(olderGzipped.length - 1)));
    });
    await new Promise<void>((resolve) => gate.listen(0, '127.0.0.1', resolve));
    const { root, disk } = await biosVmWithDisk('bios-vm-replaced', 0, INSTALL_DISK_BYTES);
    const agent = await startedAgent('cloud.agent.api', port, root);
    try {
      const request = { rootDevice: '/dev/vda', compression: 'gzip' as const, actor: 'test', reason: 'agent test' };
      const first = await requestOSInstallation(q, agent.machineId, {
        ...request,
        imageUrl: `http://127.0.0.1:${(gate.address() as AddressInfo).port}/older.raw.gz`,
        imageSha256: createHash('sha256').update(olderGzipped).digest('hex'),
      });
      await eventually(
        'installing the older image',
        async () => agent.lines.includes(`installing generation ${first.generation}`) || undefined,
      );
      await own.close(0);
      const second = await requestOSInstallation(q, agent.machineId, { ...request, imageUrl, imageSha256: sha256 });
      release();
      await eventually(
        'the older image written',
        async () => agent.lines.some((l) => l.startsWith(`installed generation ${first.generation}:`)) || undefined,
      );
      own = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port }, tls });
      expect(await agent.ended).toBe('installed');
      expect(agent.lines).toContain(
        `installation report of generation ${first.generation} ignored: its request is no longer current`,
      );
      expect(agent.lines).toContain(`installation report of generation ${second.generation} accepted`);
      expect(agent.lines.filter((l) => l.startsWith('installed; '))).toHaveLength(1);
      expect(await osInstallation(q, agent.machineId)).toMatchObject({
        generation: second.generation,
        state: 'Succeeded',
      });
      await expectInstalled(disk, image);
    } finally {
      agent.stop.abort();
      release();
      gate.closeAllConnections();
      await new Promise((resolve) => gate.close(resolve));
      await own.close(0);
    }
  });

  test('an installation whose request is canceled is stopped', async () => {
    const { root } = await biosVmWithDisk('bios-vm-canceled', 0);
    const agent = await startedAgent('cloud.agent.api', server.port, root);
    const stall = createServer(() => {});
    await new Promise<void>((resolve) => stall.listen(0, '127.0.0.1', resolve));
    try {
      await requestOSInstallation(q, agent.machineId, {
        imageUrl: `http://127.0.0.1:${(stall.address() as AddressInfo).port}/never`,
        imageSha256: sha256,
        rootDevice: '/dev/vda',
        actor: 'test',
        reason: 'agent test',
      });
      await eventually('installing', async () =>
        agent.lines.some((l) => l.startsWith('installing')) ? true : undefined,
      );
      await cancelOSInstallation(q, agent.machineId, { actor: 'test', reason: 'changed my mind' });
      await eventually('installation stopped', async () =>
        agent.lines.some((l) => /installation of generation \d+ no longer asked for: stopping it/.test(l))
          ? true
          : undefined,
      );
    } finally {
      agent.stop.abort();
      stall.closeAllConnections();
      await new Promise((resolve) => stall.close(resolve));
    }
    expect(await agent.ended).toBe('stopped');
  });

  test('running in place, it refuses installations and wipes, saying why, and its hardware report (the machine page) says it runs in place', async () => {
    const { root, disk } = await biosVmWithDisk('bios-vm-in-place');
    const why = 'kexec_load_disabled is set';
    const agent = await startedAgent('cloud.agent.api', server.port, root, undefined, why);
    try {
      const detail = await eventually('the hardware report stored', async () => {
        const machine = await machineDetail(q, agent.machineId);
        return machine?.hardware?.report ? machine : undefined;
      });
      expect(detail.hardware?.report?.warnings).toContain(
        "the agent runs in place on the machine's own OS (kexec_load_disabled is set): it refuses installations and wipes",
      );
      const asked = await requestOSInstallation(q, agent.machineId, {
        imageUrl,
        imageSha256: sha256,
        rootDevice: '/dev/vda',
        compression: 'gzip',
        actor: 'test',
        reason: 'agent test in place',
      });
      const failed = await eventually('the installation refused', async () => {
        const installation = await osInstallation(q, agent.machineId);
        return installation?.state === 'Failed' ? installation : undefined;
      });
      expect(failed.error).toBe(
        `installation of generation ${asked.generation} refused: the agent runs in place on the machine's own OS (kexec_load_disabled is set), whose disk it would overwrite under it; boot the machine into the agent image (a takeover with kexec, or its BMC's agent boot) first`,
      );
      const wipe = await requestDiskWipe(q, agent.machineId, { actor: 'test', reason: 'agent test in place' });
      const wipeFailed = await eventually('the wipe refused', async () => {
        const installation = await osInstallation(q, agent.machineId);
        return installation?.generation === wipe.generation && installation.state === 'Failed'
          ? installation
          : undefined;
      });
      expect(wipeFailed.error).toMatch(
        new RegExp(`^disk wipe of generation ${wipe.generation} refused: the agent runs in place`),
      );
      expect((await readFile(disk)).every((byte) => byte === 0xaa)).toBe(true);
    } finally {
      agent.stop.abort();
    }
    expect(await agent.ended).toBe('stopped');
  });

  test('refused for a key that is not its machine’s, it keeps trying with backoff', async () => {
    const machineId = await newMachine(q);
    const sent = { machineId, bmaasEndpoint: `localhost:${server.port}`, caCertificate: caDer };
    const answer = takeover(toBinary(TakeoverInitSchema, create(TakeoverInitSchema, sent)));
    if (!answer.ok) throw new Error(answer.message);
    // Another agent's key recorded: this one's heartbeats are refused.
    await setAgentStarted(q, machineId, { publicKey: new Uint8Array(32).fill(7) });
    const lines: string[] = [];
    const stop = new AbortController();
    const ended = runAgent({
      init: answer.init,
      privateKey: answer.privateKey,
      intervalMs: 100,
      root: fixture,
      signal: stop.signal,
      log: (l) => lines.push(l),
    });
    await eventually('two refusals', async () =>
      lines.filter((l) => l.includes('machine id or public key unknown')).length >= 2 ? true : undefined,
    );
    stop.abort();
    expect(await ended).toBe('stopped');
    expect(await lastHeartbeat(machineId)).toBeUndefined();
  });
});
