/**
 * The static provider boots a machine's agent through its BMC: Redfish
 * virtual media against the fake BMC over real TLS (the CD found on the
 * Manager or the System, what was inserted ejected first, the boot override
 * read back and set again when ignored, then power on or restart, the media
 * ejected at the end), a network boot through Redfish and through real
 * `ipmi_sim` with Debian's `ipmitool` (read back from the boot flags), and
 * each refusal with its own error naming the machine and the BMC.
 */
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { AgentBootError } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import {
  BmcResponseError,
  BmcUnsupportedError,
  BootOverrideIgnoredError,
  IpmiClient,
  RedfishClient,
  StaticProvider,
  VirtualMediaUnsupportedError,
} from '../src/index.js';
import {
  FakeRedfishServer,
  type FakeSystemOptions,
  IpmiSimulator,
  onPath,
  selfSignedCertificate,
} from '../src/testing/index.js';

/** This boot's ISO: the path between origin and file name is the secret that keeps it unguessable. */
const SECRET_PATH = 'agent-boot/4f1c9e0d7a2b';
const ISO = `https://shepherd.example:8443/${SECRET_PATH}/agent.iso`;
const media = { isoUrl: ISO };

let dir: string;
let bmc: FakeRedfishServer;
let redfish: RedfishClient;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-boot-'));
  const certificate = await selfSignedCertificate();
  bmc = await FakeRedfishServer.start({ tls: certificate });
  redfish = new RedfishClient({ timeout: 5_000, retryDelay: 1, ca: certificate.cert });
});
afterAll(async () => {
  await redfish?.close();
  await bmc?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

let inventories = 0;
/** A provider over an inventory of the given entries (a file of its own, mode 0600). */
async function providerOf(entries: unknown[], ipmi?: IpmiClient): Promise<StaticProvider> {
  const file = path.join(dir, `inventory-${++inventories}.json`);
  await writeFile(file, JSON.stringify(entries));
  await chmod(file, 0o600);
  return new StaticProvider({ inventory: file, redfish, ipmi });
}

/** An inventory entry for system `id` of the fake BMC, added with `options`. */
function redfishMachine(id: string, entry: Record<string, unknown>, options: FakeSystemOptions = {}): unknown {
  return { id, bmc: { url: bmc.addSystem(id, options), username: bmc.username, password: bmc.password }, ...entry };
}

async function failure(attempt: Promise<unknown>): Promise<Error> {
  const error = await attempt.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(error instanceof Error)) throw new Error(`expected a failure, got ${String(error)}`);
  return error;
}

describe('virtual media through Redfish', () => {
  test('the Manager’s CD gets the ISO, then a one-time Cd override in the system’s mode, then power on', async () => {
    const p = await providerOf([
      redfishMachine('cd1', { agentBoot: 'virtual-media' }, { powerState: 'Off', bootMode: 'UEFI' }),
    ]);
    const started = await p.bootAgent('cd1', media);
    expect(bmc.told('cd1')).toEqual([`InsertMedia ${ISO} (HTTPS)`, 'BootOverride Cd Once UEFI', 'Reset On']);
    expect(bmc.virtualMedia('cd1')).toEqual({
      inserted: true,
      image: ISO,
      writeProtected: true,
      transferProtocolType: 'HTTPS',
    });
    expect(bmc.bootOverride('cd1')).toEqual({ target: 'Cd', enabled: 'Once', mode: 'UEFI' });
    expect(await bmc.powerState('cd1')).toBe('On');
    expect(started).toEqual({
      method: 'virtual-media',
      detail: `inserted https://shepherd.example:8443/…/agent.iso in virtual media ${bmc.url}/redfish/v1/Managers/cd1/VirtualMedia/CD; boot override Cd (Once, UEFI); On`,
    });
    // The media's path is what keeps this boot's ISO unguessable: never shown.
    expect(started.detail).not.toContain(SECRET_PATH);
  });

  test('the System’s own CD; inserted media ejected first; a machine that is on is restarted', async () => {
    const p = await providerOf([
      redfishMachine('cd2', { agentBoot: 'virtual-media' }, { virtualMedia: 'system', bootMode: 'Legacy' }),
      redfishMachine('cd3', { agentBoot: 'virtual-media', bootMode: 'uefi' }, { bootMode: 'Legacy' }),
    ]);
    await p.bootAgent('cd2', { isoUrl: 'http://shepherd.example/old/agent.iso' });
    const started = await p.bootAgent('cd2', media);
    expect(bmc.told('cd2')).toEqual([
      'InsertMedia http://shepherd.example/old/agent.iso (HTTP)',
      'BootOverride Cd Once Legacy',
      'Reset ForceRestart',
      'EjectMedia',
      `InsertMedia ${ISO} (HTTPS)`,
      'BootOverride Cd Once Legacy',
      'Reset ForceRestart',
    ]);
    expect(started.detail).toMatch(
      new RegExp(`^ejected, then inserted .* in virtual media ${bmc.url}/redfish/v1/Systems/cd2/VirtualMedia/CD;`),
    );
    // The inventory's bootMode wins over the system's.
    await p.bootAgent('cd3', media);
    expect(bmc.told('cd3')).toEqual([`InsertMedia ${ISO} (HTTPS)`, 'BootOverride Cd Once UEFI', 'Reset ForceRestart']);
  });

  test('an override the BMC ignored is set again, read back each time', async () => {
    const p = await providerOf([redfishMachine('cd4', { agentBoot: 'virtual-media' }, { ignoreBootOverrides: 2 })]);
    const started = await p.bootAgent('cd4', media);
    expect(bmc.told('cd4')).toEqual([
      `InsertMedia ${ISO} (HTTPS)`,
      'BootOverride Cd Once UEFI ignored',
      'BootOverride Cd Once UEFI ignored',
      'BootOverride Cd Once UEFI',
      'Reset ForceRestart',
    ]);
    expect(started.detail).toContain('boot override Cd (Once, UEFI) (kept at attempt 3)');
  });

  test('each override PATCH carries the system’s ETag as If-Match, for a BMC that requires it', async () => {
    const p = await providerOf([
      redfishMachine('cd9', { agentBoot: 'virtual-media' }, { requireIfMatch: true, ignoreBootOverrides: 1 }),
    ]);
    await p.bootAgent('cd9', media);
    expect(bmc.told('cd9')).toEqual([
      `InsertMedia ${ISO} (HTTPS)`,
      'BootOverride Cd Once UEFI ignored',
      'BootOverride Cd Once UEFI',
      'Reset ForceRestart',
    ]);
    // A second boot reads the ETag the kept override changed, and sends that one.
    await p.bootAgent('cd9', media);
    expect(bmc.told('cd9').at(-2)).toBe('BootOverride Cd Once UEFI');
    expect(bmc.requests.filter((r) => r.system === 'cd9' && r.method === 'PATCH').map((r) => r.status)).toEqual([
      204, 204, 204,
    ]);
  });

  test('an override still ignored after the last attempt: no power request, an error naming machine and BMC', async () => {
    const p = await providerOf([redfishMachine('cd5', { agentBoot: 'virtual-media' }, { ignoreBootOverrides: 3 })]);
    const error = await failure(p.bootAgent('cd5', media));
    expect(error).toBeInstanceOf(BootOverrideIgnoredError);
    expect(error.message).toBe(
      `machine cd5: BMC ${bmc.systemUrl('cd5')}: ignored the one-time boot override to Cd (Once, UEFI): read back it says None (Disabled, UEFI), after 3 attempt(s)`,
    );
    expect(error).toMatchObject({ machine: 'cd5', protocol: 'redfish', attempts: 3 });
    expect(bmc.told('cd5').filter((told) => told.startsWith('Reset'))).toEqual([]);
    expect(bmc.resetsOf('cd5')).toEqual([]);
  });

  test('a BMC without virtual media: network boot when the inventory has MACs, else an error saying so', async () => {
    const p = await providerOf([
      redfishMachine('nocd1', { agentBoot: 'virtual-media', macs: ['52:54:00:00:01:01'] }, { virtualMedia: 'none' }),
      redfishMachine('nocd2', { agentBoot: 'virtual-media' }, { virtualMedia: 'none' }),
    ]);
    const started = await p.bootAgent('nocd1', media);
    expect(bmc.told('nocd1')).toEqual(['BootOverride Pxe Once UEFI', 'Reset ForceRestart']);
    expect(started.method).toBe('network');
    expect(started.detail).toMatch(
      /^no virtual media \(machine nocd1: BMC .*: the BMC has no virtual media: .*\): network boot instead; boot override Pxe \(Once, UEFI\); ForceRestart$/,
    );

    const error = await failure(p.bootAgent('nocd2', media));
    expect(error).toBeInstanceOf(VirtualMediaUnsupportedError);
    expect(error).toBeInstanceOf(BmcUnsupportedError);
    expect(error.message).toBe(
      `machine nocd2: BMC ${bmc.systemUrl('nocd2')}: the BMC has no virtual media: neither the ComputerSystem nor its Manager (Links.ManagedBy) links a VirtualMedia collection with members`,
    );
    expect(bmc.told('nocd2')).toEqual([]);
    // Its agent boot's end has nothing to eject.
    await p.endAgentBoot('nocd2', { method: 'virtual-media', media });
    await p.endAgentBoot('nocd1', { method: 'network', media });
  });

  test('a BMC that does not allow a Cd override is named; nothing is powered', async () => {
    const p = await providerOf([
      redfishMachine('cd8', { agentBoot: 'virtual-media' }, { bootSources: ['None', 'Pxe', 'Hdd'] }),
    ]);
    const error = await failure(p.bootAgent('cd8', media));
    expect(error).toBeInstanceOf(BmcUnsupportedError);
    expect(error.message).toBe(
      `machine cd8: BMC ${bmc.systemUrl('cd8')}: boot override target Cd is not allowed by the BMC (allowed: None, Pxe, Hdd)`,
    );
    expect(bmc.told('cd8')).toEqual([`InsertMedia ${ISO} (HTTPS)`]);
    expect(bmc.resetsOf('cd8')).toEqual([]);
  });

  test('an InsertMedia refused is named, with the action that refused; nothing else is sent', async () => {
    const p = await providerOf([redfishMachine('cd6', { agentBoot: 'virtual-media' }, { refuseInsertMedia: true })]);
    const error = await failure(p.bootAgent('cd6', media));
    expect(error).toBeInstanceOf(BmcResponseError);
    expect(error.message).toBe(
      `machine cd6: BMC ${bmc.url}/redfish/v1/Managers/cd6/VirtualMedia/CD/Actions/VirtualMedia.InsertMedia: InsertMedia of https://shepherd.example:8443/…/agent.iso refused: HTTP 400: Unable to connect to the image at https://shepherd.example:8443/…/agent.iso`,
    );
    // The BMC named the image whole; the error shows it without its path, and keeps no cause that has it.
    expect(error.cause).toBeUndefined();
    expect(bmc.told('cd6')).toEqual([]);
    expect(bmc.bootOverride('cd6').target).toBe('None');
  });

  test('an InsertMedia the BMC answers 5xx naming the image is tried again, and no log line holds the image’s path', async () => {
    const p = await providerOf([redfishMachine('cd10', { agentBoot: 'virtual-media' })]);
    // A BMC whose fetch of the image failed for a while, saying which it fetched, as iDRAC does.
    bmc.fail('cd10', {
      status: 503,
      method: 'POST',
      times: 2,
      message: `Unable to connect to the image at ${ISO} (path /${SECRET_PATH}/agent.iso)`,
    });
    const { lines, restore } = captureDebugLog('shepherd:static:*');
    try {
      await p.bootAgent('cd10', media);
    } finally {
      restore();
    }
    expect(bmc.told('cd10')).toEqual([`InsertMedia ${ISO} (HTTPS)`, 'BootOverride Cd Once UEFI', 'Reset ForceRestart']);
    const retries = lines.filter((line) => line.includes('machine cd10: POST') && line.includes('failed'));
    expect(retries).toHaveLength(2);
    expect(retries[0]).toContain(
      'Unable to connect to the image at https://shepherd.example:8443/…/agent.iso (path /…/agent.iso)',
    );
    expect(lines.filter((line) => line.includes(SECRET_PATH))).toEqual([]);
  });

  test('the agent boot’s end ejects the media, once', async () => {
    const p = await providerOf([redfishMachine('cd7', { agentBoot: 'virtual-media' })]);
    await p.bootAgent('cd7', media);
    await p.endAgentBoot('cd7', { method: 'virtual-media', media });
    expect(bmc.virtualMedia('cd7').inserted).toBe(false);
    await p.endAgentBoot('cd7', { method: 'virtual-media', media });
    expect(bmc.told('cd7')).toEqual([
      `InsertMedia ${ISO} (HTTPS)`,
      'BootOverride Cd Once UEFI',
      'Reset ForceRestart',
      'EjectMedia',
    ]);
  });

  test('the end of a boot whose claim was lost leaves the next boot’s image inserted', async () => {
    const p = await providerOf([redfishMachine('cd10', { agentBoot: 'virtual-media' })]);
    const next = { isoUrl: 'https://shepherd.example:8443/agent-boot/next/agent.iso' };
    await p.bootAgent('cd10', media);
    // The next boot, by the task that claimed the machine after this one lost it.
    await p.bootAgent('cd10', next);
    await p.endAgentBoot('cd10', { method: 'virtual-media', media });
    expect(bmc.virtualMedia('cd10')).toMatchObject({ inserted: true, image: next.isoUrl });
    expect(bmc.told('cd10').filter((told) => told === 'EjectMedia')).toHaveLength(1);
    await p.endAgentBoot('cd10', { method: 'virtual-media', media: next });
    expect(bmc.virtualMedia('cd10').inserted).toBe(false);
    expect(bmc.told('cd10').at(-1)).toBe('EjectMedia');
  });

  test('a machine moved to network in the inventory mid-boot has its virtual media boot’s image ejected', async () => {
    const entry = redfishMachine('cd11', { agentBoot: 'virtual-media' });
    const file = path.join(dir, 'inventory-moved.json');
    await writeFile(file, JSON.stringify([entry]), { mode: 0o600 });
    const p = new StaticProvider({ inventory: file, redfish });
    await p.listMachines();
    await p.bootAgent('cd11', media);
    await writeFile(
      file,
      JSON.stringify([{ ...(entry as object), agentBoot: 'network', macs: ['52:54:00:00:11:11'] }]),
    );
    expect((await p.listMachines())[0]?.agentBoot).toBe('network');
    await p.endAgentBoot('cd11', { method: 'virtual-media', media });
    expect(bmc.virtualMedia('cd11').inserted).toBe(false);
    expect(bmc.told('cd11').at(-1)).toBe('EjectMedia');
  });

  test('a network boot through Redfish: a one-time Pxe override, then power on or restart; nothing to eject', async () => {
    const p = await providerOf([
      redfishMachine(
        'pxe1',
        { agentBoot: 'network', macs: ['52:54:00:00:02:01'] },
        { powerState: 'Off', bootMode: null },
      ),
    ]);
    expect(await p.bootAgent('pxe1', media)).toEqual({ method: 'network', detail: 'boot override Pxe (Once); On' });
    expect(bmc.told('pxe1')).toEqual(['BootOverride Pxe Once', 'Reset On']);
    const requests = bmc.requests.length;
    await p.endAgentBoot('pxe1', { method: 'network', media });
    expect(bmc.requests.length).toBe(requests);
  });

  test('a machine whose agent arrives over SSH is refused, naming it and the inventory', async () => {
    const p = await providerOf([redfishMachine('ssh1', { address: '10.0.3.1' })]);
    const error = await failure(p.bootAgent('ssh1', media));
    expect(error).toBeInstanceOf(AgentBootError);
    expect(error.message).toMatch(
      /^machine ssh1: the agent cannot be booted: the inventory .* says its agent arrives over SSH/,
    );
    expect(bmc.told('ssh1')).toEqual([]);
  });
});

const hasIpmiTools = (await IpmiSimulator.available()) && (await onPath('ipmitool'));
if (!hasIpmiTools) {
  console.warn(
    'IPMI agent boot tests skipped: ipmi_sim or ipmitool is missing (install them with: apt-get install -y openipmi ipmitool)',
  );
}

describe.skipIf(!hasIpmiTools)('network boot through IPMI (ipmi_sim)', () => {
  let sim: IpmiSimulator;
  let wrapper: string;

  beforeAll(async () => {
    sim = await IpmiSimulator.start({ password: 'pw-agent-boot', powerOn: false });
    // ipmitool behind a wrapper that records each run's command.
    wrapper = path.join(dir, 'ipmitool');
    await writeFile(wrapper, `#!/bin/sh\necho "$*" >> ${dir}/ipmitool-runs\nexec ipmitool "$@"\n`, {
      mode: 0o755,
    });
  });
  afterAll(async () => {
    await sim?.close();
  });

  // ipmitool's own wait per message is generous: on a loaded machine a retransmitted set would be counted twice.
  const ipmi = () =>
    new IpmiClient({ ipmitool: wrapper, timeout: 20_000, retryDelay: 1, messageTimeout: 5, messageRetries: 1 });
  const machine = (id: string, entry: Record<string, unknown> = {}) => ({
    id,
    agentBoot: 'network',
    macs: ['52:54:00:00:03:01'],
    bmc: {
      protocol: 'ipmi',
      host: sim.host,
      port: sim.port,
      username: sim.username,
      password: sim.password,
      cipherSuite: 3,
    },
    ...entry,
  });
  /** The commands ipmitool ran, without the session's options. */
  const commands = async () =>
    (await readFile(path.join(dir, 'ipmitool-runs'), 'utf8').catch(() => ''))
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => line.replace(/^.* -v (-N \d+ )?(-R \d+ )?/, ''));

  test('chassis bootdev pxe (EFI), read back from the boot flags, then power on; a machine on is reset', async () => {
    const p = await providerOf([machine('ipmi1')], ipmi());
    const before = (await sim.calls()).length;
    expect(await p.bootAgent('ipmi1', media)).toEqual({
      method: 'network',
      detail: 'chassis bootdev pxe options=efiboot; chassis power on',
    });
    expect(await sim.bootDevice()).toBe('pxe');
    expect(await sim.powerOn()).toBe(true);
    // The boot device was set before the power went on.
    expect((await sim.calls()).slice(before).filter((call) => call.startsWith('set'))).toEqual([
      'set boot pxe',
      'set power 1',
    ]);
    const again = await p.bootAgent('ipmi1', media);
    expect(again.detail).toBe('chassis bootdev pxe options=efiboot; chassis power reset');
    expect((await commands()).slice(-4)).toEqual([
      'chassis bootdev pxe options=efiboot',
      'chassis bootparam get 5',
      'chassis power status',
      'chassis power reset',
    ]);
    expect(await p.endAgentBoot('ipmi1', { method: 'network', media })).toBeUndefined();
    expect((await commands()).at(-1)).toBe('chassis power reset');
  });

  test('a legacy machine is set without efiboot', async () => {
    const p = await providerOf([machine('ipmi2', { bootMode: 'legacy' })], ipmi());
    await writeFile(path.join(sim.dir, 'power'), '1\n'); // on: it is reset
    expect((await p.bootAgent('ipmi2', media)).detail).toBe('chassis bootdev pxe; chassis power reset');
    expect(await commands()).toContain('chassis bootdev pxe');
  });

  test('a boot device the BMC dropped is set again; dropped every time, no power request and an error naming the BMC', async () => {
    const p = await providerOf([machine('ipmi3')], ipmi());
    await writeFile(path.join(sim.dir, 'power'), '1\n'); // on: it is reset
    await sim.ignoreBootDeviceSets(1);
    await writeFile(path.join(sim.dir, 'boot'), 'default\n');
    expect((await p.bootAgent('ipmi3', media)).detail).toBe(
      'chassis bootdev pxe options=efiboot (kept at attempt 2); chassis power reset',
    );
    expect(await sim.bootDevice()).toBe('pxe');

    await sim.ignoreBootDeviceSets(3);
    await writeFile(path.join(sim.dir, 'boot'), 'default\n');
    const before = (await sim.calls()).length;
    const error = await failure(p.bootAgent('ipmi3', media));
    expect(error).toBeInstanceOf(BootOverrideIgnoredError);
    expect(error.message).toMatch(
      new RegExp(
        `^machine ipmi3: IPMI BMC 127\\.0\\.0\\.1:${sim.port}: ignored the one-time boot override to pxe \\(next boot, EFI\\): read back it says Force Boot from default Hard-Drive, after 3 attempt\\(s\\)$`,
      ),
    );
    const calls = (await sim.calls()).slice(before);
    expect(calls.filter((call) => call.startsWith('ignored'))).toEqual([
      'ignored boot pxe',
      'ignored boot pxe',
      'ignored boot pxe',
    ]);
    expect(calls.filter((call) => call.startsWith('set power') || call.startsWith('set reset'))).toEqual([]);
  });
});
