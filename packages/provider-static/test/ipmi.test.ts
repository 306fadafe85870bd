/**
 * The IPMI client against OpenIPMI's real `ipmi_sim` through Debian's real
 * `ipmitool`: every power action and the boot device reach the simulated
 * chassis; wrong password, unknown user, a cipher suite the BMC lacks, a
 * BMC without chassis control, an unreachable BMC and a hung ipmitool each
 * fail with their own error naming the machine; only the unreachable and
 * the hung one are retried; the password is never on a command line; the
 * fleet-wide bound holds. A wrapper around ipmitool records each run.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { PowerState } from '@bmaas/bmdb-model';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  BmcCredentialsError,
  BmcTimeoutError,
  BmcUnreachableError,
  BmcUnsupportedError,
  IpmiClient,
  type IpmiClientOptions,
  type IpmiTarget,
  IpmitoolMissingError,
  PowerOutcomeUnknownError,
  RedfishClient,
  Secret,
  StaticProvider,
  type StaticProviderOptions,
} from '../src/index.js';
import { IpmiSimulator, onPath } from '../src/testing/index.js';

const hasTools = (await IpmiSimulator.available()) && (await onPath('ipmitool'));
if (!hasTools) {
  console.warn(
    'IPMI tests skipped: ipmi_sim or ipmitool is missing (install them with: apt-get install -y openipmi ipmitool)',
  );
}

const PASSWORD = 'pw-0123456789';

describe.skipIf(!hasTools)('IpmiClient against ipmi_sim', () => {
  let bmc: IpmiSimulator;
  let dir: string;
  /** ipmitool behind a wrapper that records each run's arguments and environment. */
  let wrapper: string;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'ipmi-test-'));
    bmc = await IpmiSimulator.start({ password: PASSWORD });
    wrapper = path.join(dir, 'ipmitool');
    await writeFile(
      wrapper,
      `#!/bin/sh
{ echo "args: $*"; echo "env: $(env | cut -d= -f1 | sort | tr '\\n' ' ')"; echo "password: \${IPMI_PASSWORD:+set}"; } >> ${dir}/runs
exec ipmitool "$@"
`,
      { mode: 0o755 },
    );
  });
  afterAll(async () => {
    await bmc?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  function client(options: IpmiClientOptions = {}): IpmiClient {
    return new IpmiClient({
      ipmitool: wrapper,
      timeout: 10_000,
      retryDelay: 1,
      messageTimeout: 1,
      messageRetries: 1,
      ...options,
    });
  }

  function target(overrides: Partial<IpmiTarget> = {}): IpmiTarget {
    return {
      machine: 'node07',
      host: bmc.host,
      port: bmc.port,
      username: bmc.username,
      password: new Secret(PASSWORD),
      cipherSuite: 3,
      ...overrides,
    };
  }

  async function runs(): Promise<string[]> {
    const text = await readFile(path.join(dir, 'runs'), 'utf8').catch(() => '');
    return text.split('\n').filter((line) => line.startsWith('args: '));
  }

  async function failure(attempt: Promise<unknown>): Promise<Error> {
    const error = await attempt.then(
      () => undefined,
      (e: unknown) => e,
    );
    if (!(error instanceof Error)) throw new Error(`expected a failure, got ${String(error)}`);
    return error;
  }

  test('each power action reaches the chassis; status reads it back', async () => {
    const ipmi = client();
    const before = (await bmc.calls()).length;
    expect(await ipmi.powerState(target())).toBe('On');
    await ipmi.power(target(), 'off');
    expect(await bmc.powerOn()).toBe(false);
    expect(await ipmi.powerState(target())).toBe('Off');
    await ipmi.power(target(), 'on');
    expect(await ipmi.powerState(target())).toBe('On');
    await ipmi.power(target(), 'soft');
    expect(await ipmi.powerState(target())).toBe('Off');
    await ipmi.power(target(), 'on');
    await ipmi.power(target(), 'reset');
    await ipmi.power(target(), 'cycle');
    // What ipmi_sim asked its chassis control, in order (a cycle is a power down, then up after its interval).
    expect((await bmc.calls()).slice(before)).toEqual([
      'get power',
      'set power 0',
      'get power',
      'set power 1',
      'get power',
      'set shutdown 1',
      'get power',
      'set power 1',
      'set reset 1',
      'set power 0',
    ]);
  });

  test('the boot device is set for the next boot', async () => {
    const before = (await bmc.calls()).length;
    await client().setBootDevice(target(), 'pxe');
    await client().setBootDevice(target(), 'cdrom', { persistent: true });
    expect((await bmc.calls()).slice(before)).toEqual(['get boot', 'set boot pxe', 'get boot', 'set boot cdrom']);
    await expect(client().setBootDevice(target(), 'usb' as 'pxe')).rejects.toThrow(RangeError);
  });

  test('the password reaches ipmitool through its environment only: never its command line', async () => {
    process.env.SHEPHERD_TEST_IPMI_SECRET_ELSEWHERE = 'x';
    try {
      await client().powerState(target());
    } finally {
      delete process.env.SHEPHERD_TEST_IPMI_SECRET_ELSEWHERE;
    }
    const text = await readFile(path.join(dir, 'runs'), 'utf8');
    const last = text.trim().split('\n').slice(-3);
    expect(last[0]).toMatch(/^args: -I lanplus -H 127\.0\.0\.1 -p \d+ -U admin -E -C 3 -v/);
    expect(text).not.toContain(PASSWORD);
    expect(last[2]).toBe('password: set');
    // Only what ipmitool needs: none of the shepherd's own variables (an API key, say).
    expect(
      last[1]?.split(' ').filter((name) => name !== '' && name !== 'PWD' && name !== 'SHLVL' && name !== '_'),
    ).toEqual(['env:', 'IPMI_PASSWORD', 'LC_ALL', 'PATH']);
  });

  test('a wrong password is refused as credentials, named, and not retried', async () => {
    const before = (await runs()).length;
    const error = await failure(client().powerState(target({ password: new Secret('wrong-password') })));
    expect(error).toBeInstanceOf(BmcCredentialsError);
    expect(error).toMatchObject({ protocol: 'ipmi' });
    expect(error.message).toMatch(/^machine node07: IPMI BMC 127\.0\.0\.1:\d+: chassis power status: the BMC refused/);
    expect(error.message).toContain('user "admin"');
    expect(error.message).not.toContain('wrong-password');
    expect((await runs()).length - before).toBe(1);
  });

  test('an unknown user is refused as credentials', async () => {
    const error = await failure(client().power(target({ username: 'nobody' }), 'on'));
    expect(error).toBeInstanceOf(BmcCredentialsError);
    expect(error).toMatchObject({ protocol: 'ipmi' });
    expect(error.message).toContain('unauthorized name');
  });

  test('a cipher suite the BMC lacks is named (ipmi_sim speaks 3, not 17)', async () => {
    const error = await failure(client().powerState(target({ cipherSuite: 17 })));
    expect(error).toBeInstanceOf(BmcUnsupportedError);
    expect(error).toMatchObject({ protocol: 'ipmi' });
    expect(error.message).toContain('does not offer cipher suite 17');
  });

  test('a BMC without chassis control: the command is not supported, not retried', async () => {
    const bare = await IpmiSimulator.start({ chassisDevice: false, password: PASSWORD });
    try {
      const before = (await runs()).length;
      const error = await failure(client().power(target({ port: bare.port }), 'reset'));
      expect(error).toBeInstanceOf(BmcUnsupportedError);
      expect(error).toMatchObject({ protocol: 'ipmi' });
      expect(error.message).toMatch(/chassis power reset: .*Invalid command \(not supported\)$/);
      expect((await runs()).length - before).toBe(1);
    } finally {
      await bare.close();
    }
  });

  test('an unreachable BMC is retried, then named as unreachable', async () => {
    const silent = await IpmiSimulator.start({ password: PASSWORD });
    const port = silent.port;
    await silent.close();
    const before = (await runs()).length;
    const error = await failure(client({ maxAttempts: 2 }).powerState(target({ machine: 'node08', port })));
    expect(error).toBeInstanceOf(BmcUnreachableError);
    expect(error).toMatchObject({ protocol: 'ipmi' });
    expect(error.message).toMatch(
      new RegExp(`^machine node08: IPMI BMC 127\\.0\\.0\\.1:${port}: .*no answer from the BMC`),
    );
    expect((await runs()).length - before).toBe(2);
  });

  test('a hung ipmitool is killed at the timeout and retried', async () => {
    const hung = path.join(dir, 'hung-ipmitool');
    await writeFile(hung, `#!/bin/sh\necho $$ >> ${dir}/hung-pids\nexec sleep 600\n`, { mode: 0o755 });
    const error = await failure(
      new IpmiClient({ ipmitool: hung, timeout: 300, maxAttempts: 2, retryDelay: 1 }).powerState(target()),
    );
    expect(error).toBeInstanceOf(BmcTimeoutError);
    expect(error).toMatchObject({ protocol: 'ipmi' });
    expect(error.message).toContain('within 300 ms');
    const pids = (await readFile(path.join(dir, 'hung-pids'), 'utf8')).trim().split('\n').map(Number);
    expect(pids).toHaveLength(2);
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow();
  });

  test('an abort kills ipmitool and rejects with the reason', async () => {
    const hung = path.join(dir, 'hung-ipmitool-2');
    await writeFile(hung, `#!/bin/sh\necho $$ > ${dir}/aborted-pid\nexec sleep 600\n`, { mode: 0o755 });
    const controller = new AbortController();
    const pending = new IpmiClient({ ipmitool: hung }).powerState(target(), controller.signal);
    const pid = await (async () => {
      for (;;) {
        const text = await readFile(path.join(dir, 'aborted-pid'), 'utf8').catch(() => '');
        if (text.trim() !== '') return Number(text);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    controller.abort(new Error('stopping'));
    await expect(pending).rejects.toThrow('stopping');
    expect(() => process.kill(pid, 0)).toThrow();
  });

  /**
   * ipmi_sim behind a chassis control that does the first reset, then takes
   * 5 s to return (ipmi_sim answers nothing meanwhile): a BMC that reset
   * the machine but answered late. Later resets return at once.
   */
  async function lateBmc(): Promise<IpmiSimulator> {
    const lateDir = await mkdtemp(path.join(dir, 'late-'));
    const script = path.join(lateDir, 'chassis-control');
    await writeFile(
      script,
      `#!/bin/sh
echo "$*" >> ${lateDir}/calls
case "$*" in
  "get power") echo "power:1" ;;
  *reset*) [ -e ${lateDir}/reset ] || { touch ${lateDir}/reset; sleep 5; } ;;
esac
`,
      { mode: 0o755 },
    );
    const late = await IpmiSimulator.start({ password: PASSWORD, chassisControl: script });
    resets.set(late, path.join(lateDir, 'calls'));
    return late;
  }
  const resets = new Map<IpmiSimulator, string>();

  /** The resets `late` did, once every message sent to it before was handled (it answers in order). */
  async function resetsDone(late: IpmiSimulator): Promise<number> {
    expect(await client({ maxAttempts: 20 }).powerState(target({ port: late.port }))).toBe('On');
    const calls = await readFile(resets.get(late) as string, 'utf8');
    return calls.split('\n').filter((line) => line === 'set reset 1').length;
  }

  test.each([
    ['ipmitool sends it again', { messageTimeout: 1, messageRetries: 4, timeout: 20_000 }, BmcUnreachableError],
    ['the client runs ipmitool again', { messageTimeout: 20, messageRetries: 1, timeout: 4_000 }, BmcTimeoutError],
  ] as const)(
    'a reset the BMC did but answered late is not sent again (%s): its outcome is unknown',
    async (_, options, cause) => {
      const late = await lateBmc();
      try {
        const error = await failure(client({ ...options, maxAttempts: 3 }).power(target({ port: late.port }), 'reset'));
        expect(error).toBeInstanceOf(PowerOutcomeUnknownError);
        expect(error.cause).toBeInstanceOf(cause);
        expect(error.cause).toMatchObject({ protocol: 'ipmi' });
        expect(error.message).toMatch(
          new RegExp(
            `^machine node07: IPMI BMC 127\\.0\\.0\\.1:${late.port}: chassis power reset: .*; the BMC may have acted on chassis power reset: not sent again \\(a second one would act twice\\); read the power state before trying again$`,
          ),
        );
        expect(await resetsDone(late)).toBe(1);
      } finally {
        await late.close();
      }
    },
  );

  test('a reset or cycle that reached no BMC (no session was set up) is retried', async () => {
    const silent = await IpmiSimulator.start({ password: PASSWORD });
    const port = silent.port;
    await silent.close();
    for (const action of ['reset', 'cycle'] as const) {
      const before = (await runs()).length;
      const error = await failure(client({ maxAttempts: 2 }).power(target({ machine: 'node08', port }), action));
      expect(error).toBeInstanceOf(BmcUnreachableError);
      expect(error).toMatchObject({ protocol: 'ipmi' });
      expect((await runs()).length - before).toBe(2);
    }
  });

  test('the static provider drives an inventory machine whose bmc is IPMI: state, off, on, the reset', async () => {
    const passwordFile = path.join(dir, 'node09-password');
    await writeFile(passwordFile, `${PASSWORD}\n`, { mode: 0o600 });
    const inventory = path.join(dir, 'inventory.json');
    await writeFile(
      inventory,
      JSON.stringify([
        {
          id: 'node09',
          address: '192.0.2.9',
          bmc: { protocol: 'ipmi', host: bmc.host, port: bmc.port, username: 'admin', passwordFile, cipherSuite: 3 },
        },
      ]),
    );
    const provider = new StaticProvider({ inventory, redfish: new RedfishClient(), ipmi: client() });
    const before = (await bmc.calls()).length;
    expect(await provider.readPowerState('node09')).toBe(PowerState.On);
    expect(await provider.powerOff('node09', { graceful: true })).toEqual({ command: 'chassis power soft' });
    expect(await provider.readPowerState('node09')).toBe(PowerState.Off);
    expect(await provider.powerOn('node09')).toEqual({ command: 'chassis power on' });
    expect(await provider.powerOff('node09', { graceful: false })).toEqual({ command: 'chassis power off' });
    await provider.powerOn('node09');
    // The recoverer's power cycle of a silent machine, then an operator's `power cycle`: the same call.
    await provider.powerCycle('node09');
    expect(await provider.powerCycle('node09')).toEqual({ command: 'chassis power reset' });
    expect((await bmc.calls()).slice(before).filter((call) => call.startsWith('set'))).toEqual([
      'set shutdown 1',
      'set power 1',
      'set power 0',
      'set power 1',
      'set reset 1',
      'set reset 1',
    ]);
    // A wrong password file: the machine and the cause are named.
    await writeFile(passwordFile, 'not-the-password\n', { mode: 0o600 });
    const error = await failure(provider.readPowerState('node09'));
    expect(error).toBeInstanceOf(BmcCredentialsError);
    expect(error).toMatchObject({ protocol: 'ipmi' });
    expect(error.message).toMatch(/^machine node09: IPMI BMC 127\.0\.0\.1:\d+: chassis power status: the BMC refused/);
  });

  test("an IPMI BMC without credentials in the inventory takes --ipmi-*'s defaults, else --redfish-*'s", async () => {
    const right = path.join(dir, 'ipmi-default-password');
    const wrong = path.join(dir, 'redfish-default-password');
    await writeFile(right, `${PASSWORD}\n`, { mode: 0o600 });
    await writeFile(wrong, 'the-redfish-password\n', { mode: 0o600 });
    const inventory = path.join(dir, 'defaults-inventory.json');
    await writeFile(
      inventory,
      JSON.stringify([
        {
          id: 'node10',
          address: '192.0.2.10',
          bmc: { protocol: 'ipmi', host: bmc.host, port: bmc.port, cipherSuite: 3 },
        },
      ]),
    );
    const withDefaults = (options: Partial<StaticProviderOptions>) =>
      new StaticProvider({ inventory, redfish: new RedfishClient(), ipmi: client(), ...options });
    // The IPMI defaults win over the Redfish ones.
    const both = withDefaults({
      defaultCredentials: { username: 'nobody', passwordFile: wrong },
      defaultIpmiCredentials: { username: 'admin', passwordFile: right },
    });
    expect(await both.readPowerState('node10')).toBe(PowerState.On);
    // Each one unset falls back to the Redfish default.
    const fallback = withDefaults({
      defaultCredentials: { username: 'admin', passwordFile: wrong },
      defaultIpmiCredentials: { passwordFile: right },
    });
    expect(await fallback.readPowerState('node10')).toBe(PowerState.On);
    const redfishOnly = withDefaults({ defaultCredentials: { username: 'admin', passwordFile: wrong } });
    const refused = await failure(redfishOnly.readPowerState('node10'));
    expect(refused).toBeInstanceOf(BmcCredentialsError);
    expect(refused).toMatchObject({ protocol: 'ipmi' });
    // Neither: the error names the IPMI flags.
    const none = await failure(withDefaults({}).readPowerState('node10'));
    expect(none).toBeInstanceOf(BmcCredentialsError);
    expect(none.message).toBe('machine node10: no BMC user name: set bmc.username in the inventory or --ipmi-username');
    const noPassword = await failure(
      withDefaults({ defaultIpmiCredentials: { username: 'admin' } }).readPowerState('node10'),
    );
    expect(noPassword.message).toBe(
      'machine node10: no BMC password: set bmc.passwordFile (or bmc.password) in the inventory or --ipmi-password-file',
    );
  });

  test('commands in flight across the fleet stay within the bound', async () => {
    const slow = path.join(dir, 'slow-ipmitool');
    await writeFile(
      slow,
      `#!/bin/sh\necho "start $(date +%s%N)" >> ${dir}/spans\nipmitool "$@"; rc=$?\nsleep 0.2\necho "end $(date +%s%N)" >> ${dir}/spans\nexit $rc\n`,
      { mode: 0o755 },
    );
    const ipmi = new IpmiClient({ ipmitool: slow, concurrency: 2 });
    await Promise.all(Array.from({ length: 5 }, () => ipmi.powerState(target())));
    const events = (await readFile(path.join(dir, 'spans'), 'utf8'))
      .trim()
      .split('\n')
      .map((line) => line.split(' ') as ['start' | 'end', string])
      .sort((a, b) => Number(BigInt(a[1]) - BigInt(b[1])));
    let inFlight = 0;
    let most = 0;
    for (const [kind] of events) {
      inFlight += kind === 'start' ? 1 : -1;
      most = Math.max(most, inFlight);
    }
    expect(events).toHaveLength(10);
    expect(most).toBe(2);
  });
});

test('a missing ipmitool is one error naming the Debian package', async () => {
  const error = await new IpmiClient({ ipmitool: '/nonexistent/ipmitool' })
    .powerState({ machine: 'node07', host: '127.0.0.1', username: 'admin', password: new Secret('x') })
    .catch((e: unknown) => e);
  expect(error).toBeInstanceOf(IpmitoolMissingError);
  expect((error as Error).message).toBe(
    "/nonexistent/ipmitool not found: IPMI BMCs are driven through ipmitool; install Debian's ipmitool package (apt-get install ipmitool)",
  );
});

test('bad client options are named', () => {
  expect(() => new IpmiClient({ timeout: 0 })).toThrow('IpmiClient: timeout must be > 0 ms, got 0');
  expect(() => new IpmiClient({ concurrency: 0 })).toThrow(
    'IpmiClient: concurrency must be a whole number >= 1, got 0',
  );
  expect(() => new IpmiClient({ messageRetries: -1 })).toThrow('messageRetries must be a whole number >= 0');
});
