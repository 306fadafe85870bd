/**
 * The agent image boots: QEMU (TCG) boots the agent ISO from its CD drive,
 * under SeaBIOS (isolinux) and under OVMF (GRUB EFI), with one machine's
 * config in a copy of the ISO; its /init brings the network up with DHCP
 * and the agent heartbeats to a real BMaaS server on the host, reached from
 * QEMU's user network at 10.0.2.2. A disk behind a MegaRAID controller
 * (QEMU's megasas-gen2, megaraid_sas's) is in its hardware report: the
 * driver was loaded because the device asked for it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { generateKeyPairSync, X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm, truncate, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { agentConfigArchive, buildAgentImage, configureAgentIso, type NetworkConfig } from '@bmaas/agent';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { hardwareReport, newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { AgentHardwareReportSchema, BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { create, fromBinary } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { bundleAgent } from '../../agent/test/bundle-agent.js';
import { missingForAgentImage } from './support.js';

const OVMF = '/usr/share/OVMF/OVMF_CODE.fd';
const missing = await missingForAgentImage();
if (missing.length > 0) {
  console.warn(
    `agent image boot test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`,
  );
}
const { bmdb } = await testBMDB();
const q = bmdb.db;

describe.skipIf(missing.length > 0)('the agent image in QEMU', () => {
  let dir: string;
  let server: BmaasServer;
  let caDer: Uint8Array;
  let iso: string;
  const vms = new Set<ChildProcess>();

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'lab-agent-image-'));
    const bundle = path.join(dir, 'agent.cjs');
    await bundleAgent(bundle);
    const image = await buildAgentImage({
      out: path.join(dir, 'image'),
      cacheDir: path.join(tmpdir(), 'bmaas-agent-image-test-cache'),
      agentBundle: bundle,
    });
    iso = image.iso;
    // QEMU's user network forwards 10.0.2.2 to the host's loopback.
    const tls = await selfSignedServerTls(dir, { altNames: ['10.0.2.2'] });
    caDer = new X509Certificate(tls.cert).raw;
    server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  }, 300_000);

  afterAll(async () => {
    for (const vm of vms) vm.kill('SIGKILL');
    await server?.close();
    await rm(dir, { recursive: true, force: true });
  });

  /** QEMU's user network: its DHCP hands out 10.0.2.15, the same address a static configuration can take. */
  const STATIC = { interface: '52:54:00:12:34:56', address: '10.0.2.15/24', gateway: '10.0.2.2', dns: ['10.0.2.3'] };
  /** The same, as a takeover captures it from the OS it replaces: the NIC by its MAC, under another name. */
  const CAPTURED: NetworkConfig = {
    interfaces: [
      {
        name: 'enp0s3',
        kind: 'device',
        mac: '52:54:00:12:34:56',
        mtu: 1500,
        addresses: ['10.0.2.15/24'],
        dhcp: false,
        routes: [{ destination: '0.0.0.0/0', gateway: '10.0.2.2' }],
      },
    ],
    nameservers: ['10.0.2.3'],
  };
  /**
   * Boots the agent ISO with a new machine's config (its network as handed over) in QEMU with `args`,
   * until that machine's agent heartbeated; the VM stays up until killed.
   */
  async function bootAgent(
    args: readonly string[],
    handedOver: Pick<Parameters<typeof agentConfigArchive>[0], 'network' | 'capturedNetwork'>,
  ): Promise<{ machineId: string; vm: ChildProcess; serialText: () => Promise<string>; seconds: string }> {
    const machineId = await newMachine(q);
    const { publicKey, privateKey } = generateKeyPairSync('ed25519');
    await setAgentStarted(q, machineId, {
      publicKey: publicKey.export({ format: 'der', type: 'spki' }).subarray(-32),
    });
    const init = create(TakeoverInitSchema, {
      machineId,
      bmaasEndpoint: `10.0.2.2:${server.port}`,
      caCertificate: caDer,
    });
    const config = path.join(dir, `${machineId}.cpio`);
    await writeFile(config, agentConfigArchive({ init, privateKey, flags: ['--interval=2s'], ...handedOver }));
    const machineIso = path.join(dir, `${machineId}.iso`);
    await configureAgentIso(iso, config, machineIso);
    const serial = path.join(dir, `${machineId}.serial`);
    const started = performance.now();
    const vm = spawn(
      'qemu-system-x86_64',
      [
        '-m',
        '1024',
        ...args,
        '-cdrom',
        machineIso,
        '-display',
        'none',
        '-serial',
        `file:${serial}`,
        '-nic',
        'user,model=virtio-net-pci',
        '-no-reboot',
      ],
      { stdio: 'ignore' },
    );
    vms.add(vm);
    const serialText = () => readFile(serial, 'utf8').catch(() => '');
    await eventually(
      'the agent started',
      async () => ((await serialText()).includes('bmaas-init: starting the agent') ? true : undefined),
      400_000,
    );
    await eventually(
      'a heartbeat recorded',
      async () =>
        (
          await bmdb.db
            .selectFrom('machine_agent_heartbeat')
            .select('agent_heartbeat_at')
            .where('machine_id', '=', machineId)
            .executeTakeFirst()
        )?.agent_heartbeat_at,
      300_000,
    );
    return { machineId, vm, serialText, seconds: ((performance.now() - started) / 1000).toFixed(0) };
  }

  test.each([
    ['BIOS', 'DHCP', []],
    ['UEFI', 'DHCP', ['-bios', OVMF]],
    ['BIOS', 'a static network handed over', []],
    ['BIOS', 'the network a takeover captured', []],
  ] as const)(
    'the agent ISO boots under %s with %s and its agent heartbeats to the server',
    async (firmware, network, args) => {
      const handedOver =
        network === 'DHCP'
          ? {}
          : network === 'the network a takeover captured'
            ? { capturedNetwork: CAPTURED }
            : { network: STATIC };
      const { machineId, vm, serialText, seconds } = await bootAgent(args, handedOver);
      process.stdout.write(
        `agent ISO, ${firmware}, ${network}: first heartbeat ${seconds} s after QEMU started (load average ${loadavg()[0]?.toFixed(1)})\n`,
      );
      expect(await serialText()).toContain(
        {
          DHCP: 'eth0: 10.0.2.15/24 (DHCP)',
          'a static network handed over': 'bmaas-init: eth0: 10.0.2.15/24 (handed over)',
          // Found by its MAC as eth0 here, and set up by network-up.
          'the network a takeover captured': 'bmaas-agent: network: ip addr add 10.0.2.15/24 dev eth0',
        }[network],
      );
      expect(await hardwareReport(q, machineId)).toBeDefined();
      if (firmware === 'UEFI') {
        // efivarfs is a module: the kernel asked the image's /sbin/modprobe for it at the mount.
        expect(await serialText()).not.toContain('efivarfs not mounted');
      }
      vm.kill('SIGKILL');
      vms.delete(vm);
    },
  );

  test('under SeaBIOS, a disk behind a MegaRAID controller (megasas-gen2) is in the hardware report with its serial', async () => {
    const disk = path.join(dir, 'raid-disk.img');
    await writeFile(disk, '');
    await truncate(disk, 64 * 2 ** 20);
    const { machineId, vm, serialText, seconds } = await bootAgent(
      [
        '-device',
        'megasas-gen2,id=raid',
        '-drive',
        `if=none,id=raid-disk,file=${disk},format=raw`,
        '-device',
        'scsi-hd,drive=raid-disk,bus=raid.0,serial=LAB-RAID-0001',
      ],
      {},
    );
    process.stdout.write(
      `agent ISO, a disk behind megasas-gen2: first heartbeat ${seconds} s after QEMU started (load average ${loadavg()[0]?.toFixed(1)})\n`,
    );
    const raw = (await hardwareReport(q, machineId))?.raw;
    const sent = raw === undefined ? undefined : fromBinary(AgentHardwareReportSchema, raw);
    expect(sent?.report?.blockDevice.map((d) => d.serialNumber)).toContain('LAB-RAID-0001');
    // Loaded because the controller asked for it.
    expect(await serialText()).toMatch(/bmaas-init: drivers loaded: .*\bmegaraid_sas\b/);
    // Every storage and network controller of the VM has its driver: no warning names one.
    expect(sent?.warning.filter((w) => w.includes('no driver bound'))).toEqual([]);
    vm.kill('SIGKILL');
    vms.delete(vm);
  });
});
