import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { eventually } from '../../../test/support/wait.js';
import {
  BmcCredentialsError,
  BmcTimeoutError,
  BmcUnreachableError,
  BmcUnsupportedError,
  PowerOutcomeUnknownError,
  RedfishClient,
  type RedfishClientOptions,
  RedfishHttpError,
  type RedfishTarget,
  Secret,
} from '../src/index.js';
import { log } from '../src/internal/log.js';
import { chooseResetType } from '../src/redfish/reset-types.js';
import { FakeRedfishServer, selfSignedCertificate, type TestCertificate } from '../src/testing/index.js';

let certificate: TestCertificate;
const clients: RedfishClient[] = [];
const fakes: FakeRedfishServer[] = [];

beforeAll(async () => {
  certificate = await selfSignedCertificate();
});
afterAll(async () => {
  await Promise.all([...clients.map((c) => c.close()), ...fakes.map((f) => f.close())]);
});

async function fake(tls: boolean): Promise<FakeRedfishServer> {
  const server = await FakeRedfishServer.start(tls ? { tls: certificate } : {});
  fakes.push(server);
  return server;
}

function client(options: RedfishClientOptions = {}): RedfishClient {
  const made = new RedfishClient({ timeout: 2_000, retryDelay: 1, ca: certificate.cert, ...options });
  clients.push(made);
  return made;
}

function target(bmc: FakeRedfishServer, system: string, overrides: Partial<RedfishTarget> = {}): RedfishTarget {
  return {
    machine: `machine-${system}`,
    url: bmc.systemUrl(system),
    username: bmc.username,
    password: new Secret(bmc.password),
    ...overrides,
  };
}

async function failure(attempt: Promise<unknown>): Promise<Error> {
  const error = await attempt.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(Error);
  return error as Error;
}

describe.each([
  ['HTTP', false],
  ['HTTPS', true],
])('over %s', (_, tls) => {
  let bmc: FakeRedfishServer;

  beforeAll(async () => {
    bmc = await fake(tls);
  });

  test('a reset reads the system, picks ForceRestart and posts it; several systems each get their own', async () => {
    bmc.addSystem('1');
    bmc.addSystem('2');
    const redfish = client();
    const reset = await redfish.powerCycleSystem(target(bmc, '1'));
    expect(reset).toEqual({
      resetType: 'ForceRestart',
      target: `${bmc.url}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset`,
      status: 204,
    });
    await redfish.powerCycleSystem(target(bmc, '2'));
    expect(bmc.resets.map((r) => [r.system, r.resetType])).toEqual([
      ['1', 'ForceRestart'],
      ['2', 'ForceRestart'],
    ]);
    expect(bmc.requests.slice(-2).map((r) => `${r.method} ${r.path} ${r.username} ${r.status}`)).toEqual([
      'GET /redfish/v1/Systems/2 admin 200',
      'POST /redfish/v1/Systems/2/Actions/ComputerSystem.Reset admin 204',
    ]);
  });

  test('preference ForceRestart > PowerCycle > GracefulRestart, from the allowable values', async () => {
    bmc.addSystem('cycle', { allowableResetTypes: ['On', 'ForceOff', 'PowerCycle', 'GracefulRestart'] });
    bmc.addSystem('graceful', { allowableResetTypes: ['GracefulRestart', 'On'] });
    bmc.addSystem('info', { allowableResetTypes: ['PowerCycle'], actionInfo: true });
    const redfish = client();
    expect((await redfish.powerCycleSystem(target(bmc, 'cycle'))).resetType).toBe('PowerCycle');
    expect((await redfish.powerCycleSystem(target(bmc, 'graceful'))).resetType).toBe('GracefulRestart');
    // Listed in the action's ActionInfo instead of on the action.
    expect((await redfish.powerCycleSystem(target(bmc, 'info'))).resetType).toBe('PowerCycle');
    expect(bmc.resetsOf('info')).toHaveLength(1);
  });

  test('an override is used when the BMC allows it, refused when it does not', async () => {
    bmc.addSystem('override');
    const redfish = client();
    expect((await redfish.powerCycleSystem(target(bmc, 'override'), { resetType: 'PowerCycle' })).resetType).toBe(
      'PowerCycle',
    );
    const error = await failure(redfish.powerCycleSystem(target(bmc, 'override'), { resetType: 'Nmi' }));
    expect(error).toBeInstanceOf(BmcUnsupportedError);
    expect(error).toMatchObject({ protocol: 'redfish' });
    expect(error.message).toBe(
      `machine machine-override: BMC ${bmc.systemUrl('override')}: reset type Nmi (--redfish-reset-type) is not allowed by the BMC (allowed: On, ForceOff, GracefulShutdown, GracefulRestart, ForceRestart, PowerCycle)`,
    );
    expect(bmc.resetsOf('override').map((r) => r.resetType)).toEqual(['PowerCycle']);
  });

  test('odd allowable values: none usable, or none listed, fail naming the machine', async () => {
    bmc.addSystem('odd', { allowableResetTypes: ['On', 'ForceOff', 'Nmi', 'forcerestart', 'Reboot'] });
    bmc.addSystem('unlisted', { allowableResetTypes: null });
    const redfish = client();
    const odd = await failure(redfish.powerCycleSystem(target(bmc, 'odd')));
    expect(odd).toBeInstanceOf(BmcUnsupportedError);
    expect(odd).toMatchObject({ protocol: 'redfish' });
    expect(odd.message).toContain('machine machine-odd: BMC');
    expect(odd.message).toContain(
      'no allowable reset type to power-cycle with (want one of ForceRestart, PowerCycle, GracefulRestart; allowed: On, ForceOff, Nmi, forcerestart, Reboot)',
    );
    const unlisted = await failure(redfish.powerCycleSystem(target(bmc, 'unlisted')));
    expect(unlisted).toBeInstanceOf(BmcUnsupportedError);
    expect(unlisted).toMatchObject({ protocol: 'redfish' });
    expect(unlisted.message).toContain('none listed');
    // With an override, a BMC that lists nothing is taken at its word.
    expect((await redfish.powerCycleSystem(target(bmc, 'unlisted'), { resetType: 'ForceRestart' })).resetType).toBe(
      'ForceRestart',
    );
    expect(bmc.resetsOf('odd')).toEqual([]);
  });

  test('a system without a reset action fails, naming the machine', async () => {
    bmc.addSystem('noaction', { resetAction: false });
    const error = await failure(client().powerCycleSystem(target(bmc, 'noaction')));
    expect(error).toBeInstanceOf(BmcUnsupportedError);
    expect(error).toMatchObject({ protocol: 'redfish' });
    expect(error.message).toBe(
      `machine machine-noaction: BMC ${bmc.systemUrl('noaction')}: the ComputerSystem has no #ComputerSystem.Reset action with a target`,
    );
  });

  test('401: "BMC refused the credentials", at once, without retries or the password', async () => {
    bmc.addSystem('auth');
    const before = bmc.requests.length;
    const error = await failure(
      client({ maxAttempts: 5 }).powerCycleSystem(target(bmc, 'auth', { password: new Secret('wrong-password') })),
    );
    expect(error).toBeInstanceOf(BmcCredentialsError);
    expect(error).toMatchObject({ protocol: 'redfish' });
    expect(error.message).toBe(
      `machine machine-auth: BMC ${bmc.systemUrl('auth')}: BMC refused the credentials of user "admin" (HTTP 401)`,
    );
    expect(bmc.requests.length - before).toBe(1);
    // Injected, too (a BMC that locked the account).
    bmc.fail('auth', { status: 401 });
    const refused = await failure(client().powerCycleSystem(target(bmc, 'auth')));
    expect(refused).toBeInstanceOf(BmcCredentialsError);
    expect(refused).toMatchObject({ protocol: 'redfish' });
    expect(bmc.resetsOf('auth')).toEqual([]);
  });

  test('5xx is retried with a pause and then succeeds; one reset', async () => {
    bmc.addSystem('flaky');
    bmc.fail('flaky', { status: 503, times: 2 });
    bmc.fail('flaky', { status: 500, method: 'POST' });
    const reset = await client({ maxAttempts: 4 }).powerCycleSystem(target(bmc, 'flaky'));
    expect(reset.resetType).toBe('ForceRestart');
    expect(bmc.requests.filter((r) => r.system === 'flaky').map((r) => `${r.method} ${r.status}`)).toEqual([
      'GET 503',
      'GET 503',
      'GET 200',
      'POST 500',
      'POST 204',
    ]);
    expect(bmc.resetsOf('flaky')).toHaveLength(1);
  });

  test('5xx past the attempts fails with the BMC’s message; 4xx is not retried', async () => {
    bmc.addSystem('broken');
    bmc.fail('broken', { status: 500, times: 3 });
    const error = await failure(client({ maxAttempts: 3 }).powerCycleSystem(target(bmc, 'broken')));
    expect(error).toBeInstanceOf(RedfishHttpError);
    expect(error.message).toBe(
      `machine machine-broken: BMC ${bmc.systemUrl('broken')}: GET answered HTTP 500: injected HTTP 500`,
    );
    bmc.fail('broken', { status: 400 });
    const before = bmc.requests.length;
    const refused = await failure(client({ maxAttempts: 3 }).powerCycleSystem(target(bmc, 'broken')));
    expect(refused).toMatchObject({ status: 400 });
    expect(bmc.requests.length - before).toBe(1);
    // An unknown system: 404, not retried.
    expect(await failure(client().powerCycleSystem(target(bmc, 'nosuch')))).toMatchObject({ status: 404 });
  });

  test('a slow BMC times out (retried, then failed); a dropped connection is a network error', async () => {
    bmc.addSystem('slow');
    bmc.fail('slow', { delay: 1_000, times: 2 });
    const error = await failure(client({ timeout: 100, maxAttempts: 2 }).powerCycleSystem(target(bmc, 'slow')));
    expect(error).toBeInstanceOf(BmcTimeoutError);
    expect(error).toMatchObject({ protocol: 'redfish' });
    expect(error.message).toBe(
      `machine machine-slow: BMC ${bmc.systemUrl('slow')}: GET got no answer within 100 ms (timeout)`,
    );
    bmc.fail('slow', { drop: true, times: 2 });
    const dropped = await failure(client({ maxAttempts: 2 }).powerCycleSystem(target(bmc, 'slow')));
    expect(dropped).toBeInstanceOf(BmcUnreachableError);
    expect(dropped).toMatchObject({ protocol: 'redfish' });
    expect(dropped.message).toContain(`machine machine-slow: BMC ${bmc.systemUrl('slow')}: GET failed: `);
    // Once slow only: the retry gets through.
    bmc.fail('slow', { delay: 1_000 });
    expect((await client({ timeout: 300, maxAttempts: 2 }).powerCycleSystem(target(bmc, 'slow'))).resetType).toBe(
      'ForceRestart',
    );
  });

  test('a reset the BMC did but answered late, or not at all, is not posted again: its outcome is unknown', async () => {
    bmc.addSystem('late');
    const resetUrl = `${bmc.systemUrl('late')}/Actions/ComputerSystem.Reset`;
    const unknown = `the BMC may have acted on ForceRestart: not sent again (a second one would act twice); read the power state before trying again`;
    bmc.fail('late', { method: 'POST', afterActing: true, delay: 60_000 });
    const late = await failure(client({ maxAttempts: 3 }).powerCycleSystem(target(bmc, 'late')));
    expect(late).toBeInstanceOf(PowerOutcomeUnknownError);
    expect(late.cause).toBeInstanceOf(BmcTimeoutError);
    expect(late.cause).toMatchObject({ protocol: 'redfish' });
    expect(late.message).toBe(
      `machine machine-late: BMC ${resetUrl}: POST got no answer within 2000 ms (timeout); ${unknown}`,
    );
    expect(bmc.resetsOf('late')).toHaveLength(1);
    // The connection cut once the reset was done: the same.
    bmc.fail('late', { method: 'POST', afterActing: true, drop: true });
    const dropped = await failure(client({ maxAttempts: 3 }).powerCycleSystem(target(bmc, 'late')));
    expect(dropped).toBeInstanceOf(PowerOutcomeUnknownError);
    expect(dropped.cause).toBeInstanceOf(BmcUnreachableError);
    expect(dropped.cause).toMatchObject({ protocol: 'redfish' });
    expect(dropped.message).toMatch(new RegExp(`; ${unknown.replace(/[()]/g, '\\$&')}$`));
    expect(bmc.resetsOf('late')).toHaveLength(2);
    // A power off leaves the system as one did: posted again after a late answer.
    bmc.fail('late', { method: 'POST', afterActing: true, delay: 60_000 });
    const off = await client({ maxAttempts: 3 }).powerSystem(target(bmc, 'late'), ['ForceOff'], 'power off');
    expect(off.resetType).toBe('ForceOff');
    expect(bmc.resetsOf('late').map((reset) => reset.resetType)).toEqual([
      'ForceRestart',
      'ForceRestart',
      'ForceOff',
      'ForceOff',
    ]);
  });

  test('the concurrency bound holds across machines', async () => {
    for (let i = 0; i < 6; i++) bmc.addSystem(`conc${i}`);
    // Each request waits at the BMC until as many as the bound allows are there
    // at once (a condition, not a delay a loaded machine might outlast).
    const heldUntilPeak = async (redfish: RedfishClient, peak: number) => {
      let release = () => {};
      const until = new Promise<void>((resolve) => {
        release = resolve;
      });
      for (let i = 0; i < 6; i++) bmc.fail(`conc${i}`, { until });
      bmc.resetPeak();
      const cycles = Promise.all(
        Array.from({ length: 6 }, (_, i) => redfish.powerCycleSystem(target(bmc, `conc${i}`))),
      );
      await eventually(`${peak} requests at the BMC at once`, async () =>
        bmc.peakConcurrency >= peak ? true : undefined,
      );
      release();
      await cycles;
    };
    await heldUntilPeak(client({ concurrency: 2 }), 2);
    expect(bmc.resets.filter((r) => r.system.startsWith('conc'))).toHaveLength(6);
    expect(bmc.peakConcurrency).toBe(2);
    // Unbounded, all six are at the BMC at once.
    await heldUntilPeak(client({ concurrency: 6 }), 6);
    expect(bmc.peakConcurrency).toBe(6);
  });

  test('an aborted signal ends a reset at once', async () => {
    bmc.addSystem('abort');
    bmc.fail('abort', { delay: 5_000 });
    const stop = new AbortController();
    const reset = client({ timeout: 10_000 }).powerCycleSystem(target(bmc, 'abort'), {}, stop.signal);
    stop.abort(new Error('stopping'));
    await expect(reset).rejects.toThrow('stopping');
  });
});

describe('TLS', () => {
  test('a BMC whose certificate the CA did not sign is refused; insecure skips verification', async () => {
    const bmc = await fake(true);
    bmc.addSystem('1');
    // The system trust store does not know the self-signed certificate.
    const strict = new RedfishClient({ retryDelay: 1, maxAttempts: 1 });
    clients.push(strict);
    const error = await failure(strict.powerCycleSystem(target(bmc, '1')));
    expect(error).toBeInstanceOf(BmcUnreachableError);
    expect(error).toMatchObject({ protocol: 'redfish' });
    expect(error.message).toMatch(/self[- ]signed certificate/i);
    expect(bmc.resets).toEqual([]);

    const reset = await strict.powerCycleSystem(target(bmc, '1', { insecure: true }));
    expect(reset.resetType).toBe('ForceRestart');
    expect(bmc.resets).toHaveLength(1);
  });
});

test('the password never appears in errors', async () => {
  const bmc = await fake(false);
  bmc.addSystem('1');
  const password = new Secret('Sup3r-s3cret');
  const errors = [
    await failure(client().powerCycleSystem(target(bmc, '1', { password }))),
    await failure(
      client({ maxAttempts: 1 }).powerCycleSystem(
        target(bmc, '1', { url: 'http://127.0.0.1:1/redfish/v1/Systems/1', password }),
      ),
    ),
  ];
  for (const error of errors) {
    expect(`${error.message} ${JSON.stringify(error)} ${String(error.cause ?? '')}`).not.toContain('Sup3r-s3cret');
  }
});

test('chooseResetType', () => {
  const where = { machine: 'm', url: 'https://bmc/redfish/v1/Systems/1' };
  expect(chooseResetType(where, ['GracefulRestart', 'PowerCycle', 'ForceRestart'], undefined)).toBe('ForceRestart');
  expect(chooseResetType(where, ['GracefulRestart', 'PowerCycle'], undefined)).toBe('PowerCycle');
  expect(chooseResetType(where, ['GracefulRestart'], undefined)).toBe('GracefulRestart');
  expect(chooseResetType(where, ['GracefulRestart'], 'GracefulRestart')).toBe('GracefulRestart');
  expect(() => chooseResetType(where, [], undefined)).toThrow(BmcUnsupportedError);
});

test('insecure and plain-http BMCs are warned about once per machine', async () => {
  const { lines, restore } = captureDebugLog(log.redfish.namespace);
  try {
    const plain = await fake(false);
    const secure = await fake(true);
    plain.addSystem('1');
    secure.addSystem('1');
    const redfish = client();
    for (let i = 0; i < 3; i++) {
      await redfish.powerCycleSystem(target(plain, '1', { machine: 'lab-node' }));
      await redfish.powerCycleSystem(target(secure, '1', { machine: 'odd-cert-node', insecure: true }));
    }
    const warnings = lines.filter((line) => line.includes('warning:'));
    expect(warnings).toHaveLength(2);
    expect(warnings[0]).toContain(`warning: machine lab-node: BMC ${plain.systemUrl('1')} is plain http://`);
    expect(warnings[1]).toContain(
      `warning: machine odd-cert-node: TLS certificate of BMC ${secure.systemUrl('1')} is not verified (insecure: true in the inventory)`,
    );
    expect(lines.join('\n')).not.toContain(plain.password);
  } finally {
    restore();
  }
});
