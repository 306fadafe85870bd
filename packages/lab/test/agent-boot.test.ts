/**
 * The lab's blank machines: QEMU VMs with empty disks and no OS, whose
 * agents arrive through their BMCs, with no SSH anywhere. `shepherd run
 * static` runs the agent booter over an inventory whose entries say
 * `"agentBoot": "virtual-media"` (a Redfish BMC: the fake BMC downloads the
 * ISO the shepherd names into the VM's directory and puts it in the VM's CD
 * drive over QMP; its boot override `Cd` boots the drive) or `"network"`
 * (an IPMI BMC, ipmi_sim: `chassis bootdev pxe` boots the VM's NIC, whose
 * iPXE ROM is handed the shepherd's iPXE script for its MAC by QEMU's DHCP).
 * Each VM boots the real agent image; the agent enrolls with the one-time
 * token its boot carried and heartbeats with a hardware report showing the
 * disk serial and MAC QEMU was given; the virtual media is ejected after.
 * Each path's time from the BMC's power on to the enrollment is printed
 * with the load average.
 */
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, open, readFile, rm } from 'node:fs/promises';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startedAgents } from '../../../test/support/agents.js';
import { createTestDatabase, type TestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { bundleAgent } from '../../agent/test/bundle-agent.js';
import { buildBootImage, findKernel, Lab, type LabMachine } from '../src/index.js';
import { sshBanner } from '../src/vm.js';
import {
  enrolledWithHardwareReport,
  LabTimings,
  labEventually,
  missingForBlankLab,
  reportedHardware,
  seconds,
} from './support.js';

const missing = await missingForBlankLab();
if (missing.length > 0) {
  console.warn(`lab agent boot test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`);
}

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const CACHE = path.join(ROOT, '.tmp/lab-cache');
const SHEPHERD = path.join(ROOT, 'packages/cli/bin/shepherd.js');
const execute = promisify(execFile);

describe.skipIf(missing.length > 0)('the lab’s blank machines, booted by their BMCs', () => {
  let db: TestDatabase;
  let dir: string;
  let lab: Lab;
  const timings = new LabTimings('lab agent boot');
  const timing = (line: string) => timings.record(line);

  beforeAll(async () => {
    // The lab runs the built packages: the CLI, and ipmi_sim's chassis control.
    execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['--build'], { cwd: ROOT, stdio: 'inherit' });
    db = await createTestDatabase();
    dir = await mkdtemp(path.join(tmpdir(), 'lab-agent-boot-test-'));
    const agentBundle = path.join(dir, 'agent.cjs');
    await bundleAgent(agentBundle);
    const before = Date.now();
    lab = await Lab.start({
      agentBundle,
      vms: 3,
      dir: path.join(dir, 'lab'),
      cacheDir: CACHE,
      shepherd: SHEPHERD,
      bmdbUrl: db.url,
      webListen: `127.0.0.1:${await freePort()}`,
      heartbeatInterval: '1s',
      protocol: (index) => (index === 1 ? 'ipmi' : 'redfish'),
      // The first virtual media VM under OVMF (its ISO boots GRUB EFI; its installed image the agent's boot
      // entry or OVMF's own for the disk), the network VM under SeaBIOS (iPXE's BIOS ROM), and a second
      // virtual media VM under SeaBIOS (its ISO boots isolinux).
      firmware: (index) => (index === 0 ? 'uefi' : 'bios'),
      agentBoot: (index) => (index === 1 ? 'network' : 'virtual-media'),
      runFlags: { 'agent-booter-db-query-rate': '250ms,4', 'recoverer-first-heartbeat-timeout': '10m' },
    });
    timing(`agent image, 3 blank VMs, BMCs, shepherd run static and shepherd server started in ${seconds(before)}`);
  }, 600_000);
  afterAll(async () => {
    await lab?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
    timings.summarize();
  });

  const within = <T>(what: string, check: () => Promise<T | undefined>, timeout = 400_000) =>
    labEventually(lab, what, check, timeout, 500);

  /** Waits for `machine`'s agent to enroll and report its hardware; prints the time from its power on. */
  async function enrolled(machine: LabMachine, path: string): Promise<string> {
    const agent = await within(`${machine.id}'s agent enrolled, heartbeating with a hardware report`, () =>
      enrolledWithHardwareReport(db, machine),
    );
    const enrolledAt = Date.now() - agent.startedAgo * 1000;
    const poweredOn = machine.vm.lastResetAt;
    expect(poweredOn).toBeDefined();
    timing(
      `${machine.id} (${path}): enrolled ${((enrolledAt - (poweredOn ?? 0)) / 1000).toFixed(1)} s after its BMC powered it on`,
    );
    const hardware = await reportedHardware(db, agent.machineId);
    expect(hardware.serials).toContain(machine.diskSerial);
    expect(hardware.macs).toContain(machine.mac);
    // The agent environment booted, from the BMC's boot, and nothing answers SSH on the machine.
    expect(await readFile(machine.vm.consoleLog, 'utf8')).toContain('bmaas-init: agent environment starting');
    expect(await sshBanner(machine.address, 2222)).toBe(false);
    return agent.machineId;
  }

  test('a blank Redfish VM boots the agent ISO from virtual media and its agent enrolls', async () => {
    const machine = lab.machines[0] as LabMachine;
    expect(machine.agentBoot).toBe('virtual-media');
    const bmc = lab.redfish;
    if (bmc === undefined) throw new Error('the lab has no Redfish BMC');
    await enrolled(machine, 'virtual media, Redfish, UEFI');
    expect(machine.vm.firmware).toBe('uefi');
    expect(machine.vm.bootSource).toBe('cdrom');
    const told = bmc.told(machine.id);
    expect(told[0]).toMatch(/^InsertMedia http:\/\/10\.0\.2\.2:\d+\/agent-boot\/b\/[A-Za-z0-9_-]{43}\/agent\.iso/);
    expect(told[1]).toMatch(/^BootOverride Cd Once UEFI/);
    // Enrolled, its media is ejected: the BMC's, and the VM's CD drive with it.
    await within(`${machine.id}'s virtual media ejected`, async () =>
      bmc.told(machine.id).includes('EjectMedia') ? true : undefined,
    );
    expect(bmc.virtualMedia(machine.id).inserted).toBe(false);
    expect((await readFile(path.join(machine.vm.options.dir, 'cdrom-media'), 'utf8')).trim()).toBe('');
  });

  test('a blank IPMI VM boots the agent over the network through iPXE and its agent enrolls', async () => {
    const machine = lab.machines[1] as LabMachine;
    expect(machine.agentBoot).toBe('network');
    await enrolled(machine, 'network, iPXE, IPMI, BIOS');
    // Booted from its NIC (iPXE writes to the screen, not the serial console the log has).
    expect(machine.vm.bootSource).toBe('network');
  });

  test('a blank Redfish VM under SeaBIOS boots the agent ISO (isolinux) from virtual media and its agent enrolls', async () => {
    const machine = lab.machines[2] as LabMachine;
    expect(machine.agentBoot).toBe('virtual-media');
    await enrolled(machine, 'virtual media, Redfish, BIOS');
    expect(machine.vm.firmware).toBe('bios');
    expect(lab.redfish?.told(machine.id)[1]).toMatch(/^BootOverride Cd Once/);
  });

  /** Serves the images to install over HTTPS with the server's certificate, which the agents trust. */
  async function imageServer(
    images: Map<string, Buffer>,
  ): Promise<{ url: (name: string) => string; close: () => void }> {
    const tlsDir = path.join(lab.options.dir, 'server-tls');
    const server = createServer(
      { cert: await readFile(path.join(tlsDir, 'server.crt')), key: await readFile(path.join(tlsDir, 'server.key')) },
      (request, response) => {
        const image = images.get((request.url ?? '').slice(1));
        return image ? response.end(image) : response.writeHead(404).end();
      },
    );
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as AddressInfo).port;
    return { url: (name) => `https://10.0.2.2:${port}/${name}`, close: () => server.close() };
  }

  /** `shepherd install` of `image` on `machine`, its root disk named by its serial number alone. */
  async function install(machine: LabMachine, url: string, image: Buffer): Promise<void> {
    await execute(process.execPath, [
      SHEPHERD,
      'install',
      ...['--bmdb-url', db.url, '--provider', 'Static', '--provider-id', machine.id],
      ...['--image-url', url, '--image-sha256', createHash('sha256').update(image).digest('hex')],
      ...['--root-device-hint', `serialNumber=${machine.diskSerial}`, '--compression', 'gzip'],
      ...['--reason', 'lab agent boot test'],
    ]);
  }

  /** Waits for `machine`'s installation of `generation` to succeed and its image's first boot from its disk. */
  async function installed(machine: LabMachine, generation: number, bootLine: string): Promise<void> {
    await within(`${machine.id} installed (generation ${generation})`, async () => {
      const { rows } = await db.admin(
        `SELECT q.generation, q.installation_state, q.installation_error FROM machine_os_installation_request q
         JOIN machine_provided p USING (machine_id) WHERE p.provider_id = $1`,
        [machine.id],
      );
      const row = rows[0];
      if (row?.installation_state === 'Failed') throw new Error(`installation failed: ${row.installation_error}`);
      return row?.installation_state === 'Succeeded' && Number(row.generation) === generation ? true : undefined;
    });
    await within(`${machine.id} booted the installed image`, async () =>
      (await readFile(machine.vm.consoleLog, 'utf8')).includes(bootLine) ? true : undefined,
    );
  }

  test('the virtual media VM is installed by its disk serial, then reinstalled through an agent its BMC boots again', async () => {
    const machine = lab.machines[0] as LabMachine;
    const bmc = lab.redfish;
    if (bmc === undefined) throw new Error('the lab has no Redfish BMC');
    const bootImage = async (marker: string) => {
      await mkdir(path.join(dir, marker));
      return buildBootImage(path.join(dir, marker), findKernel(), marker);
    };
    const first = await bootImage('first');
    const second = await bootImage('second');
    const images = new Map([
      ['first.img.gz', gzipSync(await readFile(first.path))],
      ['second.img.gz', gzipSync(await readFile(second.path))],
    ]);
    const server = await imageServer(images);
    try {
      let phase = Date.now();
      await install(machine, server.url('first.img.gz'), images.get('first.img.gz') as Buffer);
      await installed(machine, 1, first.bootLine);
      timing(`${machine.id}: installed by its disk serial and booted from its disk in ${seconds(phase)}`);
      // Installed: its agent is gone, and the BMC's CD holds nothing.
      expect((await startedAgents(db, 'providerId')).has(machine.id)).toBe(false);
      expect(bmc.virtualMedia(machine.id).inserted).toBe(false);
      const inserts = () => bmc.told(machine.id).filter((line) => line.startsWith('InsertMedia')).length;
      expect(inserts()).toBe(1);

      // A second installation: no agent runs, so the booter boots one through the BMC again, which installs.
      phase = Date.now();
      await install(machine, server.url('second.img.gz'), images.get('second.img.gz') as Buffer);
      await installed(machine, 2, second.bootLine);
      timing(
        `${machine.id}: reinstalled through an agent booted from virtual media, booted from its disk in ${seconds(phase)}`,
      );
      expect(inserts()).toBe(2);
      const text = await readFile(machine.vm.consoleLog, 'utf8');
      // The agent environment booted between the two images' boots.
      const agentBoots = [...text.matchAll(/bmaas-init: agent environment starting/g)].map((m) => m.index);
      expect(agentBoots.length).toBe(2);
      expect(text.indexOf(first.bootLine)).toBeLessThan(agentBoots[1] as number);
      expect(text.lastIndexOf(second.bootLine)).toBeGreaterThan(agentBoots[1] as number);
      // Under OVMF each image booted through the boot entry its agent wrote: BootCurrent names it.
      for (const [generation, image] of [first, second].entries()) {
        const entry = new RegExp(`installed generation ${generation + 1}: .*, boot entry (\\d+)`).exec(text);
        expect(entry, `the agent of generation ${generation + 1} wrote a boot entry`).not.toBeNull();
        const number = Number(entry?.[1]).toString(16).toUpperCase().padStart(4, '0');
        expect(text).toContain(`${image.bootLine} under UEFI, BootCurrent Boot${number} "BMaaS installed OS (vda)"`);
      }
      expect(bmc.virtualMedia(machine.id).inserted).toBe(false);
    } finally {
      server.close();
    }
  });

  test('the installed VM is decommissioned with a wipe by an agent its BMC boots: its disk is zero at both ends', async () => {
    const machine = lab.machines[0] as LabMachine;
    const disk = path.join(machine.vm.options.dir, 'disk.img');
    const MiB = 2 ** 20;
    // Something at the disk's far end too (the image lies at its start), so a wipe that skipped it would show.
    const handle = await open(disk, 'r+');
    const size = (await handle.stat()).size;
    await handle.write(Buffer.alloc(MiB, 0xab), 0, MiB, size - MiB);
    await handle.close();
    const { rows: provided } = await db.admin(
      "SELECT machine_id FROM machine_provided WHERE provider = 'Static' AND provider_id = $1",
      [machine.id],
    );
    const machineId = provided[0]?.machine_id as string;
    const phase = Date.now();
    const { stdout } = await execute(process.execPath, [
      SHEPHERD,
      'decommission',
      ...['--bmdb-url', db.url, '--provider', 'Static', '--provider-id', machine.id],
      ...['--wipe', '--reason', 'lab agent boot test'],
    ]);
    expect(stdout).toMatch(new RegExp(`wiped and removed Static ${machine.id}`));
    timing(`${machine.id}: decommissioned with a wipe (its agent booted from virtual media) in ${seconds(phase)}`);
    // Gone from the BMDB and retired: the inventory still lists the VM, and no later pass brings it in again.
    const { rows } = await db.admin('SELECT 1 FROM machine_provided WHERE machine_id = $1', [machineId]);
    expect(rows).toEqual([]);
    const { rows: retired } = await db.admin(
      "SELECT machine_id, wiped FROM machine_retired WHERE provider = 'Static' AND provider_id = $1",
      [machine.id],
    );
    expect(retired).toEqual([{ machine_id: machineId, wiped: true }]);
    const ends = await open(disk, 'r');
    const head = Buffer.alloc(MiB);
    const tail = Buffer.alloc(MiB);
    await ends.read(head, 0, MiB, 0);
    await ends.read(tail, 0, MiB, size - MiB);
    await ends.close();
    expect(head.equals(Buffer.alloc(MiB))).toBe(true);
    expect(tail.equals(Buffer.alloc(MiB))).toBe(true);
  });
});
