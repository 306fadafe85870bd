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
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { AgentHardwareReportSchema } from '@bmaas/server';
import { fromBinary } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startedAgents } from '../../../test/support/agents.js';
import { createTestDatabase, type TestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { eventually } from '../../../test/support/wait.js';
import { bundleAgent } from '../../agent/test/bundle-agent.js';
import { Lab, type LabMachine } from '../src/index.js';
import { missingForBlankLab } from './support.js';

const missing = await missingForBlankLab();
if (missing.length > 0) {
  console.warn(`lab agent boot test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`);
}

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const CACHE = path.join(ROOT, '.tmp/lab-cache');

describe.skipIf(missing.length > 0)('the lab’s blank machines, booted by their BMCs', () => {
  let db: TestDatabase;
  let dir: string;
  let lab: Lab;
  const started = Date.now();
  const timings: string[] = [];
  function timing(line: string): void {
    const text = `lab agent boot timing: ${line} (load ${loadavg()[0]?.toFixed(2)})`;
    timings.push(text);
    console.log(text);
  }

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
      vms: 2,
      dir: path.join(dir, 'lab'),
      cacheDir: CACHE,
      shepherd: path.join(ROOT, 'packages/cli/bin/shepherd.js'),
      bmdbUrl: db.url,
      webListen: `127.0.0.1:${await freePort()}`,
      heartbeatInterval: '1s',
      protocol: (index) => (index === 0 ? 'redfish' : 'ipmi'),
      firmware: () => 'bios',
      agentBoot: (index) => (index === 0 ? 'virtual-media' : 'network'),
      runFlags: { 'agent-booter-db-query-rate': '250ms,4', 'recoverer-first-heartbeat-timeout': '10m' },
    });
    timing(`agent image, 2 blank VMs, BMCs, shepherd run static and shepherd server started in ${seconds(before)}`);
  }, 600_000);
  afterAll(async () => {
    await lab?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
    console.log(`lab agent boot test: ${seconds(started)} in all\n${timings.join('\n')}`);
  });

  async function within<T>(what: string, check: () => Promise<T | undefined>, timeout = 400_000): Promise<T> {
    try {
      return await eventually(what, check, timeout, 500);
    } catch (error) {
      throw new Error(
        `${(error as Error).message}\nshepherd run:\n${lab.run?.output.slice(-4000)}\nshepherd server:\n${lab.server?.output.slice(-2000)}`,
      );
    }
  }

  /** The disk serials and MACs of a machine's stored hardware report. */
  async function reported(machineId: string): Promise<{ serials: string[]; macs: string[] }> {
    const { rows } = await db.admin('SELECT hardware_report_raw FROM machine_hardware_report WHERE machine_id = $1', [
      machineId,
    ]);
    const report = fromBinary(AgentHardwareReportSchema, rows[0].hardware_report_raw).report;
    return {
      serials: report?.blockDevice.map((disk) => disk.serialNumber) ?? [],
      macs:
        report?.networkInterface.map((nic) =>
          [...nic.mac].map((byte) => byte.toString(16).padStart(2, '0')).join(':'),
        ) ?? [],
    };
  }

  /** Waits for `machine`'s agent to enroll and report its hardware; prints the time from its power on. */
  async function enrolled(machine: LabMachine, path: string): Promise<string> {
    const agent = await within(`${machine.id}'s agent enrolled, heartbeating with a hardware report`, async () => {
      const found = (await startedAgents(db, 'providerId')).get(machine.id);
      if (found?.heartbeatAgo === null || found === undefined) return undefined;
      const { rows } = await db.admin('SELECT 1 FROM machine_hardware_report WHERE machine_id = $1', [found.machineId]);
      return rows.length > 0 ? found : undefined;
    });
    const enrolledAt = Date.now() - agent.startedAgo * 1000;
    const poweredOn = machine.vm.lastResetAt;
    expect(poweredOn).toBeDefined();
    timing(
      `${machine.id} (${path}): enrolled ${((enrolledAt - (poweredOn ?? 0)) / 1000).toFixed(1)} s after its BMC powered it on`,
    );
    const hardware = await reported(agent.machineId);
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
    await enrolled(machine, 'virtual media, Redfish');
    expect(machine.vm.bootSource).toBe('cdrom');
    const told = bmc.told(machine.id);
    expect(told[0]).toMatch(/^InsertMedia http:\/\/10\.0\.2\.2:\d+\/agent-boot\/b\/[A-Za-z0-9_-]{43}\/agent\.iso/);
    expect(told[1]).toMatch(/^BootOverride Cd Once/);
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
    await enrolled(machine, 'network, iPXE, IPMI');
    // Booted from its NIC (iPXE writes to the screen, not the serial console the log has).
    expect(machine.vm.bootSource).toBe('network');
  });
});

function seconds(since: number): string {
  return `${((Date.now() - since) / 1000).toFixed(1)} s`;
}

/** Whether an SSH server answers at host:port with its banner (QEMU's forward accepts, then closes, without one). */
function sshBanner(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(10_000, () => done(false));
    socket.once('data', (chunk) => done(chunk.toString('latin1').startsWith('SSH-')));
    socket.once('error', () => done(false));
    socket.once('close', () => done(false));
  });
}
