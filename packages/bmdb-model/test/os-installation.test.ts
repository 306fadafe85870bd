import { randomBytes } from 'node:crypto';
import { BMDBError } from '@bmaas/bmdb-controlloop';
import pg from 'pg';
import { describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import {
  AgentHeartbeats,
  addProvided,
  cancelOSInstallation,
  decommissionMachines,
  fleetStages,
  fleetStats,
  holdMachine,
  machineDetail,
  machinePage,
  machinesForAgentRecovery,
  machinesForAgentStart,
  newMachine,
  type OSInstallationRequest,
  operatorHistory,
  osInstallation,
  osInstallationCounts,
  osInstallationReport,
  osInstallations,
  providedMachine,
  RootDeviceHintError,
  requestOSInstallation,
  setAgentHeartbeat,
  setAgentStarted,
  unholdMachine,
} from '../src/index.js';

const { db, bmdb } = await testBMDB();
const q = bmdb.db;

const SHA = 'ab'.repeat(32);
const IMAGE: OSInstallationRequest = {
  imageUrl: 'https://images.example.com/debian.img.gz',
  imageSha256: SHA,
  rootDevice: '/dev/sda',
  compression: 'gzip',
  userData: Buffer.from('#cloud-config\nhostname: n1\n'),
  actor: 'alice@ops',
  reason: 'first install',
};

/** A provided machine of provider `Inst` with a started agent (an hour ago) heartbeating now, under a fresh key. */
async function machineWithAgent(): Promise<{ machineId: string; key: Uint8Array }> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: 'Inst', providerId: `inst-${machineId.slice(0, 8)}` });
  const key = new Uint8Array(randomBytes(32));
  await setAgentStarted(q, machineId, { publicKey: key, startedAt: new Date(Date.now() - 3_600_000) });
  await setAgentHeartbeat(q, machineId);
  return { machineId, key };
}

const report = (generation: bigint, result: 'Success' | 'Error', error?: string) => ({
  generation,
  result,
  raw: new Uint8Array([0x08, Number(generation)]),
  ...(error !== undefined && { error }),
});

const startable = async () =>
  (await machinesForAgentStart(q, { provider: 'Inst', limit: 1000 })).map((m) => m.machineId);
const recoverable = async (thresholds = {}) =>
  (await machinesForAgentRecovery(q, { provider: 'Inst', limit: 1000, ...thresholds })).map((m) => m.machineId);

describe('requesting', () => {
  test('a request is a tag with a new generation, and an InstallOS entry of the operator history', async () => {
    const { machineId } = await machineWithAgent();
    const first = await requestOSInstallation(q, machineId, IMAGE);
    expect(first).toMatchObject({
      machineId,
      generation: 1n,
      state: 'Requested',
      imageUrl: IMAGE.imageUrl,
      imageSha256: SHA,
      rootDevice: '/dev/sda',
      compression: 'gzip',
      requestedBy: 'alice@ops',
      deliveredAt: null,
      error: null,
    });
    expect(Buffer.from(first.userData ?? []).toString()).toBe('#cloud-config\nhostname: n1\n');
    const second = await requestOSInstallation(q, machineId, {
      ...IMAGE,
      compression: undefined,
      userData: undefined,
      imageSha256: SHA.toUpperCase(),
      reason: 'again',
    });
    expect(second).toMatchObject({ generation: 2n, compression: 'none', userData: undefined, imageSha256: SHA });
    const history = await operatorHistory(q, machineId);
    expect(history.map((e) => [e.action, e.outcome, e.actor, e.reason])).toEqual([
      ['InstallOS', 'Succeeded', 'alice@ops', 'first install'],
      ['InstallOS', 'Succeeded', 'alice@ops', 'again'],
    ]);
    expect(history[0]?.detail).toMatchObject({ generation: 1, imageUrl: IMAGE.imageUrl, userDataBytes: 27 });
    expect(history[1]?.detail).toMatchObject({ generation: 2, replaced: { generation: 1, state: 'Requested' } });
  });

  test('bad input is refused naming the field, and nothing is written', async () => {
    const { machineId } = await machineWithAgent();
    const bad: [Partial<OSInstallationRequest>, RegExp][] = [
      [{ imageUrl: 'ftp://x/y.img' }, /image URL "ftp:\/\/x\/y.img" is not an http/],
      [{ imageUrl: 'not a url' }, /image URL "not a url"/],
      [{ imageSha256: 'abc' }, /image sha256 "abc" is not 64 hex digits/],
      [{ imageSha256: 'g'.repeat(64) }, /image sha256/],
      [{ rootDevice: 'sda' }, /root device "sda" is not an absolute path/],
      [{ compression: 'xz' as 'gzip' }, /compression "xz"/],
      [{ reason: ' ' }, /a reason is needed/],
      [{ actor: '' }, /the actor must be named/],
    ];
    for (const [change, message] of bad) {
      const error = await requestOSInstallation(q, machineId, { ...IMAGE, ...change }).catch((e: unknown) => e);
      expect(error, JSON.stringify(change)).toBeInstanceOf(BMDBError);
      expect((error as Error).message).toMatch(message);
      expect((error as Error).message).toContain(machineId);
    }
    await expect(requestOSInstallation(q, '00000000-0000-4000-8000-000000000001', IMAGE)).rejects.toThrow(
      /no such machine/,
    );
    expect(await osInstallation(q, machineId)).toBeUndefined();
    expect(await operatorHistory(q, machineId)).toEqual([]);
  });

  test('root-device hints are stored with the request, beside or instead of the path, and handed out with it', async () => {
    const { machineId, key } = await machineWithAgent();
    const hints = { serialNumber: ' S3Z1NX0K ', minSizeGigabytes: 100, rotational: false, wwn: '0x5002538E4' };
    const stored = { serialNumber: 'S3Z1NX0K', minSizeGigabytes: 100, rotational: false, wwn: '0x5002538E4' };
    const requested = await requestOSInstallation(q, machineId, {
      ...IMAGE,
      rootDevice: undefined,
      rootDeviceHints: hints,
    });
    expect(requested).toMatchObject({ rootDevice: undefined, rootDeviceHints: stored });
    expect(await osInstallation(q, machineId)).toMatchObject({ rootDevice: undefined, rootDeviceHints: stored });
    expect((await operatorHistory(q, machineId))[0]?.detail).toMatchObject({ rootDeviceHints: stored });
    const answer = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(answer.result === 'recorded' && answer.installationRequest).toMatchObject({
      generation: 1n,
      rootDevice: undefined,
      rootDeviceHints: stored,
    });
    // Both: the path and a by-path hint; a later request without hints has none.
    const both = { deviceName: '/dev/disk/by-path/pci-0000:00:1f.2-ata-1' };
    await requestOSInstallation(q, machineId, { ...IMAGE, rootDeviceHints: both, reason: 'both' });
    const second = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(second.result === 'recorded' && second.installationRequest).toMatchObject({
      generation: 2n,
      rootDevice: '/dev/sda',
      rootDeviceHints: both,
    });
    await requestOSInstallation(q, machineId, { ...IMAGE, reason: 'path alone' });
    const third = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(third.result === 'recorded' && third.installationRequest).toMatchObject({
      generation: 3n,
      rootDevice: '/dev/sda',
      rootDeviceHints: undefined,
    });
  });

  test('malformed hints, or neither a path nor hints, are refused naming the field, and nothing is written', async () => {
    const { machineId } = await machineWithAgent();
    const bad: [unknown, string, RegExp][] = [
      [{ serial: 'S3Z1NX0K' }, 'serial', /root device hint serial: unknown; the hints are deviceName, model/],
      [{ model: '  ' }, 'model', /root device hint model: empty/],
      [{ minSizeGigabytes: 0 }, 'minSizeGigabytes', /minSizeGigabytes: want a positive whole number of GiB, got 0/],
      [{ minSizeGigabytes: 1.5 }, 'minSizeGigabytes', /got 1.5/],
      [{ minSizeGigabytes: '100' }, 'minSizeGigabytes', /got "100"/],
      [{ wwn: '0xZZ' }, 'wwn', /wwn: "0xZZ" is not 0x and hex digits/],
      [{ deviceName: 'sda' }, 'deviceName', /deviceName: "sda" is not a path under \/dev\//],
      [{ rotational: 'yes' }, 'rotational', /rotational: want true or false/],
      [{}, '(hints)', /no hint given/],
      [['serialNumber'], '(hints)', /want an object of hints/],
    ];
    for (const [hints, field, message] of bad) {
      const request = {
        ...IMAGE,
        rootDevice: undefined,
        rootDeviceHints: hints as OSInstallationRequest['rootDeviceHints'],
      };
      const error = await requestOSInstallation(q, machineId, request).catch((e: unknown) => e);
      expect(error, JSON.stringify(hints)).toBeInstanceOf(RootDeviceHintError);
      expect((error as RootDeviceHintError).field).toBe(field);
      expect((error as Error).message).toMatch(message);
      expect((error as Error).message).toContain(machineId);
    }
    await expect(requestOSInstallation(q, machineId, { ...IMAGE, rootDevice: undefined })).rejects.toThrow(
      /neither a root device nor root device hints given/,
    );
    expect(await osInstallation(q, machineId)).toBeUndefined();
    expect(await operatorHistory(q, machineId)).toEqual([]);
  });

  test('a new generation is past any report stored before, so a late report never passes for it', async () => {
    const { machineId } = await machineWithAgent();
    await db.admin(`INSERT INTO machine_os_installation_report VALUES ($1, 5, 'Success', '\\x00', now())`, [machineId]);
    const installation = await requestOSInstallation(q, machineId, IMAGE);
    expect(installation.generation).toBe(6n);
  });
});

describe('through the heartbeat', () => {
  test('the pending request is handed out with every heartbeat until its report; Delivered on the first', async () => {
    const { machineId, key } = await machineWithAgent();
    expect(await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key })).toEqual({
      result: 'recorded',
      installationRequest: undefined,
    });
    await requestOSInstallation(q, machineId, IMAGE);
    const answer = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(answer).toMatchObject({
      result: 'recorded',
      installationRequest: {
        generation: 1n,
        imageUrl: IMAGE.imageUrl,
        imageSha256: SHA,
        rootDevice: '/dev/sda',
        compression: 'gzip',
      },
    });
    const delivered = await osInstallation(q, machineId);
    expect(delivered?.state).toBe('Delivered');
    expect(delivered?.deliveredAt).toBeInstanceOf(Date);
    const again = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(again.result === 'recorded' && again.installationRequest?.generation).toBe(1n);
    expect((await osInstallation(q, machineId))?.deliveredAt).toEqual(delivered?.deliveredAt);
    // Another key gets nothing, and marks nothing.
    expect(await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: new Uint8Array(32) })).toEqual({
      result: 'unauthenticated',
    });
  });

  test('an Error report fails the request with the agent’s error; the machine keeps its agent and is requested again', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    const answer = await AgentHeartbeats.of(bmdb).answer({
      machineId,
      publicKey: key,
      installationReport: report(1n, 'Error', 'sha256 mismatch: got 00…, want ab…'),
    });
    expect(answer).toEqual({ result: 'recorded', installationRequest: undefined, report: 'stored' });
    expect(await osInstallation(q, machineId)).toMatchObject({
      state: 'Failed',
      error: 'sha256 mismatch: got 00…, want ab…',
    });
    expect((await osInstallation(q, machineId))?.endedAt).toBeInstanceOf(Date);
    expect(await osInstallationReport(q, machineId)).toMatchObject({ generation: 1n, result: 'Error' });
    // Never stuck: still heartbeating, its agent tags stay; a recovery would take it up were it silent.
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key })).toBe('recorded');
    await db.admin(
      `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '2 hours'
      WHERE machine_id = $1`,
      [machineId],
    );
    expect(await recoverable()).toContain(machineId);
    await setAgentHeartbeat(q, machineId);
    // Requested again: the next heartbeat hands out generation 2.
    await requestOSInstallation(q, machineId, { ...IMAGE, reason: 'right checksum' });
    const next = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(next.result === 'recorded' && next.installationRequest?.generation).toBe(2n);
    // A late report of generation 1 is ignored.
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key, installationReport: report(1n, 'Success') });
    expect((await osInstallation(q, machineId))?.state).toBe('Delivered');
    expect(await osInstallationReport(q, machineId)).toMatchObject({ generation: 1n, result: 'Error' });
  });

  test('a Success report installs the machine: its agent tags go, and neither loop takes it up until a new request', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    const before = await fleetStages(q);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key, installationReport: report(1n, 'Success') });
    expect(await osInstallation(q, machineId)).toMatchObject({ state: 'Succeeded', error: null });
    expect(await osInstallationReport(q, machineId)).toMatchObject({ generation: 1n, result: 'Success' });
    const tags = await db.admin(
      `SELECT (SELECT count(*) FROM machine_agent_started WHERE machine_id = $1)::int AS started,
              (SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1)::int AS heartbeats`,
      [machineId],
    );
    expect(tags.rows[0]).toEqual({ started: 0, heartbeats: 0 });
    // The agent's later heartbeats are refused: it reboots into the installed OS.
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key })).toBe('unauthenticated');
    expect(await startable()).not.toContain(machineId);
    expect(await recoverable({ heartbeatWithin: 0, firstHeartbeatWithin: 0 })).not.toContain(machineId);
    const after = await fleetStages(q);
    expect(after.stages.installed).toBe(before.stages.installed + 1);
    expect(after.stages.heartbeating).toBe(before.stages.heartbeating - 1);
    expect((await fleetStats(q)).stages.installed).toBe(after.stages.installed);
    expect((await machineDetail(q, machineId))?.stage).toBe('installed');
    expect((await machinePage(q, { stage: 'installed', limit: 1000 })).machines.map((m) => m.machineId)).toContain(
      machineId,
    );
    // Cancel is refused for an installed machine, and recorded as such.
    const refused = await cancelOSInstallation(q, machineId, { actor: 'bob@ops', reason: 'oops' });
    expect(refused).toMatchObject({ canceled: false, installation: { state: 'Succeeded' } });
    expect(refused.cause).toMatch(/generation 1 succeeded/);
    expect((await operatorHistory(q, machineId)).at(-1)).toMatchObject({
      action: 'CancelOSInstallation',
      outcome: 'Refused',
    });
    // A new request makes it pending an agent start again (and wakes the loops).
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    try {
      const notified = new Promise<string>((resolve) => listener.on('notification', (n) => resolve(n.payload ?? '')));
      await listener.query('LISTEN bmdb_machines_changed');
      await requestOSInstallation(q, machineId, { ...IMAGE, reason: 'reinstall' });
      expect(await startable()).toContain(machineId);
      expect(await notified).toBe('machine_os_installation_request');
    } finally {
      await listener.end();
    }
    expect((await machineDetail(q, machineId))?.stage).toBe('provided');
  });

  test('a Success report sent again by its agent (the answer lost) is answered as the first was, until the next request', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    const success = { machineId, publicKey: key, installationReport: report(1n, 'Success') };
    expect(await AgentHeartbeats.of(bmdb).answer(success)).toEqual({
      result: 'recorded',
      installationRequest: undefined,
      report: 'stored',
    });
    const installed = await osInstallation(q, machineId);
    const stored = await osInstallationReport(q, machineId);
    const stages = await fleetStages(q);
    // The agent never got that answer and sends the same report again: the same answer, nothing written.
    for (let i = 0; i < 2; i++) {
      expect(await AgentHeartbeats.of(bmdb).answer(success)).toEqual({
        result: 'recorded',
        installationRequest: undefined,
        report: 'repeated',
      });
    }
    expect(await osInstallation(q, machineId)).toEqual(installed);
    expect(await osInstallationReport(q, machineId)).toEqual(stored);
    expect(await fleetStages(q)).toEqual(stages);
    const tags = await db.admin(
      `SELECT (SELECT count(*) FROM machine_agent_started WHERE machine_id = $1)::int AS started,
              (SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1)::int AS heartbeats`,
      [machineId],
    );
    expect(tags.rows[0]).toEqual({ started: 0, heartbeats: 0 });
    // Only that report, from that key: anything else is refused as before.
    const refused = { result: 'unauthenticated' };
    expect(await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key })).toEqual(refused);
    expect(await AgentHeartbeats.of(bmdb).answer({ ...success, publicKey: new Uint8Array(randomBytes(32)) })).toEqual(
      refused,
    );
    expect(await AgentHeartbeats.of(bmdb).answer({ ...success, installationReport: report(1n, 'Error', 'x') })).toEqual(
      refused,
    );
    expect(await AgentHeartbeats.of(bmdb).answer({ ...success, installationReport: report(2n, 'Success') })).toEqual(
      refused,
    );
    // A new request (the machine's next agent) ends it.
    await requestOSInstallation(q, machineId, { ...IMAGE, reason: 'reinstall' });
    expect(await AgentHeartbeats.of(bmdb).answer(success)).toEqual(refused);
    expect((await osInstallation(q, machineId))?.state).toBe('Requested');
  });

  test('a Success report of an older generation is ignored, said so, and the newer request waits for the next heartbeat', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    // An operator asks for another image while the agent finishes the first.
    await requestOSInstallation(q, machineId, { ...IMAGE, imageUrl: 'https://images.example.com/newer.img' });
    expect(
      await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key, installationReport: report(1n, 'Success') }),
    ).toEqual({ result: 'recorded', installationRequest: undefined, report: 'ignored' });
    // Not Delivered: that agent may have rebooted into the first image whatever it was told.
    expect(await osInstallation(q, machineId)).toMatchObject({ generation: 2n, state: 'Requested', deliveredAt: null });
    expect(await osInstallationReport(q, machineId)).toBeUndefined();
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key })).toBe('recorded');
    // An agent that goes on heartbeating gets it with its next heartbeat.
    await setAgentHeartbeat(q, machineId);
    const next = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(next).toMatchObject({
      result: 'recorded',
      report: undefined,
      installationRequest: { generation: 2n, imageUrl: 'https://images.example.com/newer.img' },
    });
    expect((await osInstallation(q, machineId))?.state).toBe('Delivered');
    // An Error report of the older one is ignored too, and stops nothing.
    expect(
      await AgentHeartbeats.of(bmdb).answer({
        machineId,
        publicKey: key,
        installationReport: report(1n, 'Error', 'x'),
      }),
    ).toMatchObject({ report: 'ignored', installationRequest: { generation: 2n } });
    expect(
      await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key, installationReport: report(2n, 'Success') }),
    ).toEqual({ result: 'recorded', installationRequest: undefined, report: 'stored' });
    expect((await osInstallation(q, machineId))?.state).toBe('Succeeded');
  });

  test('a hold keeps a request from being handed out, not a Delivered one from its agent: it installs and reports', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    const delivered = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(delivered.result === 'recorded' && delivered.installationRequest?.generation).toBe(1n);
    await holdMachine(q, machineId, { reason: 'disk swap next door', actor: 'tech@dc' });
    // An answer without it would tell the agent to stop, and zero the disk's start.
    for (let i = 0; i < 2; i++) {
      const held = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
      expect(held).toMatchObject({
        result: 'recorded',
        installationRequest: { generation: 1n, imageUrl: IMAGE.imageUrl },
      });
    }
    expect((await osInstallation(q, machineId))?.state).toBe('Delivered');
    expect(
      await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key, installationReport: report(1n, 'Success') }),
    ).toEqual({ result: 'recorded', installationRequest: undefined, report: 'stored' });
    expect(await osInstallation(q, machineId)).toMatchObject({ state: 'Succeeded', generation: 1n });
  });

  test('no request is handed out while the machine is held or a recovery of it runs', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    await holdMachine(q, machineId, { reason: 'disk swap', actor: 'tech@dc' });
    expect(await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key })).toEqual({
      result: 'recorded',
      installationRequest: undefined,
    });
    expect((await osInstallation(q, machineId))?.state).toBe('Requested');
    await unholdMachine(q, machineId, { actor: 'tech@dc' });
    const session = await bmdb.startSession({ processor: 'test-recoverer' });
    try {
      const work = await session.work('ShepherdRecovery', async () => [machineId]);
      expect(await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key })).toEqual({
        result: 'recorded',
        installationRequest: undefined,
      });
      await work.cancel();
    } finally {
      await session.close();
    }
    const answer = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(answer.result === 'recorded' && answer.installationRequest?.generation).toBe(1n);
  });

  test('a machine installing is not recovered for late heartbeats, within the installing threshold', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    const age = async (interval: string) => {
      await db.admin(
        `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - $2::interval WHERE machine_id = $1`,
        [machineId, interval],
      );
      await db.admin(
        `UPDATE machine_os_installation_request SET delivered_at = now() - $2::interval WHERE machine_id = $1`,
        [machineId, interval],
      );
    };
    await age('20 minutes');
    expect(await recoverable()).not.toContain(machineId);
    expect(await recoverable({ installingHeartbeatWithin: 15 * 60_000 })).toContain(machineId);
    await age('2 hours');
    expect(await recoverable()).toContain(machineId);
  });

  test('a canceled request is handed out no more, and its report is ignored', async () => {
    const { machineId, key } = await machineWithAgent();
    const nothing = await cancelOSInstallation(q, machineId, { actor: 'bob@ops', reason: 'x' });
    expect(nothing).toMatchObject({ canceled: false, installation: undefined });
    expect(nothing.cause).toMatch(/no OS installation was ever requested/);
    await requestOSInstallation(q, machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    const canceled = await cancelOSInstallation(q, machineId, { actor: 'bob@ops', reason: 'wrong image' });
    expect(canceled).toMatchObject({ canceled: true, installation: { state: 'Canceled', generation: 1n } });
    expect(await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key })).toEqual({
      result: 'recorded',
      installationRequest: undefined,
    });
    // Its agent is told, so it does not reboot into the image it was asked for no more.
    expect(
      await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key, installationReport: report(1n, 'Success') }),
    ).toEqual({ result: 'recorded', installationRequest: undefined, report: 'ignored' });
    expect((await osInstallation(q, machineId))?.state).toBe('Canceled');
    expect(await osInstallationReport(q, machineId)).toBeUndefined();
    const history = await operatorHistory(q, machineId);
    expect(history.map((e) => [e.action, e.outcome])).toEqual([
      ['CancelOSInstallation', 'Refused'],
      ['InstallOS', 'Succeeded'],
      ['CancelOSInstallation', 'Succeeded'],
    ]);
    expect(history[2]).toMatchObject({ actor: 'bob@ops', reason: 'wrong image', detail: { was: 'Delivered' } });
  });

  test('counts and lists per state; the page filters by it; an installed machine is decommissioned as any other', async () => {
    const { machineId, key } = await machineWithAgent();
    await requestOSInstallation(q, machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    await AgentHeartbeats.of(bmdb).answer({
      machineId,
      publicKey: key,
      installationReport: report(1n, 'Error', 'disk'),
    });
    const counts = await osInstallationCounts(q);
    const { rows } = await db.admin(
      'SELECT installation_state AS state, count(*)::int AS n FROM machine_os_installation_request GROUP BY 1',
    );
    for (const row of rows) expect(counts[row.state as keyof typeof counts]).toBe(row.n);
    const failed = await osInstallations(q, { states: ['Failed'] });
    expect(failed.map((i) => i.machineId)).toContain(machineId);
    expect(failed.find((i) => i.machineId === machineId)).toMatchObject({ provider: 'Inst', error: 'disk' });
    const page = await machinePage(q, { installation: 'Failed', limit: 1000 });
    expect(page.machines.map((m) => m.machineId)).toContain(machineId);
    expect(page.machines.find((m) => m.machineId === machineId)?.installation).toEqual({
      state: 'Failed',
      generation: 1n,
    });
    expect((await machineDetail(q, machineId))?.osInstallation).toMatchObject({ state: 'Failed', error: 'disk' });

    const installed = await machineWithAgent();
    await requestOSInstallation(q, installed.machineId, IMAGE);
    await AgentHeartbeats.of(bmdb).answer({ machineId: installed.machineId, publicKey: installed.key });
    await AgentHeartbeats.of(bmdb).answer({
      machineId: installed.machineId,
      publicKey: installed.key,
      installationReport: report(1n, 'Success'),
    });
    const providerId = (await providedMachine(q, installed.machineId))?.providerId as string;
    const removed = await decommissionMachines(q, 'Inst', [providerId]);
    expect(removed.removed.map((m) => m.machineId)).toEqual([installed.machineId]);
    expect(await osInstallation(q, installed.machineId)).toBeUndefined();
    expect(await startable()).not.toContain(installed.machineId);
  });
});
