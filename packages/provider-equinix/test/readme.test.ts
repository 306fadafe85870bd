import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { SshKey } from '@bmaas/shepherd-manager';
import { expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { runReadmeExample } from '../../../test/support/readme.js';
import { eventually } from '../../../test/support/wait.js';
import { FakeEquinixApi } from '../src/testing/index.js';

const packageDir = fileURLToPath(new URL('..', import.meta.url));

test('the README example runs and does what it says', async () => {
  const db = await createTestDatabase();
  const logged = await runReadmeExample(packageDir, { env: { BMDB_URL: db.url } });
  expect(logged.filter((line) => /^created demo-[0-9a-f-]{18} on reservation [0-9a-f-]{36}$/.test(line))).toHaveLength(
    3,
  );
  const statuses = logged.filter((line) => line.includes(': Running at '));
  expect(statuses).toHaveLength(3);
  for (const line of statuses) expect(line).toMatch(/^[0-9a-f-]{36}: Running at 198\.\d+\.\d+\.\d+ in da11$/);
});

test('the README program runs the shepherd from SHEPHERD_* settings until SIGTERM, then stops cleanly', async () => {
  const readme = await readFile(path.join(packageDir, 'README.md'), 'utf8');
  const code = /### The same, as a program\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  expect(code).toContain("process.once('SIGTERM'");
  const db = await createTestDatabase();
  const api = await FakeEquinixApi.start({ reservations: 3 });
  const dir = await mkdtemp(path.join(tmpdir(), 'readme-program-'));
  // Inside the package, so its imports resolve as a user's would (the name matches .gitignore).
  const file = path.join(packageDir, `.readme-example-program-${process.pid}.ts`);
  const settings: Record<string, string> = {
    SHEPHERD_BMDB_URL: db.url,
    SHEPHERD_SSH_KEY_PATH: path.join(dir, 'ssh-key'),
    SHEPHERD_AGENT_EXECUTABLE_PATH: fileURLToPath(new URL('../../shepherd-manager/bin/test-agent.js', import.meta.url)),
    SHEPHERD_AGENT_ENDPOINT: 'bmaas.example.com:443',
    SHEPHERD_EQUINIX_API_URL: api.url,
    SHEPHERD_EQUINIX_API_KEY: api.apiKey,
    SHEPHERD_EQUINIX_PROJECT_ID: api.projectId,
    SHEPHERD_EQUINIX_DEVICE_PREFIX: 'readme-',
    SHEPHERD_EQUINIX_OS: 'ubuntu_22_04',
    SHEPHERD_EQUINIX_SSH_KEY_LABEL: 'readme-shepherd',
    SHEPHERD_PROVISIONER_MAX_MACHINES: '1',
  };
  const previous = Object.fromEntries(Object.keys(settings).map((name) => [name, process.env[name]]));
  Object.assign(process.env, settings);
  const signals = ['SIGINT', 'SIGTERM'] as const;
  const listenersBefore = new Map(signals.map((name) => [name, process.listeners(name)]));
  const logged: string[] = [];
  const originalLog = console.log;
  console.log = (...args: unknown[]) => {
    logged.push(args.map(String).join(' '));
  };
  let running: Promise<unknown> | undefined;
  try {
    await writeFile(file, code ?? '');
    let ended = false;
    running = import(file).finally(() => {
      ended = true;
    });
    // All four loops up (a session each), and the one device the limit allows created and recorded.
    const recorded = async () =>
      (await db.admin("SELECT provider_id FROM machine_provided WHERE provider = 'Equinix'")).rows.map(
        (row: { provider_id: string }) => row.provider_id,
      );
    const sessions = async (): Promise<number> => (await db.admin('SELECT count(*)::int AS n FROM sessions')).rows[0].n;
    await eventually(
      'the program getting going',
      async () => {
        if (api.devices.length >= 1 && (await recorded()).length >= 1 && (await sessions()) >= 4) return true;
        if (ended) await running; // it stopped on its own: show why
        return undefined;
      },
      30_000,
    );

    process.emit('SIGTERM', 'SIGTERM');
    await running;
    running = undefined;

    expect(logged[0]).toMatch(new RegExp(`^shepherd for Equinix project ${api.projectId} running, SSH key SHA256:`));
    expect(logged.at(-1)).toBe('shepherd stopped');
    expect(await sessions()).toBe(0);
    expect(new Set(await recorded())).toEqual(new Set(api.devices.map((device) => device.id)));
    for (const device of api.devices) expect(device.hostname).toMatch(/^readme-[0-9a-f-]{18}$/);
    // The key it generated is the one installed in the project under the label.
    const key = await SshKey.loadOrGenerate(settings.SHEPHERD_SSH_KEY_PATH ?? '');
    expect(api.sshKeys.map(({ label, key }) => ({ label, key }))).toEqual([
      { label: 'readme-shepherd', key: key.authorizedKey },
    ]);
  } finally {
    if (running) {
      process.emit('SIGTERM', 'SIGTERM');
      await running.catch(() => undefined);
    }
    console.log = originalLog;
    // The program's handler of the signal that never came would keep this worker from dying on it.
    for (const name of signals) {
      for (const listener of process.listeners(name)) {
        if (!listenersBefore.get(name)?.includes(listener)) process.off(name, listener);
      }
    }
    for (const [name, value] of Object.entries(previous)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    await rm(file, { force: true });
    await rm(dir, { recursive: true, force: true });
    await api.close();
  }
});
