import { randomBytes } from 'node:crypto';
import { BMDBError } from '@bmaas/bmdb-controlloop';
import { sql } from 'kysely';
import pg from 'pg';
import { describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { claimSelectedStatement } from '../../bmdb-controlloop/src/sql/claim.js';
import {
  type AgentBootMethod,
  AgentHeartbeats,
  addProvided,
  agentBootCounts,
  agentBootMethod,
  agentBootSelection,
  agentRecoverySelection,
  agentStartSelection,
  cancelOSInstallation,
  decommissionWithWipe,
  fleetStages,
  fleetStats,
  holdMachine,
  machineDetail,
  machinePage,
  machinesForAgentRecovery,
  machinesForAgentStart,
  needsAgentBoot,
  newMachine,
  osInstallation,
  osInstallationReport,
  Process,
  requestDiskWipe,
  requestOSInstallation,
  setAgentBootMethods,
  setAgentHeartbeat,
  setAgentStarted,
} from '../src/index.js';

const { db, bmdb } = await testBMDB();
const q = bmdb.db;

const HOUR = 3_600_000;

/** A provided machine of `provider`, with its boot method set as the provisioner would. */
async function machine(provider: string, method: AgentBootMethod = 'virtual-media'): Promise<string> {
  const machineId = await newMachine(q);
  const providerId = `${provider}-${machineId.slice(0, 8)}`;
  await addProvided(q, machineId, { provider, providerId });
  await setAgentBootMethods(q, provider, new Map([[providerId, method]]));
  return machineId;
}

/** Its agent started `startedAgo` ms ago, heartbeating now unless `heartbeat` is false. */
async function startAgent(machineId: string, options: { startedAgo?: number; heartbeat?: boolean } = {}) {
  const key = new Uint8Array(randomBytes(32));
  await setAgentStarted(q, machineId, {
    publicKey: key,
    startedAt: new Date(Date.now() - (options.startedAgo ?? HOUR)),
  });
  if (options.heartbeat !== false) await setAgentHeartbeat(q, machineId);
  return key;
}

/** The machine installed: a request its agent reported a success of, which removes its agent's tags. */
async function install(machineId: string): Promise<void> {
  const key = await startAgent(machineId);
  const { generation } = await requestOSInstallation(q, machineId, {
    imageUrl: 'https://images.example.com/os.img',
    imageSha256: 'ab'.repeat(32),
    rootDevice: '/dev/sda',
    actor: 'alice@ops',
    reason: 'first install',
  });
  await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
  await AgentHeartbeats.of(bmdb).answer({
    machineId,
    publicKey: key,
    installationReport: { generation, result: 'Success', raw: new Uint8Array([8, Number(generation)]) },
  });
}

/** The machine IDs `agentBootSelection` offers for `provider`, in no particular order. */
async function bootable(provider: string, thresholds = {}): Promise<string[]> {
  const selection = agentBootSelection(q, { provider, ...thresholds });
  const { rows } = await sql<{ machine_id: string }>`SELECT s.machine_id FROM (${selection.query}) AS s`.execute(q);
  return rows.map((r) => r.machine_id).sort();
}

async function providerIdOf(machineId: string): Promise<string> {
  const row = await q
    .selectFrom('machine_provided')
    .select('provider_id')
    .where('machine_id', '=', machineId)
    .executeTakeFirstOrThrow();
  return row.provider_id;
}

const startable = async (provider: string) =>
  (await machinesForAgentStart(q, { provider, limit: 1000 })).map((m) => m.machineId).sort();
const recoverable = async (provider: string) =>
  (await machinesForAgentRecovery(q, { provider, limit: 1000 })).map((m) => m.machineId).sort();

describe('setAgentBootMethods', () => {
  test('sets, changes and removes methods by provider ID, leaving the machines it was not told of alone', async () => {
    const [a, b, other] = [await machine('Set', 'ssh'), await machine('Set', 'ssh'), await machine('Set', 'network')];
    const [idA, idB] = [await providerIdOf(a), await providerIdOf(b)];
    expect(
      await setAgentBootMethods(
        q,
        'Set',
        new Map([
          [idA, 'virtual-media'],
          [idB, 'network'],
          ['unknown', 'network'],
        ]),
      ),
    ).toBe(2);
    expect([await agentBootMethod(q, a), await agentBootMethod(q, b), await agentBootMethod(q, other)]).toEqual([
      'virtual-media',
      'network',
      'network',
    ]);
    // Another provider's machine of the same provider ID is not this one.
    expect(await setAgentBootMethods(q, 'SetElsewhere', new Map([[idA, 'ssh']]))).toBe(0);
    expect(await agentBootMethod(q, a)).toBe('virtual-media');
    expect(
      await setAgentBootMethods(
        q,
        'Set',
        new Map([
          [idA, 'network'],
          [idB, 'ssh'],
        ]),
      ),
    ).toBe(2);
    expect([await agentBootMethod(q, a), await agentBootMethod(q, b)]).toEqual(['network', 'ssh']);
    expect(await q.selectFrom('machine_agent_boot').select('machine_id').where('machine_id', '=', b).execute()).toEqual(
      [],
    );
  });

  test('a round in which nothing changed writes nothing: no row version, no transaction ID', async () => {
    const [a, b] = [await machine('Same', 'virtual-media'), await machine('Same', 'ssh')];
    const ids = await q
      .selectFrom('machine_provided')
      .select(['machine_id', 'provider_id'])
      .where('provider', '=', 'Same')
      .execute();
    const methods = new Map<string, AgentBootMethod>(
      ids.map((r) => [r.provider_id, r.machine_id === a ? 'virtual-media' : 'ssh']),
    );
    const versions = async () =>
      (await db.admin('SELECT machine_id, xmin::text FROM machine_agent_boot WHERE machine_id = ANY($1)', [[a, b]]))
        .rows;
    const before = await versions();
    expect(before).toHaveLength(1);
    const { changed, xid } = await q.transaction().execute(async (tx) => ({
      changed: await setAgentBootMethods(tx, 'Same', methods),
      xid: (await sql<{ xid: string | null }>`SELECT txid_current_if_assigned()::text AS xid`.execute(tx)).rows[0]?.xid,
    }));
    expect(changed).toBe(0);
    // A statement that wrote or locked a row would have been given a transaction ID.
    expect(xid).toBeNull();
    expect(await versions()).toEqual(before);
    // The same round with one change does get one.
    methods.set(ids.find((r) => r.machine_id === b)?.provider_id ?? '', 'network');
    const changedRound = await q.transaction().execute(async (tx) => ({
      changed: await setAgentBootMethods(tx, 'Same', methods),
      xid: (await sql<{ xid: string | null }>`SELECT txid_current_if_assigned()::text AS xid`.execute(tx)).rows[0]?.xid,
    }));
    expect(changedRound.changed).toBe(1);
    expect(changedRound.xid).not.toBeNull();
    expect(await versions()).toEqual(expect.arrayContaining(before));
  });

  test('a method that is none of the three is refused naming the machine, and nothing is written', async () => {
    const a = await machine('Bad', 'ssh');
    const providerId = await providerIdOf(a);
    const error = await setAgentBootMethods(
      q,
      'Bad',
      new Map([
        [providerId, 'network'],
        ['bad-1', 'pxe' as AgentBootMethod],
      ]),
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BMDBError);
    expect((error as Error).message).toMatch(
      /machine bad-1 of provider Bad: boot method "pxe" is none of ssh, virtual-media, network/,
    );
    expect(await agentBootMethod(q, a)).toBe('ssh');
  });

  test('agentBootCounts counts the machines per BMC method', async () => {
    const before = await agentBootCounts(q);
    await machine('Counts', 'network');
    await machine('Counts', 'ssh');
    expect(await agentBootCounts(q)).toEqual({ 'virtual-media': before['virtual-media'], network: before.network + 1 });
  });
});

describe('agentBootSelection', () => {
  test('offers BMC-booted machines without an agent, and leaves them out of the SSH initializer', async () => {
    const [blank, network, ssh] = [
      await machine('Blank'),
      await machine('Blank', 'network'),
      await machine('Blank', 'ssh'),
    ];
    expect(await bootable('Blank')).toEqual([blank, network].sort());
    expect(await startable('Blank')).toEqual([ssh]);
  });

  test('a machine switched from ssh to virtual media moves from the initializer to the agent boot, and back', async () => {
    const a = await machine('Switch', 'ssh');
    const providerId = await providerIdOf(a);
    expect([await startable('Switch'), await bootable('Switch')]).toEqual([[a], []]);
    await setAgentBootMethods(q, 'Switch', new Map([[providerId, 'virtual-media']]));
    expect([await startable('Switch'), await bootable('Switch')]).toEqual([[], [a]]);
    await setAgentBootMethods(q, 'Switch', new Map([[providerId, 'ssh']]));
    expect([await startable('Switch'), await bootable('Switch')]).toEqual([[a], []]);
  });

  test('a switch of a machine waiting for its agent wakes idle loops; one of a started machine does not', async () => {
    const waiting = await machine('Wake', 'ssh');
    const started = await machine('Wake', 'ssh');
    await startAgent(started);
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    try {
      await listener.query('LISTEN bmdb_machines_changed');
      await setAgentBootMethods(q, 'Wake', new Map([[await providerIdOf(started), 'network']]));
      await setAgentBootMethods(q, 'Wake', new Map([[await providerIdOf(waiting), 'virtual-media']]));
      await eventually('the switch notified', async () => (heard.length > 0 ? true : undefined));
      // Notifications arrive in commit order: had the first switch notified, it would be here first.
      expect(heard).toEqual(['machine_agent_boot']);
    } finally {
      await listener.end();
    }
  });

  test('an installed machine is offered once a reinstall or a decommission wipe is requested, not before', async () => {
    const [reinstalled, wiped, left] = [await machine('Inst'), await machine('Inst'), await machine('Inst')];
    for (const m of [reinstalled, wiped, left]) await install(m);
    expect(await bootable('Inst')).toEqual([]);
    await requestOSInstallation(q, reinstalled, {
      imageUrl: 'https://images.example.com/os2.img',
      imageSha256: 'cd'.repeat(32),
      rootDevice: '/dev/sda',
      actor: 'alice@ops',
      reason: 'reinstall',
    });
    await requestDiskWipe(q, wiped, { actor: 'alice@ops', reason: 'leaving', decommission: true });
    expect(await bootable('Inst')).toEqual([reinstalled, wiped].sort());
  });

  test('an installed machine whose reinstall or wipe was canceled before an agent came is not offered: its OS runs', async () => {
    const [reinstalled, wiped, again] = [await machine('Cancel'), await machine('Cancel'), await machine('Cancel')];
    for (const m of [reinstalled, wiped, again]) await install(m);
    const image = {
      imageUrl: 'https://images.example.com/os2.img',
      imageSha256: 'cd'.repeat(32),
      rootDevice: '/dev/sda',
      actor: 'alice@ops',
      reason: 'reinstall',
    };
    await requestOSInstallation(q, reinstalled, image);
    await requestDiskWipe(q, wiped, { actor: 'alice@ops', reason: 'leaving' });
    await requestOSInstallation(q, again, image);
    expect(await bootable('Cancel')).toEqual([reinstalled, wiped, again].sort());
    const withdraw = { actor: 'alice@ops', reason: 'not now' };
    for (const m of [reinstalled, wiped, again]) await cancelOSInstallation(q, m, withdraw);
    expect(await bootable('Cancel')).toEqual([]);
    for (const m of [reinstalled, wiped]) expect(await needsAgentBoot(q, m, { provider: 'Cancel' })).toBe(false);
    // Asked again: offered again.
    await requestOSInstallation(q, again, image);
    expect(await bootable('Cancel')).toEqual([again]);
    expect(await needsAgentBoot(q, again, { provider: 'Cancel' })).toBe(true);
    // A blank machine whose first installation was canceled still needs its agent: it runs nothing.
    const blank = await machine('Cancel');
    await requestOSInstallation(q, blank, image);
    await cancelOSInstallation(q, blank, withdraw);
    expect(await bootable('Cancel')).toEqual([again, blank].sort());
  });

  test('needsAgentBoot: the state the selection reads, for one machine, whatever its work', async () => {
    const silent = await machine('Needs');
    await startAgent(silent);
    await db.admin(
      `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '11 minutes' WHERE machine_id = $1`,
      [silent],
    );
    const blank = await machine('Needs');
    const session = await bmdb.startSession({ processor: 'agent-boot-test' });
    try {
      const claimed = [];
      for (let i = 0; i < 2; i++) {
        claimed.push(
          (await session.work(Process.ShepherdAgentBoot, agentBootSelection(q, { provider: 'Needs' }))).machineId,
        );
      }
      expect(claimed.sort()).toEqual([silent, blank].sort());
      // Claimed, they still need it; once the agent is alive again, or the machine installed, no more.
      expect(await needsAgentBoot(q, silent, { provider: 'Needs' })).toBe(true);
      expect(await needsAgentBoot(q, blank, { provider: 'Needs' })).toBe(true);
      await setAgentHeartbeat(q, silent);
      expect(await needsAgentBoot(q, silent, { provider: 'Needs' })).toBe(false);
      // Made only now, so that the two claims above had no third machine to take.
      const installed = await machine('Needs');
      await install(installed);
      expect(await needsAgentBoot(q, installed, { provider: 'Needs' })).toBe(false);
      expect(await needsAgentBoot(q, blank, { provider: 'Other' })).toBe(false);
    } finally {
      await session.close();
    }
  });

  test('a machine whose agent went silent past the recovery thresholds is offered, and left out of the recoverer', async () => {
    const stale = await machine('Silent');
    await startAgent(stale);
    await db.admin(
      `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '11 minutes' WHERE machine_id = $1`,
      [stale],
    );
    const never = await machine('Silent', 'network');
    await startAgent(never, { startedAgo: 31 * 60_000, heartbeat: false });
    const healthy = await machine('Silent');
    await startAgent(healthy);
    const young = await machine('Silent');
    await startAgent(young, { startedAgo: 60_000, heartbeat: false });
    const sshStale = await machine('Silent', 'ssh');
    await startAgent(sshStale);
    await db.admin(
      `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '11 minutes' WHERE machine_id = $1`,
      [sshStale],
    );
    expect(await bootable('Silent')).toEqual([stale, never].sort());
    // The recoverer's own thresholds decide, as they do for it.
    expect(await bootable('Silent', { heartbeatWithin: 20 * 60_000 })).toEqual([never]);
    expect(await recoverable('Silent')).toEqual([sshStale]);
  });

  test('a started machine switched to a BMC boot and back: its silent agent is offered, then left to the recoverer', async () => {
    // Its agent started and heartbeated while it was an SSH machine, then both went silent.
    const switched = await machine('Switched', 'ssh');
    await startAgent(switched);
    const never = await machine('Switched', 'ssh');
    await startAgent(never, { startedAgo: 31 * 60_000, heartbeat: false });
    await db.admin(
      `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '11 minutes' WHERE machine_id = $1`,
      [switched],
    );
    expect(await bootable('Switched')).toEqual([]);
    expect(await recoverable('Switched')).toEqual([switched, never].sort());
    const methods = async (method: AgentBootMethod) =>
      setAgentBootMethods(
        q,
        'Switched',
        new Map([
          [await providerIdOf(switched), method],
          [await providerIdOf(never), method],
        ]),
      );
    await methods('network');
    expect(await bootable('Switched')).toEqual([switched, never].sort());
    expect(await recoverable('Switched')).toEqual([]);
    // A change between two BMC methods keeps them the agent boot's.
    await methods('virtual-media');
    expect(await bootable('Switched')).toEqual([switched, never].sort());
    await methods('ssh');
    expect(await bootable('Switched')).toEqual([]);
    expect(await recoverable('Switched')).toEqual([switched, never].sort());
    // Its first heartbeat after the switch (a new agent) is flagged as its start was.
    await methods('network');
    await db.admin('DELETE FROM machine_agent_heartbeat WHERE machine_id = $1', [switched]);
    await setAgentHeartbeat(q, switched);
    await db.admin(
      `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '11 minutes' WHERE machine_id = $1`,
      [switched],
    );
    expect(await bootable('Switched')).toEqual([switched, never].sort());
  });

  test('held machines, machines in backoff and machines under live shepherd work are left out', async () => {
    const [held, backedOff, busy, free] = [
      await machine('Excl'),
      await machine('Excl'),
      await machine('Excl'),
      await machine('Excl'),
    ];
    await holdMachine(q, held, { reason: 'disk swap', actor: 'alice@ops' });
    const session = await bmdb.startSession({ processor: 'agent-boot-test' });
    try {
      // Claimed for a boot, it is left out while the work lives; failed, its backoff keeps it out.
      const failing = await session.work(Process.ShepherdAgentBoot, agentBootSelection(q, { provider: 'Excl' }));
      const claimed = failing.machineId;
      expect([backedOff, busy, free]).toContain(claimed);
      expect(await bootable('Excl')).not.toContain(claimed);
      await failing.fail({ initial: 3_600_000, maximum: 3_600_000, exponent: 1 }, 'virtual media refused');
      expect(await bootable('Excl')).not.toContain(claimed);
      // Work of another shepherd process (a power action) keeps a machine out too.
      const others = [backedOff, busy, free].filter((m) => m !== claimed);
      const powering = await session.work(Process.ShepherdPowerAction, {
        process: Process.ShepherdPowerAction,
        query: q
          .selectFrom('machine_provided')
          .selectAll()
          .where('machine_id', '=', others[0] ?? ''),
        toCandidate: (row) => ({ machineId: row.machine_id }),
      });
      expect(await bootable('Excl')).toEqual([others[1]]);
      await powering.cancel();
      expect(await bootable('Excl')).toEqual(others.sort());
    } finally {
      await session.close();
    }
  });

  test('the claim takes a BMC-booted machine for ShepherdAgentBoot, which is then agentStarting everywhere', async () => {
    const a = await machine('Claim', 'network');
    const ssh = await machine('Claim', 'ssh');
    expect((await machineDetail(q, a))?.agentBoot).toBe('network');
    expect((await machineDetail(q, ssh))?.agentBoot).toBe('ssh');
    const session = await bmdb.startSession({ processor: 'agent-boot-test' });
    try {
      const before = (await fleetStages(q)).stages;
      const work = await session.work(Process.ShepherdAgentBoot, agentBootSelection(q, { provider: 'Claim' }));
      expect(work.machineId).toBe(a);
      // An agent boot under way is the agent starting, as an SSH takeover is.
      const during = (await fleetStages(q)).stages;
      expect([during.agentStarting, during.provided]).toEqual([before.agentStarting + 1, before.provided - 1]);
      expect((await fleetStats(q, { provider: 'Claim' })).stages).toMatchObject({ agentStarting: 1, provided: 1 });
      expect((await machineDetail(q, a))?.stage).toBe('agentStarting');
      const page = await machinePage(q, { stage: 'agentStarting', limit: 1000 });
      expect(page.machines.map((m) => m.machineId)).toContain(a);
      const provided = await machinePage(q, { stage: 'provided', limit: 1000 });
      expect(provided.machines.map((m) => m.machineId)).toEqual(expect.arrayContaining([ssh]));
      expect(provided.machines.map((m) => m.machineId)).not.toContain(a);
      await work.cancel();
    } finally {
      await session.close();
    }
  });
});

describe('heartbeats during an agent boot', () => {
  test('while a ShepherdAgentBoot work row holds the machine, no report is stored and no request handed out', async () => {
    const [installing, waiting] = [await machine('Booting'), await machine('Booting')];
    const keys = new Map([
      [installing, await startAgent(installing)],
      [waiting, await startAgent(waiting)],
    ]);
    const key = (machineId: string) => keys.get(machineId) ?? new Uint8Array();
    const image = {
      imageUrl: 'https://images.example.com/os.img',
      imageSha256: 'ab'.repeat(32),
      rootDevice: '/dev/sda',
      actor: 'alice@ops',
      reason: 'install',
    };
    const { generation } = await requestOSInstallation(q, installing, image);
    // Handed out before the boot: the agent installs it.
    const handed = await AgentHeartbeats.of(bmdb).answer({ machineId: installing, publicKey: key(installing) });
    expect(handed).toMatchObject({ installationRequest: { generation } });
    await requestOSInstallation(q, waiting, image);
    const state = async (machineId: string) => (await osInstallation(q, machineId))?.state;
    const session = await bmdb.startSession({ processor: 'agent-boot-test' });
    // The booter's claim (its selection took them as silent; here by ID): the machines are about to be reset.
    const boots = [];
    for (const machineId of [installing, waiting]) {
      boots.push(
        await session.work(Process.ShepherdAgentBoot, {
          process: Process.ShepherdAgentBoot,
          query: q.selectFrom('machine_provided').selectAll().where('machine_id', '=', machineId),
          toCandidate: (row) => ({ machineId: row.machine_id }),
        }),
      );
    }
    try {
      // The old agent's Success is not stored: the machine stays out of Succeeded, with its agent.
      const report = { generation, result: 'Success' as const, raw: new Uint8Array([8, Number(generation)]) };
      const late = await AgentHeartbeats.of(bmdb).answer({
        machineId: installing,
        publicKey: key(installing),
        installationReport: report,
      });
      expect(late).toMatchObject({ result: 'recorded', report: 'ignored', installationRequest: undefined });
      expect(await state(installing)).toBe('Delivered');
      expect(
        (
          await q
            .selectFrom('machine_agent_started')
            .select('machine_id')
            .where('machine_id', '=', installing)
            .execute()
        ).length,
      ).toBe(1);
      expect(await osInstallationReport(q, installing)).toBeUndefined();
      // A revived agent is handed no request while its machine's reset is on its way.
      const revived = await AgentHeartbeats.of(bmdb).answer({ machineId: waiting, publicKey: key(waiting) });
      expect(revived).toMatchObject({ result: 'recorded', installationRequest: undefined });
      expect(await state(waiting)).toBe('Requested');
    } finally {
      for (const work of boots) await work.cancel();
      await session.close();
    }
    // The boot over, the requests go out again and the report is taken.
    const after = await AgentHeartbeats.of(bmdb).answer({ machineId: waiting, publicKey: key(waiting) });
    expect(after).toMatchObject({ installationRequest: { kind: 'DiskImage' } });
    expect(await state(waiting)).toBe('Delivered');
    const stored = await AgentHeartbeats.of(bmdb).answer({
      machineId: installing,
      publicKey: key(installing),
      installationReport: { generation, result: 'Success', raw: new Uint8Array([8, Number(generation)]) },
    });
    expect(stored).toMatchObject({ report: 'stored' });
    expect(await state(installing)).toBe('Succeeded');
  });
});

describe('at 10,000 machines', () => {
  test('the agent boot, agent start and recovery selections are index scans, never a scan of the fleet', async () => {
    // Onboarding: every even machine is booted by its BMC and blank but 1 in 500, whose agent is silent; the odd
    // ones are taken over through SSH, started and heartbeating but 1 in 50 (pending) and 1 in 500 (silent).
    await db.admin(`
      WITH m AS (INSERT INTO machines SELECT gen_random_uuid() FROM generate_series(1, 10000) RETURNING machine_id),
        n AS (SELECT machine_id, row_number() OVER () AS i FROM m)
      INSERT INTO machine_provided (machine_id, provider, provider_id) SELECT machine_id, 'Scale', 'scale-' || i FROM n`);
    const i = `substring(provider_id FROM 7)::int`;
    await db.admin(`
      INSERT INTO machine_agent_boot (machine_id, boot_method)
      SELECT machine_id, 'virtual-media' FROM machine_provided WHERE provider = 'Scale' AND ${i} % 2 = 0`);
    const started = `provider = 'Scale' AND (${i} % 1000 IN (0, 3) OR (${i} % 2 = 1 AND ${i} % 100 <> 1))`;
    await db.admin(`
      INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
      SELECT machine_id, now() - interval '1 hour', '\\x00' FROM machine_provided WHERE ${started}`);
    await db.admin(`
      INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
      SELECT machine_id, CASE WHEN ${i} % 1000 IN (0, 3) THEN now() - interval '1 hour' ELSE now() END
      FROM machine_provided WHERE ${started}`);
    await db.admin('ANALYZE');
    expect(await bootable('Scale')).toHaveLength(4990 + 10);
    expect(await startable('Scale')).toHaveLength(100);
    expect(await recoverable('Scale')).toHaveLength(10);

    // The claim statement as the claim pool plans it (internal/pools.ts): its session's claim of one machine.
    const session = await bmdb.startSession({ processor: 'agent-boot-plan' });
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    const plan = async (selection: ReturnType<typeof agentBootSelection>) => {
      const claim = claimSelectedStatement(selection.process, selection.query, [session.id]).compile(q);
      await client.query('BEGIN');
      try {
        await client.query(
          'SET LOCAL enable_seqscan = off; SET LOCAL enable_mergejoin = off; SET LOCAL enable_hashjoin = off',
        );
        const { rows } = await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${claim.sql}`, [...claim.parameters]);
        return rows.map((r) => r['QUERY PLAN']).join('\n');
      } finally {
        await client.query('ROLLBACK');
      }
    };
    const fleetScan = /Seq Scan on machine_(provided|agent_pending|agent_boot|agent_started|agent_heartbeat)\b/;
    try {
      const boot = await plan(agentBootSelection(q, { provider: 'Scale' }));
      expect(boot).toMatch(/Index (Only )?Scan using machine_agent_pending_boot_idx/);
      expect(boot).not.toMatch(fleetScan);
      const start = await plan(agentStartSelection(q, { provider: 'Scale' }));
      expect(start).toMatch(/Index (Only )?Scan using machine_agent_pending_ssh_idx/);
      expect(start).not.toMatch(fleetScan);
      const recovery = await plan(agentRecoverySelection(q, { provider: 'Scale' }));
      expect(recovery).not.toMatch(fleetScan);
    } finally {
      await client.end();
      await session.close();
    }
  });
});

describe('at 10,000 machines, nearly all taken over through SSH', () => {
  test('the agent boot scans the silent agents of BMC-booted machines alone, through their own partial indexes', async () => {
    // 9,800 SSH machines, the odd ones never heartbeating since a start an hour ago and 1 in 3 of the even ones
    // heartbeating an hour ago: some 6,500 silent SSH agents the agent boot must not walk past. 200 BMC-booted ones
    // (i % 100 of 0 or 1), silent: the 100 odd ones (no heartbeat) and the 10 of i % 1000 = 0 (an old heartbeat).
    await db.admin(`
      WITH m AS (INSERT INTO machines SELECT gen_random_uuid() FROM generate_series(1, 10000) RETURNING machine_id),
        n AS (SELECT machine_id, row_number() OVER () AS i FROM m)
      INSERT INTO machine_provided (machine_id, provider, provider_id) SELECT machine_id, 'Mixed', 'mixed-' || i FROM n`);
    const i = `substring(provider_id FROM 7)::int`;
    await db.admin(`
      INSERT INTO machine_agent_boot (machine_id, boot_method)
      SELECT machine_id, 'network' FROM machine_provided WHERE provider = 'Mixed' AND ${i} % 100 IN (0, 1)`);
    await db.admin(`
      INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
      SELECT machine_id, now() - interval '1 hour', '\\x00' FROM machine_provided WHERE provider = 'Mixed'`);
    const silent = `${i} % 1000 = 0 OR (${i} % 100 <> 0 AND ${i} % 3 = 0)`;
    await db.admin(`
      INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
      SELECT machine_id, CASE WHEN ${silent} THEN now() - interval '1 hour' ELSE now() END
      FROM machine_provided WHERE provider = 'Mixed' AND ${i} % 2 = 0`);
    await db.admin('ANALYZE');
    expect(await bootable('Mixed')).toHaveLength(110);
    // The recoverer's, at least as many as it reads at once.
    expect(await recoverable('Mixed')).toHaveLength(1000);

    const session = await bmdb.startSession({ processor: 'agent-boot-silent-plan' });
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      const selection = agentBootSelection(q, { provider: 'Mixed' });
      const claim = claimSelectedStatement(selection.process, selection.query, [session.id]).compile(q);
      await client.query('BEGIN');
      await client.query(
        'SET LOCAL enable_seqscan = off; SET LOCAL enable_mergejoin = off; SET LOCAL enable_hashjoin = off',
      );
      const { rows } = await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${claim.sql}`, [...claim.parameters]);
      await client.query('ROLLBACK');
      const plan = rows.map((r) => r['QUERY PLAN']).join('\n');
      expect(plan).toMatch(/Index (Only )?Scan (using|on) machine_agent_heartbeat_boot_idx/);
      expect(plan).toMatch(/Index (Only )?Scan (using|on) machine_agent_started_boot_silent_idx/);
      // The indexes of every silent agent, SSH ones included, are the recoverer's alone.
      expect(plan).not.toMatch(/machine_agent_heartbeat_at_idx|machine_agent_started_silent_idx/);
      expect(plan).not.toMatch(
        /Seq Scan on machine_(provided|agent_pending|agent_boot|agent_started|agent_heartbeat)\b/,
      );
    } finally {
      await client.end();
      await session.close();
    }
  });
});

describe('decommissionWithWipe', () => {
  test('requests the wipe of an agentless machine whose BMC boots its agent (booted for it), refuses an SSH one', async () => {
    const blank = await machine('Wipe', 'virtual-media');
    const installed = await machine('Wipe', 'network');
    await install(installed);
    const sshOnly = await machine('Wipe', 'ssh');
    const report = await decommissionWithWipe(
      q,
      'Wipe',
      [await providerIdOf(blank), await providerIdOf(installed), await providerIdOf(sshOnly)],
      { actor: 'alice@ops', reason: 'returned', retryFailed: false },
    );
    expect(report.noAgent.map((m) => m.machineId)).toEqual([sshOnly]);
    expect(report.wiping.map((m) => [m.machineId, m.requestedNow]).sort()).toEqual(
      [
        [blank, true],
        [installed, true],
      ].sort(),
    );
    // Both are the agent booter's now: the blank one has no agent, the installed one a newer request.
    expect(await bootable('Wipe')).toEqual([blank, installed].sort());
  });
});
