/**
 * The agent image boots: QEMU (TCG) boots the agent ISO from its CD drive,
 * under SeaBIOS (isolinux) and under OVMF (GRUB EFI), with one machine's
 * config in a copy of the ISO; its /init brings the network up with DHCP
 * and the agent heartbeats to a real BMaaS server on the host, reached from
 * QEMU's user network at 10.0.2.2.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { generateKeyPairSync, X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { agentConfigArchive, buildAgentImage, configureAgentIso, type NetworkConfig } from '@bmaas/agent';
import { hardwareReport, newMachine, setAgentStarted } from '@bmaas/bmdb-controlloop';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { create } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { TakeoverInitSchema } from '../../agent/src/gen/cloud/agent/api/takeover_pb.js';
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
  test.each([
    ['BIOS', 'DHCP', []],
    ['UEFI', 'DHCP', ['-bios', OVMF]],
    ['BIOS', 'a static network handed over', []],
    ['BIOS', 'the network a takeover captured', []],
  ] as const)(
    'the agent ISO boots under %s with %s and its agent heartbeats to the server',
    async (firmware, network, args) => {
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
      const handedOver =
        network === 'DHCP'
          ? {}
          : network === 'the network a takeover captured'
            ? { capturedNetwork: CAPTURED }
            : { network: STATIC };
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
      const seconds = ((performance.now() - started) / 1000).toFixed(0);
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
      vm.kill('SIGKILL');
      vms.delete(vm);
    },
  );
});
