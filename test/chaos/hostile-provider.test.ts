import { parseLimiter, SessionClosedError, SessionExpiredError } from '@bmaas/bmdb-controlloop';
import { providedMachines } from '@bmaas/bmdb-model';
import { sleep } from '@bmaas/common';
import { EQUINIX_PROVIDER, EquinixClient, EquinixProvider, EquinixStatusUpdater } from '@bmaas/provider-equinix';
import { FakeEquinixApi, type FakeFault, type FakeRoute } from '@bmaas/provider-equinix/testing';
import { Initializer, ProviderDiscrepancyError, Provisioner } from '@bmaas/shepherd-manager';
import { FakeSshClient } from '@bmaas/shepherd-manager/testing';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../support/database.js';
import { captureDebugLog } from '../support/debug-log.js';
import { eventually, table } from './helpers.js';

const RESERVATIONS = 12;
const REQUEST_TIMEOUT = 1_000;
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFc0gXoIKZ7PSJtVk0V1YeZ0m3c0p3dTk0lIFOgM3Ol5 chaos@test';

let api: FakeEquinixApi;
let logs: string[] = [];

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  // New devices are provisioning (no address) for their first read.
  api = await FakeEquinixApi.start({ reservations: RESERVATIONS, publicIpv4: '127.0.0.1', provisioningReads: 1 });
  // The shepherd's log, for counting what it said.
  const captured = captureDebugLog('shepherd:*');
  afterAll(() => captured.restore());
  logs = captured.lines;
});
afterAll(() => api?.close());

/** A small deterministic PRNG, so a failing run can be replayed from its seed. */
function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

const ROUTES: readonly FakeRoute[] = [
  'GET /projects/{id}/devices',
  'POST /projects/{id}/devices',
  'GET /projects/{id}/hardware-reservations',
  'GET /devices/{id}',
  'GET /projects/{id}/ssh-keys',
];
const FAULTS: ReadonlyArray<[string, FakeFault]> = [
  ['500', { status: 500 }],
  ['503 twice', { status: 503, times: 2 }],
  ['429 Retry-After 1', { status: 429, retryAfter: 1 }],
  ['slower than the timeout', { delay: REQUEST_TIMEOUT + 500 }],
  ['malformed JSON', { malformed: true }],
  ['answer lost', { drop: true }],
  ['500 after acting', { status: 500, afterProcessing: true }],
];
/** A call that passes (after a millisecond): spaces the faults out in a route's queue. */
const PASS: FakeFault = { delay: 1 };

function providerParts(registry: Registry) {
  const client = new EquinixClient({
    apiKey: api.apiKey,
    baseUrl: api.url,
    requestTimeout: REQUEST_TIMEOUT,
    // Three devices a page: every listing is several requests, and can change between them.
    pageSize: 3,
    rateLimiter: parseLimiter('1ms,1000'),
    retry: { baseDelay: 20, maxDelay: 200, maxRetryAfter: 2_000 },
    metrics: registry,
  });
  const provider = new EquinixProvider({
    client,
    projectId: api.projectId,
    devicePrefix: 'chaos-',
    os: 'ubuntu_22_04',
    sshKeyLabel: 'chaos',
    sshPublicKey: KEY,
    // Listed afresh on every pass: more calls, more faults met.
    reservationCacheTimeout: 1,
    // A creation the faults failed past the client's retries penalises its reservation (an hour
    // by default): here for two seconds, so the run converges with the reservation tried again.
    penaltyDuration: 2_000,
  });
  const provisioner = new Provisioner(provider, {
    maxCount: 0,
    chunkSize: 4,
    reconcileLimiter: parseLimiter('200ms,1'),
    creationLimiter: parseLimiter('1ms,100'),
  });
  const ssh = new FakeSshClient();
  const initializer = new Initializer(provider, {
    agentExecutable: new Uint8Array([1]),
    agentEndpoint: 'bmaas.example.com:443',
    sshClient: ssh,
  });
  const updater = new EquinixStatusUpdater({ client, projectId: api.projectId, pollInterval: 200, settledInterval: 0 });
  return { client, provider, provisioner, initializer, updater, ssh };
}

const count = async (sql: string) => (await db.admin(sql)).rows[0].n as number;

/** Every device the API has, by reservation: at most one each, or the test fails. */
function devicesByReservation(): Map<string, string[]> {
  const byReservation = new Map<string, string[]>();
  for (const device of api.devices) {
    const reservation = device.hardware_reservation?.href?.split('/').pop() ?? '(none)';
    byReservation.set(reservation, [...(byReservation.get(reservation) ?? []), device.id]);
  }
  return byReservation;
}

async function bmdbProviderIds(): Promise<string[]> {
  return (await providedMachines(bmdb.db, EQUINIX_PROVIDER)).map((m) => m.providerId).sort();
}

test('500s, 429s, timeouts, malformed JSON and lost answers on every route: no crash, no duplicate, nothing lost', async () => {
  const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
  const random = prng(seed);
  // Said first, so that a run that never converges can be replayed too.
  console.log(`hostile provider API: seed ${seed} (CHAOS_SEED=${seed} replays it)`);
  const injected = new Map<string, number>();
  for (const route of ROUTES) {
    for (let i = 0; i < 24; i++) {
      const pick = FAULTS[Math.floor(random() * FAULTS.length)];
      if (!pick || random() < 0.5) {
        api.fail(route, PASS);
        continue;
      }
      const [name, fault] = pick;
      api.fail(route, fault);
      injected.set(name, (injected.get(name) ?? 0) + 1);
    }
  }
  const registry = new Registry();
  const parts = providerParts(registry);
  const stop = new AbortController();
  const { signal } = stop;
  const loopOptions = { claimLimiter: parseLimiter('1ms,1000'), signal, parallelism: 4 };
  const running = Promise.all([
    parts.provisioner.run(bmdb, { signal }),
    parts.initializer.run(bmdb, loopOptions),
    parts.updater.run(bmdb, { signal }),
  ]);
  const started = Date.now();
  let converged: number;
  try {
    converged = await eventually(
      'every reservation a device, every device a machine with its agent started and its status known',
      async () => {
        // Failed agent starts (the API failed the initializer past its retries) back off for
        // minutes: move their time along.
        await db.admin("UPDATE work_backoff SET until = now() WHERE until > now() AND process = 'ShepherdAgentStart'");
        const done =
          (await count('SELECT count(*)::int AS n FROM machine_agent_started')) === RESERVATIONS &&
          (await count("SELECT count(*)::int AS n FROM machine_provided WHERE provider_status = 'Running'")) ===
            RESERVATIONS;
        return done ? Date.now() - started : undefined;
      },
      90_000,
    );
  } catch (error) {
    console.log(`hostile provider API (seed ${seed}) did not converge:\n${await describeState()}`);
    throw error;
  } finally {
    stop.abort();
    await running;
  }

  // No duplicate device: one per reservation, each under the hostname the shepherd gives it.
  const byReservation = devicesByReservation();
  expect(api.devices).toHaveLength(RESERVATIONS);
  expect([...byReservation.values()].filter((ids) => ids.length > 1)).toEqual([]);
  expect(new Set(api.devices.map((d) => d.hostname)).size).toBe(RESERVATIONS);
  // No machine lost, none extra: the BMDB holds exactly the API's devices, once each.
  expect(await bmdbProviderIds()).toEqual(api.devices.map((d) => d.id).sort());
  expect(await count('SELECT count(*)::int AS n FROM machines')).toBe(RESERVATIONS);
  expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
  // Every agent started once: failures were the API's, before any agent ran.
  expect(parts.ssh.executions).toHaveLength(RESERVATIONS);

  const retries = (await registry.getSingleMetric('equinix_api_retries_total')?.get())?.values ?? [];
  const byReason = new Map<string, number>();
  for (const value of retries) {
    const reason = String(value.labels.reason);
    byReason.set(reason, (byReason.get(reason) ?? 0) + value.value);
  }
  const failedStarts = await count(
    "SELECT count(*)::int AS n FROM work_history WHERE process = 'ShepherdAgentStart' AND event = 'Failed'",
  );
  console.log(
    `hostile provider API (seed ${seed}): ${[...injected.values()].reduce((a, b) => a + b, 0)} faults injected on ` +
      `${ROUTES.length} routes; converged in ${converged} ms: ${RESERVATIONS} devices, no duplicate, ${RESERVATIONS} ` +
      `machines, none lost; ${failedStarts} agent starts failed by the API (retried), ` +
      `${logs.filter((l) => /reconciliation failed/.test(l)).length} reconciliation passes failed, ` +
      `${logs.filter((l) => /failed; penalised until/.test(l)).length} creations failed into the penalty box\n` +
      table([
        ...[...injected].map(([fault, n]) => ({ what: `injected: ${fault}`, count: n })),
        ...[...byReason].map(([reason, n]) => ({ what: `client retried: ${reason}`, count: n })),
      ]),
  );
}, 120_000);

/** What the API and the BMDB hold, and what the shepherd said last: for a run that did not converge. */
async function describeState(): Promise<string> {
  const rows = await db.admin(
    `SELECT m.machine_id, p.provider_id, p.provider_status, a.machine_id IS NOT NULL AS started,
            (SELECT string_agg(b.process || ': ' || b.cause || ' until ' || b.until, '; ')
             FROM work_backoff b WHERE b.machine_id = m.machine_id) AS backoff,
            (SELECT string_agg(w.process, ', ') FROM work w WHERE w.machine_id = m.machine_id) AS work
     FROM machines m LEFT JOIN machine_provided p USING (machine_id)
     LEFT JOIN machine_agent_started a USING (machine_id)`,
  );
  return [
    `API: ${api.devices.length} devices (${api.devices.map((d) => `${d.id.slice(0, 8)} ${d.state}`).join(', ')})`,
    `BMDB: ${rows.rows.length} machines`,
    table(rows.rows.map((r) => ({ ...r, machine_id: String(r.machine_id).slice(0, 8) }))),
    'last log lines:',
    ...logs.slice(-40),
  ].join('\n');
}

test('device pages that change between requests: the provisioner refuses the inconsistent listing, the updater loses nothing', async () => {
  api.clearFaults();
  const { provisioner, updater } = providerParts(new Registry());
  const devicesBefore = api.devices.length;
  const extra = api.addReservations(2);
  const session = await bmdb.startSession({ processor: 'chaos' });
  try {
    // Page 1 is served; page 2 waits while the project changes: a device on page 1 goes away and
    // comes back (another tool touching it), so it now sorts last. Page 2 starts one device later:
    // one device is never listed, and the moved one is listed twice.
    const shift = async (run: () => Promise<unknown>) => {
      const listings = api.requestsTo('GET /projects/{id}/devices').length;
      api.fail('GET /projects/{id}/devices', PASS);
      api.fail('GET /projects/{id}/devices', { delay: 300 });
      const result = run().then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      );
      await eventually(
        'page 2 requested',
        async () => (api.requestsTo('GET /projects/{id}/devices').length >= listings + 2 ? true : undefined),
        5_000,
      );
      const [first] = api.devices;
      if (!first) throw new Error('no device');
      const reservationId = first.hardware_reservation?.href?.split('/').pop();
      api.removeDevice(first.id);
      api.addDevice({ id: first.id, hostname: first.hostname, reservationId, state: first.state, ipv4: '127.0.0.1' });
      const order = api.devices.map((d) => d.id);
      return { result: await result, skipped: order[2] ?? '', moved: first.id };
    };

    const refused = await shift(() => provisioner.reconcile(session));
    expect('error' in refused.result && refused.result.error).toBeInstanceOf(ProviderDiscrepancyError);
    const error = (refused.result as { error: ProviderDiscrepancyError }).error;
    // Exactly the device the shifted pages hid is named, and nothing was created meanwhile.
    expect(error.missingFromProvider).toEqual([refused.skipped]);
    expect(error.missingFromBMDB).toEqual([]);
    expect(api.devices).toHaveLength(devicesBefore);

    // The next, consistent listing goes ahead and brings the two new reservations in.
    const report = await provisioner.reconcile(session);
    expect(report.created).toHaveLength(2);
    expect(devicesByReservation().get(extra[0]?.id ?? '')).toHaveLength(1);

    // The status updater fetches a device missing from a listing on its own: none is taken for gone.
    const synced = await shift(() => updater.syncOnce(session, { all: true }));
    expect('value' in synced.result).toBe(true);
    expect((synced.result as { value: { missing: number } }).value.missing).toBe(0);
    expect(await count("SELECT count(*)::int AS n FROM machine_provided WHERE provider_status = 'Missing'")).toBe(0);
    expect(await bmdbProviderIds()).toEqual(api.devices.map((d) => d.id).sort());
    expect([...devicesByReservation().values()].filter((ids) => ids.length > 1)).toEqual([]);
    console.log(
      `changing pages: a listing that skipped device ${refused.skipped.slice(0, 8)} and listed ` +
        `${refused.moved.slice(0, 8)} twice was refused (${error.message.length} chars, naming the skipped device), ` +
        `the next pass created ${report.created.length}; the updater's pass with a skipped device marked 0 Missing`,
    );
  } finally {
    await session.close().catch((e: unknown) => {
      if (!(e instanceof SessionClosedError || e instanceof SessionExpiredError)) throw e;
    });
  }
  await sleep(0);
});
