/**
 * The lab end to end, as CI runs it, with the real agent: three QEMU VMs
 * (IPMI, Redfish, IPMI BMCs), `shepherd run static` and `shepherd server`
 * around them. The initializer uploads the takeover payload (`shepherd
 * agent-image build`'s) to each VM's "installed OS", the lab's busybox and
 * sshd, over SSH; it answers and kexecs into the agent image: a new boot ID
 * on the console, and the agent heartbeats with a hardware report whose disk
 * serial and MAC are the ones QEMU was given. Then the network of an IPMI VM
 * and of a Redfish VM is cut in turn (QMP set_link, a pulled cable), time is
 * moved in the database past the heartbeat timeout, and the recoverer resets
 * that VM through its BMC: the VM boots its OS again (its cable back once it
 * does), is taken over again and its new agent heartbeats, and the other VMs
 * are left alone. The third VM runs under UEFI (OVMF), the others under
 * BIOS (SeaBIOS), and each hardware report says which. Then the third VM and
 * the first are installed: a small image bootable under both, which the test
 * builds from this machine's Debian packages, requested with `shepherd
 * install` by each disk's serial number alone, downloaded over HTTPS by the
 * agent and written to the disk; the BMC's boot device set to the disk, the
 * agent's reboot boots the image, whose first boot the console shows: on the
 * UEFI VM through the boot entry the agent wrote (BootCurrent names it, with
 * the agent's description), on the BIOS VM through its MBR. Each phase's
 * time is printed with the load average, and each VM's time from its
 * takeover to its agent's first heartbeat and from its start to its first
 * boot's sshd.
 */
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { EFISupport } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { IpmiClient, Secret } from '@bmaas/provider-static';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startedAgents } from '../../../test/support/agents.js';
import { createTestDatabase, type TestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { bundleAgent } from '../../agent/test/bundle-agent.js';
import { buildBootImage, findKernel, Lab, type LabMachine, QmpClient } from '../src/index.js';
import { labEventually, missingForLab, reportedHardware } from './support.js';

const missing = await missingForLab();
if (missing.length > 0) {
  console.warn(`lab test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`);
}

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const CACHE = path.join(ROOT, '.tmp/lab-cache');

describe.skipIf(missing.length > 0)('the lab', () => {
  let db: TestDatabase;
  let dir: string;
  let lab: Lab;
  const started = Date.now();
  let phase = Date.now();
  const timings: string[] = [];
  function timing(what: string): void {
    const line = `lab timing: ${what}: ${((Date.now() - phase) / 1000).toFixed(1)} s (load ${loadavg()[0]?.toFixed(2)})`;
    timings.push(line);
    console.log(line);
    phase = Date.now();
  }

  beforeAll(async () => {
    // The lab runs the built packages: the CLI, and ipmi_sim's chassis control.
    execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['--build'], { cwd: ROOT, stdio: 'inherit' });
    db = await createTestDatabase();
    dir = await mkdtemp(path.join(tmpdir(), 'lab-test-'));
    const agentBundle = path.join(dir, 'agent.cjs');
    await bundleAgent(agentBundle);
    phase = Date.now();
    lab = await Lab.start({
      agentBundle,
      vms: 3,
      dir: path.join(dir, 'lab'),
      cacheDir: CACHE,
      shepherd: path.join(ROOT, 'packages/cli/bin/shepherd.js'),
      bmdbUrl: db.url,
      webListen: `127.0.0.1:${await freePort()}`,
      heartbeatInterval: '1s',
      // Each VM's first boot, to compare OVMF's with SeaBIOS's.
      report: (line) => {
        if (line.includes('sshd answering')) timings.push(`lab timing: ${line} (load ${loadavg()[0]?.toFixed(2)})`);
      },
      runFlags: {
        // Generous: a live agent on this loaded machine must never look silent. The test moves time instead.
        'recoverer-heartbeat-timeout': '2m',
        'recoverer-first-heartbeat-timeout': '10m',
        'recoverer-db-query-rate': '250ms,4',
      },
    });
    timing(
      `agent image (takeover payload ${((lab.agentImage?.takeoverBytes ?? 0) / 2 ** 20).toFixed(1)} MiB), 3 VMs booted, BMCs, shepherd run static and shepherd server started`,
    );
  }, 600_000);
  afterAll(async () => {
    await lab?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
    console.log(`lab test: ${((Date.now() - started) / 1000).toFixed(1)} s in all\n${timings.join('\n')}`);
  });

  /** Per VM (provider ID): its started agent. */
  const agents = () => startedAgents(db, 'providerId');

  const within = <T>(what: string, check: () => Promise<T | undefined>, timeout = 300_000) =>
    labEventually(lab, what, check, timeout, 500);

  /** The boot IDs a VM's console shows, in order: its OS's boots and its agent image's. */
  async function bootIds(machine: LabMachine): Promise<{ os: string[]; image: string[]; last: 'os' | 'image' }> {
    const text = await readFile(machine.vm.consoleLog, 'utf8');
    const os = [...text.matchAll(/^lab: \S+ booted, boot ID (\S+)/gm)].map((m) => m[1] as string);
    const image = [...text.matchAll(/bmaas-init: agent environment starting on \S+, boot ID (\S+)/g)].map(
      (m) => m[1] as string,
    );
    const lastOs = text.lastIndexOf('booted, boot ID');
    const lastImage = text.lastIndexOf('bmaas-init: agent environment starting');
    return { os, image, last: lastImage > lastOs ? 'image' : 'os' };
  }

  /** Pulls or plugs the VM's network cable. */
  function setLink(machine: LabMachine, up: boolean): Promise<unknown> {
    return QmpClient.with(machine.vm.labQmpSocket, (qmp) => qmp.execute('set_link', { name: 'net0', up }));
  }

  test('every VM is taken over into the agent image and heartbeats with its hardware; one whose network is cut is reset through its BMC, IPMI and Redfish alike', async () => {
    // Every VM taken over (AgentStarted once its takeover answered), kexeced, its agent heartbeating.
    const firstHeartbeat = new Map<string, number>();
    const first = await within(
      'every agent heartbeating',
      async () => {
        const now = await agents();
        for (const [id, agent] of now) {
          // Seen at most a poll (0.5 s) and an interval (1 s) after it came: its start to its latest heartbeat.
          if (agent.heartbeatAgo !== null && !firstHeartbeat.has(id)) {
            firstHeartbeat.set(id, agent.startedAgo - agent.heartbeatAgo);
          }
        }
        return now.size === 3 && [...now.values()].every((a) => a.heartbeatAgo !== null && a.heartbeatAgo < 5)
          ? now
          : undefined;
      },
      900_000,
    );
    timing('the 3 VMs taken over, kexeced into the agent image, and heartbeating');
    for (const [id, seconds] of [...firstHeartbeat].sort()) {
      const line = `lab timing: ${id}: takeover answered to first heartbeat: ${seconds.toFixed(1)} s (load ${loadavg()[0]?.toFixed(2)})`;
      timings.push(line);
      console.log(line);
    }
    for (const machine of lab.machines) {
      // It kexeced: the agent image booted after the OS, with a boot ID of its own.
      const boots = await bootIds(machine);
      expect(boots.last).toBe('image');
      expect(boots.image.at(-1)).not.toBe(boots.os.at(-1));
      // Its hardware report is this VM's: the disk serial and MAC QEMU was given.
      const hardware = await reportedHardware(db, first.get(machine.id)?.machineId as string);
      expect(hardware.serials).toContain(machine.diskSerial);
      expect(hardware.macs).toContain(machine.mac);
      // And how it booted: the UEFI VM's agent (kexeced from an OS OVMF booted) has EFI's runtime services.
      if (machine.vm.firmware === 'uefi') expect(hardware.efi).toBe(EFISupport.EFI_SUPPORT_ENABLED);
      else expect(hardware.efi).not.toBe(EFISupport.EFI_SUPPORT_ENABLED);
    }
    expect(lab.machines.map((m) => m.vm.firmware)).toEqual(['bios', 'bios', 'uefi']);
    // Each takeover loaded the image for kexec: none ran the agent in place.
    expect(await readFile(path.join(lab.options.dir, 'shepherd-run.log'), 'utf8')).not.toContain('runs in place');
    // Their starts an hour back: only heartbeats keep them alive.
    await db.admin("UPDATE machine_agent_started SET agent_started_at = agent_started_at - interval '1 hour'");

    const ipmiVm = lab.machines.find((m) => m.protocol === 'ipmi');
    const redfishVm = lab.machines.find((m) => m.protocol === 'redfish');
    if (!ipmiVm || !redfishVm) throw new Error('the lab has no IPMI or no Redfish VM');
    for (const victim of [ipmiVm, redfishVm]) {
      const before = (await agents()).get(victim.id);
      if (!before) throw new Error(`${victim.id} has no agent`);
      const bootsBefore = await bootIds(victim);
      phase = Date.now();
      // Its cable pulled: its agent can no longer heartbeat.
      await setLink(victim, false);
      // Silent for two hours, as far as the recoverer can tell.
      await db.admin(
        "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '2 hours' WHERE machine_id = $1",
        [before.machineId],
      );
      let plugged = false;
      await within(
        `${victim.id} recovered: reset, taken over again and its new agent heartbeating`,
        async () => {
          // The BMC's reset boots its OS again (the same QEMU, so the cable stays out): plug it back in.
          if (!plugged && (await bootIds(victim)).os.length > bootsBefore.os.length) {
            await setLink(victim, true);
            plugged = true;
          }
          const now = (await agents()).get(victim.id);
          return now && now.key !== before.key && now.heartbeatAgo !== null && now.heartbeatAgo < now.startedAgo
            ? now
            : undefined;
        },
        600_000,
      );
      timing(`${victim.id} (${victim.protocol}): network cut to a new agent heartbeating after the BMC's reset`);
      // It really rebooted (a new boot of its OS) and was kexeced into the image again.
      const bootsAfter = await bootIds(victim);
      expect(bootsAfter.os.length).toBe(bootsBefore.os.length + 1);
      expect(bootsAfter.image.length).toBe(bootsBefore.image.length + 1);
      expect(bootsAfter.last).toBe('image');
      const { rows } = await db.admin(
        "SELECT count(*)::int AS n FROM work_history WHERE machine_id = $1 AND process = 'ShepherdRecovery' AND event = 'Finished'",
        [before.machineId],
      );
      expect(rows[0].n).toBe(1);
    }

    // The third VM was left alone all along: the same agent, heartbeating, never recovered.
    const now = await agents();
    const bystander = lab.machines.find((m) => m !== ipmiVm && m !== redfishVm);
    if (!bystander) throw new Error('no third VM');
    expect(now.get(bystander.id)?.key).toBe(first.get(bystander.id)?.key);
    expect(now.get(bystander.id)?.heartbeatAgo).toBeLessThan(10);
    const recovered = await db.admin(
      "SELECT DISTINCT p.provider_id FROM work_history w JOIN machine_provided p USING (machine_id) WHERE w.process = 'ShepherdRecovery' AND w.event = 'Finished' ORDER BY 1",
    );
    expect(recovered.rows.map((row) => row.provider_id)).toEqual([ipmiVm.id, redfishVm.id].sort());

    // The third VM (UEFI, left alone) and the first (BIOS, recovered) installed, together: each BMC boots
    // the disk from now on, the image is requested, the agent writes it and reboots.
    const targets = [bystander, ipmiVm];
    expect(targets.map((m) => m.vm.firmware)).toEqual(['uefi', 'bios']);
    const image = await buildBootImage(dir, findKernel(), 'lab');
    const gzipped = gzipSync(await readFile(image.path));
    const tlsDir = path.join(lab.options.dir, 'server-tls');
    // Served with the server's certificate, which names slirp's 10.0.2.2: the CA every agent was given.
    const images = createServer(
      { cert: await readFile(path.join(tlsDir, 'server.crt')), key: await readFile(path.join(tlsDir, 'server.key')) },
      (request, response) =>
        request.url === '/installed.img.gz' ? response.end(gzipped) : response.writeHead(404).end(),
    );
    await new Promise<void>((resolve) => images.listen(0, '127.0.0.1', resolve));
    try {
      phase = Date.now();
      await Promise.all(targets.map((target) => installOn(target)));
    } finally {
      images.close();
    }

    async function installOn(target: LabMachine): Promise<void> {
      const started = Date.now();
      const machineId = first.get(target.id)?.machineId as string;
      const bmc = target.bmc as { host: string; port: number; username: string; passwordFile: string };
      await new IpmiClient({ timeout: 20_000 }).setBootDevice(
        {
          machine: target.id,
          host: bmc.host,
          port: bmc.port,
          username: bmc.username,
          password: new Secret((await readFile(bmc.passwordFile, 'utf8')).trim()),
          cipherSuite: 3,
        },
        'disk',
      );
      expect(await target.vm.power.bootDevice()).toBe('disk');
      const port = (images.address() as AddressInfo).port;
      await promisify(execFile)(process.execPath, [
        path.join(ROOT, 'packages/cli/bin/shepherd.js'),
        'install',
        '--bmdb-url',
        db.url,
        '--provider',
        'Static',
        '--provider-id',
        target.id,
        '--image-url',
        `https://10.0.2.2:${port}/installed.img.gz`,
        '--image-sha256',
        createHash('sha256').update(gzipped).digest('hex'),
        // By what the disk is, not where: QEMU's serial number, which the agent's hardware report showed.
        '--root-device-hint',
        `serialNumber=${target.diskSerial}`,
        '--compression',
        'gzip',
        '--reason',
        'lab test',
      ]);
      const installed = await within(`${target.id} installed`, async () => {
        const { rows } = await db.admin(
          `SELECT installation_state, installation_error,
                  extract(epoch FROM installation_ended_at - requested_at)::float8 AS seconds
           FROM machine_os_installation_request WHERE machine_id = $1`,
          [machineId],
        );
        const row = rows[0];
        if (row?.installation_state === 'Failed') throw new Error(`installation failed: ${row.installation_error}`);
        return row?.installation_state === 'Succeeded' ? row : undefined;
      });
      const installedAt = Date.now();
      // The agent's reboot boots the disk, as the BMC says: the image's first boot on the console.
      // Console lines end in CR LF, or begin with a CR under OVMF.
      const booted = await within(`${target.id} booted the installed image`, async () => {
        const text = await readFile(target.vm.consoleLog, 'utf8');
        return text.split(/[\r\n]+/).find((line) => line.startsWith(image.bootLine));
      });
      const line = `lab timing: ${target.id} (${target.vm.firmware.toUpperCase()}): ${(image.bytes / 2 ** 20).toFixed(1)} MiB image requested to installed ${((installedAt - started) / 1000).toFixed(1)} s (${installed.seconds.toFixed(1)} s by the database), installed to the image's first boot from its disk ${((Date.now() - installedAt) / 1000).toFixed(1)} s (load ${loadavg()[0]?.toFixed(2)})`;
      timings.push(line);
      console.log(line);
      expect(target.vm.bootSource).toBe('disk');
      if (target.vm.firmware === 'uefi') {
        // OVMF booted the entry the agent wrote, first in BootOrder: BootCurrent names it, with the agent's description.
        const entry = /installed generation \d+: .*, boot entry (\d+)/.exec(
          await readFile(target.vm.consoleLog, 'utf8'),
        );
        expect(entry, 'the agent wrote a boot entry').not.toBeNull();
        const number = Number(entry?.[1]).toString(16).toUpperCase().padStart(4, '0');
        expect(booted).toContain(`under UEFI, BootCurrent Boot${number} "BMaaS installed OS (vda)"`);
      } else {
        // SeaBIOS booted the disk's MBR, and the image knows no EFI.
        expect(booted).toContain(' under BIOS, ');
      }
      // Installed: no agent, and nobody starts one on it; the left-alone VM never recovered either.
      expect((await agents()).has(target.id)).toBe(false);
      const { rows } = await db.admin(
        `SELECT w.process, w.event FROM work_history w JOIN machine_os_installation_request q USING (machine_id)
         WHERE w.machine_id = $1 AND (($2 AND w.process = 'ShepherdRecovery') OR w."timestamp" > q.requested_at)`,
        [machineId, target === bystander],
      );
      expect(rows).toEqual([]);
    }
    timing(`${targets.map((m) => m.id).join(' and ')} installed and booted from their disks`);

    // What Ctrl-C does: everything stopped (QEMU, ipmi_sim, the shepherd, its server) and the files removed.
    const pids = lab.machines.flatMap((m) => [m.vm.pid, m.ipmiSimulator?.pid]).filter((pid) => pid !== undefined);
    expect(pids).toHaveLength(5);
    await lab.stop();
    expect(existsSync(lab.options.dir)).toBe(false);
    expect(lab.run?.running).toBe(false);
    expect(lab.server?.running).toBe(false);
    for (const pid of pids) expect(() => process.kill(pid, 0), `process ${pid}`).toThrow();
    timing('the lab stopped');
  }, 1_800_000);
});
