import { mkdtemp, rm } from 'node:fs/promises';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { addProvided, decommissionMachines, newMachine, providedMachine, setAgentBootMethods } from '@bmaas/bmdb-model';
import { type ServerTls, selfSignedServerTls } from '@bmaas/server';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { HOSTILE_CAUSE, HOSTILE_REASON, type SeededFleet, seedFleet } from '../../../test/support/fleet.js';
import { escapeHtml, html } from '../src/html.js';
import {
  checkTlsRule,
  checkTokenRule,
  type FleetPageServer,
  isLoopback,
  serveFleetPage,
  WebTlsError,
  WebTokenError,
} from '../src/index.js';

let fleet: SeededFleet;
let open: FleetPageServer;
let guarded: FleetPageServer;
const TOKEN = 'correct-horse-battery-staple';

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  fleet = await seedFleet(db, bmdb);
  open = await serveFleetPage({ db: bmdb.db, host: '127.0.0.1', port: 0 });
  guarded = await serveFleetPage({ db: bmdb.db, host: '127.0.0.1', port: 0, token: TOKEN });
});
afterAll(async () => {
  await open?.close();
  await guarded?.close();
});

const get = (path: string, init: RequestInit = {}, server = open) =>
  fetch(new URL(path, server.url), { redirect: 'manual', ...init });
const page = async (path: string) => {
  const response = await get(path);
  expect(response.status, path).toBe(200);
  expect(response.headers.get('content-type')).toBe('text/html; charset=utf-8');
  return response.text();
};
// biome-ignore lint/suspicious/noExplicitAny: JSON of the API, checked field by field.
const json = async (path: string): Promise<any> => {
  const response = await get(path);
  expect(response.status, path).toBe(200);
  expect(response.headers.get('content-type')).toBe('application/json; charset=utf-8');
  return response.json();
};

/** A digest of every table the page reads: equal before and after means nothing was written. */
async function bmdbDigest(): Promise<string> {
  const tables = [
    'machines',
    'machine_provided',
    'machine_agent_started',
    'machine_agent_heartbeat',
    'work',
    'work_history',
    'work_backoff',
    'machine_hold',
    'machine_power_state',
    'operator_history',
    'machine_os_installation_request',
  ];
  const parts: string[] = [];
  for (const table of tables) {
    const { rows } = await db.admin(
      `SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) AS d FROM ${table} t`,
    );
    parts.push(`${table}:${rows[0].d}`);
  }
  return parts.join(' ');
}

describe('pages', () => {
  test('the overview shows stages with a chart, sessions, work, backoffs by cause and failures, the cause as text', async () => {
    const before = await bmdbDigest();
    const body = await page('/');
    expect(body).toContain('Fleet: 8 machines');
    expect(body).toMatch(/<svg role="img" aria-label="heartbeating: 1"/);
    expect(body).toContain('shepherd-initializer');
    expect(body).toContain('href="/machines?work=ShepherdAgentStart"');
    expect(body).toContain(`href="/machines/${fleet.backedOff}"`);
    expect(body).not.toContain('<script>');
    expect(body).toContain(
      '&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt; &amp; &quot;quotes&quot; &#39;too&#39;',
    );
    expect(body).toMatch(/<time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">\d+ min ago<\/time>/);
    expect(body).toContain('<meta http-equiv="refresh" content="10">');
    const headers = (await get('/')).headers;
    expect(headers.get('content-security-policy')).toContain("default-src 'none'");
    expect(headers.get('cache-control')).toBe('no-store');
    expect(await bmdbDigest()).toBe(before);
  });

  test('the machine page and its JSON say how its agent arrives', async () => {
    const provided = await providedMachine(bmdb.db, fleet.heartbeating);
    if (provided === undefined) throw new Error('the heartbeating machine has no Provided tag');
    await setAgentBootMethods(bmdb.db, provided.provider, new Map([[provided.providerId, 'virtual-media']]));
    try {
      expect(await page(`/machines/${fleet.heartbeating}`)).toContain(
        '<dt>agent boot</dt><dd>virtual-media: its BMC boots the agent from virtual media</dd>',
      );
      expect(await json(`/api/machines/${fleet.heartbeating}`)).toMatchObject({ agentBoot: 'virtual-media' });
      expect(await page(`/machines/${fleet.installed}`)).toContain(
        '<dt>agent boot</dt><dd>ssh: the shepherd takes its running OS over through SSH</dd>',
      );
      expect(await json(`/api/machines/${fleet.installed}`)).toMatchObject({ agentBoot: 'ssh' });
    } finally {
      await setAgentBootMethods(bmdb.db, provided.provider, new Map([[provided.providerId, 'ssh']]));
    }
  });

  test('the machine table filters by stage, provider, live work and backoff', async () => {
    const rows = (body: string) =>
      [...body.matchAll(/<a class="id" href="\/machines\/([0-9a-f-]{36})">/g)].map((m) => m[1]);
    expect(rows(await page('/machines')).sort()).toEqual(Object.values(fleet.all).sort());
    expect(rows(await page('/machines?stage=heartbeating'))).toEqual([fleet.heartbeating]);
    expect(rows(await page('/machines?stage=awaitingRecovery'))).toEqual([fleet.awaitingRecovery]);
    expect(rows(await page('/machines?provider=Equinix'))).toEqual([fleet.heartbeating]);
    expect(rows(await page('/machines?work=ShepherdAgentStart'))).toEqual([fleet.agentStarting]);
    const backoff = await page('/machines?backoff=any');
    expect(rows(backoff)).toEqual([fleet.backedOff]);
    expect(backoff).toContain('&lt;script&gt;');
    expect(backoff).not.toContain('<script>');
    expect(await page('/machines?provider=%3Cb%3Enobody')).toContain('No machine matches.');
  });

  test('the overview counts held machines and machines per power state, each linking to its machines', async () => {
    const body = await page('/');
    expect(body).toContain('<a href="/machines?held=yes">1 machine held</a>');
    expect(body).toMatch(/<a href="\/machines\?power=On">on<\/a><\/td><td class="num">1<\/td>/);
    expect(body).toMatch(/<a href="\/machines\?power=Off">off<\/a><\/td><td class="num">1<\/td>/);
    expect(body).toMatch(/<a href="\/machines\?power=PoweringOn">powering on<\/a><\/td><td class="num">1<\/td>/);
    expect(body).toMatch(/<a href="\/machines\?power=Unread">not read yet<\/a><\/td><td class="num">4<\/td>/);
    expect(body).toContain('1 machine: last power state read failed');
  });

  test('the overview lists retired machines: who retired them, when, why, whether wiped; its JSON too', async () => {
    expect(await page('/')).toContain('<p class="muted">No machine is retired.</p>');
    const machineId = await newMachine(bmdb.db);
    await addProvided(bmdb.db, machineId, { provider: 'Static', providerId: 'rack9-node1' });
    await decommissionMachines(bmdb.db, 'Static', ['rack9-node1'], { actor: 'tech@rack9', reason: HOSTILE_REASON });
    try {
      const body = await page('/');
      expect(body).toContain(
        '1 machine retired (decommissioned): the provisioner leaves it out while the provider lists it, until <code>shepherd recommission</code>',
      );
      expect(body).toContain(
        `<td>Static</td>\n<td>rack9-node1</td>\n<td class="id">${machineId.slice(0, 8)}</td>\n<td><time datetime=`,
      );
      expect(body).toContain(
        '<td>tech@rack9</td>\n<td>not wiped</td>\n<td class="cause">swap &lt;b&gt;PSU&lt;/b&gt; &amp; fans</td>',
      );
      expect(body).not.toContain(HOSTILE_REASON);
      const overview = await json('/api/overview');
      // Its page, asked for by the machine ID it had, is gone and says why.
      const gone = await get(`/machines/${machineId}`);
      expect(gone.status).toBe(404);
      expect(await gone.text()).toMatch(
        new RegExp(
          `machine ${machineId} is retired: Static rack9-node1, decommissioned \\S+ by tech@rack9: swap &lt;b&gt;PSU&lt;/b&gt; &amp; fans; shepherd recommission brings it back as a new machine`,
        ),
      );
      const goneJson = await get(`/api/machines/${machineId}`);
      expect(goneJson.status).toBe(404);
      expect(((await goneJson.json()) as { error: string }).error).toContain(
        `machine ${machineId} is retired: Static rack9-node1`,
      );
      expect(overview.retired).toBe(1);
      expect(overview.retiredMachines).toEqual([
        {
          provider: 'Static',
          providerId: 'rack9-node1',
          machineId,
          retiredAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
          actor: 'tech@rack9',
          reason: HOSTILE_REASON,
          wiped: false,
        },
      ]);
    } finally {
      await db.admin('DELETE FROM machine_retired');
    }
  });

  test('the machine table shows power and holds, and filters by them', async () => {
    const rows = (body: string) =>
      [...body.matchAll(/<a class="id" href="\/machines\/([0-9a-f-]{36})">/g)].map((m) => m[1]);
    const held = await page('/machines?held=yes');
    expect(rows(held)).toEqual([fleet.held]);
    expect(held).toContain('<span class="held" title="held by tech@rack3 since');
    expect(held).toContain('1 h · tech@rack3<div class="cause">swap &lt;b&gt;PSU&lt;/b&gt; &amp; fans</div>');
    expect(held).toContain('<option value="yes" selected>held</option>');
    expect(rows(await page('/machines?held=no')).sort()).toEqual(
      Object.values(fleet.all)
        .filter((id) => id !== fleet.held)
        .sort(),
    );
    const off = await page('/machines?power=Off');
    expect(rows(off)).toEqual([fleet.held]);
    expect(off).toMatch(/<span class="power power-Off" title="read (now|\d+ s ago), [^"]+ UTC">off<\/span>/);
    expect(rows(await page('/machines?power=On'))).toEqual([fleet.heartbeating]);
    expect(rows(await page('/machines?power=Unread')).sort()).toEqual(
      [fleet.provided, fleet.agentStarting, fleet.backedOff, fleet.installed].sort(),
    );
    expect(rows(await page('/machines?power=PoweringOn&held=no'))).toEqual([fleet.agentStarted]);
    expect(rows(await page('/machines?power=Off&held=no'))).toEqual([]);
    // The next page keeps the filters.
    const list = await json('/api/machines?power=Unread&limit=1');
    expect(list.nextUrl).toBe(`/api/machines?power=Unread&after=${list.next}`);
    expect(list.filter).toMatchObject({ powerState: 'Unread' });
  });

  test('installations: counted per state on the overview, a column and filter of the table, the request on the machine page', async () => {
    const rows = (body: string) =>
      [...body.matchAll(/<a class="id" href="\/machines\/([0-9a-f-]{36})">/g)].map((m) => m[1]);
    const overview = await page('/');
    expect(overview).toMatch(
      /<a href="\/machines\?installation=Succeeded"><span class="install install-Succeeded">installed<\/span><\/a><\/td><td class="num">1<\/td>/,
    );
    expect(overview).toMatch(
      /installation=Failed"><span class="install install-Failed">failed<\/span><\/a><\/td><td class="num">1</,
    );
    expect(overview).toMatch(/<svg role="img" aria-label="installed: 1"/);
    const failed = await page('/machines?installation=Failed');
    expect(rows(failed)).toEqual([fleet.installationFailed]);
    expect(failed).toContain(
      '<span class="install install-Failed" title="generation 1">failed</span> <span class="muted">gen 1</span>',
    );
    expect(failed).toContain('<option value="Failed" selected>failed</option>');
    expect(rows(await page('/machines?installation=Succeeded'))).toEqual([fleet.installed]);
    expect(rows(await page('/machines?stage=installed'))).toEqual([fleet.installed]);
    expect(rows(await page('/machines?installation=Delivered'))).toEqual([]);
    const machine = await page(`/machines/${fleet.installationFailed}`);
    expect(machine).toContain('http://images.example.com/broken.img (format by its first bytes) onto /dev/vda');
    expect(machine).toContain(`sha256 ${'cd'.repeat(32)}`);
    expect(machine).toMatch(/requested by alice@ops <time[^>]*>[^<]+<\/time>; delivered to its agent <time/);
    // The agent's error is shown as text, never run.
    expect(machine).toContain('<div class="cause">&lt;script&gt;alert(&quot;pwned&quot;)');
    expect(machine).not.toContain('<script>');
    const api = await json(`/api/machines/${fleet.installed}`);
    expect(api).toMatchObject({
      stage: 'installed',
      installation: { state: 'Succeeded', generation: 2 },
      osInstallation: {
        state: 'Succeeded',
        generation: 2,
        imageUrl: 'https://images.example.com/debian-12.img.gz',
        userDataBytes: 0,
      },
    });
    expect(api.osInstallation).not.toHaveProperty('userData');
    expect((await get('/machines?installation=Done')).status).toBe(400);
  });

  test('search finds by ID prefix; an exact machine or provider ID goes straight to its page', async () => {
    const exact = await get(`/machines?q=${fleet.unprovided}`);
    expect(exact.status).toBe(303);
    expect(exact.headers.get('location')).toBe(`/machines/${fleet.unprovided}`);
    const byProviderId = await get('/machines?q=dummy-silent');
    expect(byProviderId.headers.get('location')).toBe(`/machines/${fleet.awaitingRecovery}`);
    const prefix = await page('/machines?q=dummy-s');
    expect(prefix).toContain(fleet.agentStarting);
    expect(prefix).toContain(fleet.agentStarted);
    expect(prefix).not.toContain(fleet.heartbeating);
    expect(prefix).toContain('value="dummy-s"');
  });

  test('the table pages by keyset', async () => {
    const seen: string[] = [];
    let next: string | null = '/api/machines?limit=3';
    while (next !== null) {
      const body: { machines: { machineId: string }[]; nextUrl: string | null } = await json(next);
      seen.push(...body.machines.map((m) => m.machineId));
      next = body.nextUrl;
    }
    expect(seen).toEqual(Object.values(fleet.all).sort());
    const first = await page('/machines?provider=Dummy');
    expect(first).not.toContain('next page');
  });

  test('bad filters are refused naming the parameter', async () => {
    const stage = await get('/machines?stage=%3Cscript%3E');
    expect(stage.status).toBe(400);
    const body = await stage.text();
    expect(body).toContain('stage &quot;&lt;script&gt;&quot; is not a stage');
    const after = await get('/api/machines?after=zzz');
    expect(after.status).toBe(400);
    expect(await after.json()).toEqual({ error: 'after "zzz" is not a machine ID (a UUID)' });
    expect((await get('/api/machines?limit=0')).status).toBe(400);
    const held = await get('/api/machines?held=maybe');
    expect(held.status).toBe(400);
    expect(await held.json()).toEqual({ error: 'held "maybe": want yes or no' });
    const power = await get('/machines?power=%3Cb%3E');
    expect(power.status).toBe(400);
    expect(await power.text()).toContain(
      'power &quot;&lt;b&gt;&quot; is not a power state: want one of On, Off, PoweringOn, PoweringOff, Unknown, Unread',
    );
  });

  test('the machine page shows its hold, its power state and time read, and what operators did', async () => {
    const held = await page(`/machines/${fleet.held}`);
    expect(held).toMatch(
      /<dt>hold<\/dt><dd><span class="held">held<\/span> by tech@rack3 <time [^>]+>1 h ago<\/time> \(for 1 h\)/,
    );
    expect(held).toContain('<div class="cause">swap &lt;b&gt;PSU&lt;/b&gt; &amp; fans</div>');
    expect(held).not.toContain('<b>PSU</b>');
    expect(held).toMatch(/<dt>power<\/dt><dd><span class="power power-Off" [^>]+>off<\/span> read <time/);
    const actions = held.slice(held.indexOf('Operator actions'));
    expect(actions.indexOf('>PowerOff<')).toBeLessThan(actions.indexOf('>Hold<'));
    expect(actions).toContain('<span class="event ev-Succeeded">Succeeded</span> by tech@rack3');
    expect(actions).toContain('command ForceOff, graceful false');

    const failed = await page(`/machines/${fleet.backedOff}`);
    expect(failed).toMatch(/last read failed <time[^>]+>[^<]+<\/time>: BMC https:\/\/10\.1\.0\.9 unreachable/);
    expect(failed).toContain('not held');
    expect(failed).toContain('No operator has acted on it.');
    const never = await page(`/machines/${fleet.provided}`);
    expect(never).toMatch(/<span class="power power-Unread" title="never read">not read yet<\/span>/);
  });

  test('the machine page tells the machine’s story', async () => {
    const equinix = await page(`/machines/${fleet.heartbeating}`);
    expect(equinix).toContain('147.75.1.2');
    expect(equinix).toContain('da11');
    expect(equinix).toContain(
      'href="https://console.equinix.com/devices/e1a2b3c4-0000-4000-8000-000000000001/overview"',
    );
    expect(equinix).toMatch(/SHA256:[A-Za-z0-9+/]{43}/);
    expect(equinix).toContain('stage-heartbeating');
    expect(equinix).toContain('ssh: connection refused');
    expect(equinix.indexOf('Finished')).toBeLessThan(equinix.indexOf('connection refused'));

    const backedOff = await page(`/machines/${fleet.backedOff}`);
    expect(backedOff).toContain('>active</span>');
    expect(backedOff).toContain('>expired</span>');
    expect(backedOff).toContain('reboot failed: 503');
    expect(backedOff).not.toContain('<script>');
    expect(backedOff).toContain('&lt;script&gt;alert');
    expect(backedOff).not.toContain('console</a>');

    const starting = await page(`/machines/${fleet.agentStarting}`);
    expect(starting).toContain(fleet.session.id);
    expect(starting).toContain('test / shepherd-initializer');

    expect((await get('/machines/00000000-0000-4000-8000-000000000000')).status).toBe(404);
    const bad = await get('/machines/%3Cimg%20src%3Dx%3E');
    expect(bad.status).toBe(404);
    expect(await bad.text()).toContain('no machine &quot;&lt;img src=x&gt;&quot;');
  });
});

describe('JSON', () => {
  test('/api/overview', async () => {
    const body = await json('/api/overview');
    expect(body.machines).toBe(8);
    expect(body.stages).toEqual({
      unprovided: 1,
      provided: 2,
      agentStarting: 1,
      agentStarted: 1,
      heartbeating: 1,
      awaitingRecovery: 1,
      installed: 1,
    });
    expect(body.installations).toEqual({ Requested: 0, Delivered: 0, Succeeded: 1, Failed: 1, Canceled: 0 });
    expect(body.liveWork).toEqual({ ShepherdAgentStart: 1 });
    expect(body.sessions[0]).toMatchObject({ sessionId: fleet.session.id, processor: 'shepherd-initializer' });
    expect(body.backoffCauses[0]).toMatchObject({ cause: HOSTILE_CAUSE, machines: 1 });
    expect(body.recentFailures[0]).toMatchObject({ machineId: fleet.backedOff, cause: HOSTILE_CAUSE });
    expect(body.held).toBe(1);
    expect(body.powerStates).toEqual({ On: 1, Off: 1, PoweringOn: 1, PoweringOff: 0, Unknown: 0, Unread: 4 });
    expect(body.powerReadFailed).toBe(1);
  });

  test('/api/machines and /api/machines/<id>', async () => {
    const list = await json('/api/machines?stage=provided');
    expect(list.machines.map((m: { machineId: string }) => m.machineId).sort()).toEqual(
      [fleet.provided, fleet.backedOff].sort(),
    );
    expect(list.next).toBeNull();
    const machine = await json(`/api/machines/${fleet.heartbeating}`);
    expect(machine).toMatchObject({
      machineId: fleet.heartbeating,
      stage: 'heartbeating',
      provided: { provider: 'Equinix', providerIpAddress: '147.75.1.2' },
      consoleUrl: 'https://console.equinix.com/devices/e1a2b3c4-0000-4000-8000-000000000001/overview',
      historyTotal: 4,
    });
    expect(machine.agentKeyFingerprint).toMatch(/^SHA256:/);
    expect(machine).not.toHaveProperty('agentPublicKey');
    expect(machine).toMatchObject({ powerState: 'On', hold: null, power: { state: 'On', failedCause: null } });
    const held = await json(`/api/machines/${fleet.held}`);
    expect(held.hold).toMatchObject({ reason: HOSTILE_REASON, actor: 'tech@rack3' });
    expect(held.operatorHistory.map((a: { action: string }) => a.action)).toEqual(['PowerOff', 'Hold']);
    const listed = await json('/api/machines?held=yes');
    expect(listed.machines[0]).toMatchObject({
      machineId: fleet.held,
      powerState: 'Off',
      hold: { actor: 'tech@rack3' },
    });
    const missing = await get('/api/machines/00000000-0000-4000-8000-000000000000');
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { error: string }).error).toContain('no machine');
  });
});

describe('read-only', () => {
  test('anything but GET and HEAD is refused', async () => {
    expect((await get('/', { method: 'POST' })).status).toBe(405);
    expect((await get('/api/machines', { method: 'DELETE' })).status).toBe(405);
    const head = await get('/', { method: 'HEAD' });
    expect(head.status).toBe(200);
  });

  test('auto refresh is a toggle kept in a cookie, coming back only to this site', async () => {
    const off = await get('/refresh?set=off&back=%2Fmachines%3Fstage%3Dprovided');
    expect(off.status).toBe(303);
    expect(off.headers.get('location')).toBe('/machines?stage=provided');
    const cookie = off.headers.get('set-cookie') ?? '';
    expect(cookie).toMatch(/^shepherd_web_refresh=off;/);
    const quiet = await (await get('/', { headers: { cookie: 'shepherd_web_refresh=off' } })).text();
    expect(quiet).not.toContain('http-equiv="refresh"');
    expect(quiet).toContain('auto refresh off · turn on');
    expect((await get('/refresh?set=on&back=%2F%2Fevil.example')).headers.get('location')).toBe('/');
  });

  test('unknown paths are 404', async () => {
    expect((await get('/nothing')).status).toBe(404);
    expect((await get('/api/nothing')).status).toBe(404);
  });
});

describe('the token rule', () => {
  test('loopback may be open; anywhere else needs a token of 16 characters or more', async () => {
    expect(isLoopback('127.0.0.1')).toBe(true);
    expect(isLoopback('127.1.2.3')).toBe(true);
    expect(isLoopback('::1')).toBe(true);
    expect(isLoopback('[::1]')).toBe(true);
    expect(isLoopback('localhost')).toBe(true);
    expect(isLoopback('0.0.0.0')).toBe(false);
    expect(isLoopback('::')).toBe(false);
    expect(isLoopback('10.0.0.1')).toBe(false);
    expect(() => checkTokenRule('0.0.0.0', undefined)).toThrow(WebTokenError);
    expect(() => checkTokenRule('0.0.0.0', 'short')).toThrow(/at least 16 characters/);
    expect(() => checkTokenRule('0.0.0.0', TOKEN)).not.toThrow();
    await expect(serveFleetPage({ db: bmdb.db, host: '0.0.0.0', port: 0 })).rejects.toThrow(
      /beyond loopback, needs a token/,
    );
  });

  test('without the token: pages send to the login form, the API answers 401', async () => {
    const redirect = await get('/machines?stage=provided', {}, guarded);
    expect(redirect.status).toBe(303);
    expect(redirect.headers.get('location')).toBe('/login?next=%2Fmachines%3Fstage%3Dprovided');
    const api = await get('/api/overview', {}, guarded);
    expect(api.status).toBe(401);
    expect(api.headers.get('www-authenticate')).toMatch(/^Bearer/);
    const wrong = await get('/api/overview', { headers: { authorization: 'Bearer not-the-token-at-all' } }, guarded);
    expect(wrong.status).toBe(401);
    const login = await get('/login?next=%2Fmachines', {}, guarded);
    expect(login.status).toBe(200);
    expect(await login.text()).toContain('type="password" name="token"');
  });

  test('a bearer token admits API calls', async () => {
    const response = await get('/api/overview', { headers: { authorization: `Bearer ${TOKEN}` } }, guarded);
    expect(response.status).toBe(200);
  });

  test('the login form sets an HttpOnly, SameSite=Strict cookie that is not the token', async () => {
    const form = (token: string) =>
      get(
        '/login',
        {
          method: 'POST',
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
          body: new URLSearchParams({ token, next: '/machines' }).toString(),
        },
        guarded,
      );
    const oversized = await form('x'.repeat(10_000));
    expect(oversized.status).toBe(400);
    expect(await oversized.text()).toContain('a login form is at most 8192 bytes');
    const refused = await form('guess-guess-guess-guess');
    expect(refused.status).toBe(401);
    expect(refused.headers.get('set-cookie')).toBeNull();
    expect(await refused.text()).toContain('That is not the token.');

    const accepted = await form(TOKEN);
    expect(accepted.status).toBe(303);
    expect(accepted.headers.get('location')).toBe('/machines');
    const cookie = accepted.headers.get('set-cookie') ?? '';
    expect(cookie).toMatch(/^shepherd_web_session=[A-Za-z0-9_-]+; HttpOnly; SameSite=Strict; Path=\//);
    expect(cookie).not.toContain(TOKEN);
    const loginCookie = cookie.split(';')[0] as string;
    const machines = await get('/machines', { headers: { cookie: loginCookie } }, guarded);
    expect(machines.status).toBe(200);
    expect(await machines.text()).toContain('log out');
    expect((await get('/', { headers: { cookie: 'shepherd_web_session=forged' } }, guarded)).status).toBe(303);
    const logout = await get('/logout', { headers: { cookie: loginCookie } }, guarded);
    expect(logout.headers.get('set-cookie')).toContain('Max-Age=0');
  });
});

describe('TLS', () => {
  let dir: string;
  let tls: ServerTls;
  let secured: FleetPageServer;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'web-tls-'));
    // The server package's certificate maker, as `shepherd web --web-tls-self-signed` uses it.
    tls = await selfSignedServerTls(dir, { name: 'web' });
    secured = await serveFleetPage({ db: bmdb.db, host: '127.0.0.1', port: 0, token: TOKEN, tls });
  });
  afterAll(async () => {
    await secured?.close();
    await rm(dir, { recursive: true, force: true });
  });

  /** One request over TLS, the certificate verified against `ca` (the page's own: it is its own root). */
  const overTls = (
    url: string,
    init: { method?: string; headers?: Record<string, string>; body?: string } = {},
    ca = tls.cert,
  ) =>
    new Promise<{ status: number; headers: IncomingHttpHeaders; body: string }>((resolve, reject) => {
      const req = httpsRequest(url, { ca, method: init.method ?? 'GET', headers: init.headers ?? {} }, (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (chunk: string) => {
          body += chunk;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      });
      req.on('error', reject);
      req.end(init.body);
    });

  test('the TLS rule: plain HTTP on loopback, elsewhere TLS or a TLS proxy in front, not both', async () => {
    expect(() => checkTlsRule('127.0.0.1', { tls: false, insecureHttp: false })).not.toThrow();
    expect(() => checkTlsRule('0.0.0.0', { tls: false, insecureHttp: false })).toThrow(WebTlsError);
    expect(() => checkTlsRule('10.0.0.5', { tls: true, insecureHttp: false })).not.toThrow();
    expect(() => checkTlsRule('10.0.0.5', { tls: false, insecureHttp: true })).not.toThrow();
    expect(() => checkTlsRule('10.0.0.5', { tls: true, insecureHttp: true })).toThrow(/not both/);
    await expect(serveFleetPage({ db: bmdb.db, host: '0.0.0.0', port: 0, token: TOKEN })).rejects.toThrow(
      /on 0\.0\.0\.0, beyond loopback, needs TLS/,
    );
  });

  test('served over HTTPS: a verified TLS client is answered, with HSTS on every answer', async () => {
    expect(secured.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+\/$/);
    const api = await overTls(new URL('/api/overview', secured.url).href, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(api.status).toBe(200);
    expect(JSON.parse(api.body)).toHaveProperty('stages');
    expect(api.headers['strict-transport-security']).toBe('max-age=31536000');
    const redirect = await overTls(new URL('/machines', secured.url).href);
    expect(redirect.status).toBe(303);
    expect(redirect.headers['strict-transport-security']).toBe('max-age=31536000');
    // Another certificate is not this page's: the client refuses it.
    const other = await selfSignedServerTls(dir, { name: 'other' });
    await expect(overTls(secured.url, {}, other.cert)).rejects.toThrow(/self.signed|certificate/);
    // Plain HTTP to the TLS port gets no page.
    await expect(fetch(secured.url.replace('https:', 'http:'))).rejects.toThrow();
  });

  test('its login cookie and refresh cookie are Secure; over plain loopback HTTP they are not, nor is HSTS sent', async () => {
    const login = await overTls(new URL('/login', secured.url).href, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ token: TOKEN, next: '/' }).toString(),
    });
    expect(login.status).toBe(303);
    expect(login.headers['set-cookie']?.[0]).toMatch(
      /^shepherd_web_session=[A-Za-z0-9_-]+; HttpOnly; SameSite=Strict; Path=\/; Secure$/,
    );
    const loginCookie = login.headers['set-cookie']?.[0]?.split(';')[0] as string;
    const refresh = await overTls(new URL('/refresh?set=off&back=/', secured.url).href, {
      headers: { cookie: loginCookie },
    });
    expect(refresh.headers['set-cookie']?.[0]).toMatch(/; Secure$/);
    const logout = await overTls(new URL('/logout', secured.url).href, { headers: { cookie: loginCookie } });
    expect(logout.headers['set-cookie']?.[0]).toMatch(/Max-Age=0; Secure$/);

    const plain = await get(
      '/login',
      {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ token: TOKEN, next: '/' }).toString(),
      },
      guarded,
    );
    expect(plain.headers.get('set-cookie')).not.toContain('Secure');
    expect(plain.headers.get('strict-transport-security')).toBeNull();
  });

  test('behind a TLS proxy (insecureHttp) it speaks plain HTTP beyond loopback, still Secure and with HSTS', async () => {
    const proxied = await serveFleetPage({ db: bmdb.db, host: '0.0.0.0', port: 0, token: TOKEN, insecureHttp: true });
    try {
      expect(proxied.url).toMatch(/^http:\/\//);
      const login = await fetch(`http://127.0.0.1:${proxied.port}/login`, {
        method: 'POST',
        redirect: 'manual',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ token: TOKEN, next: '/' }).toString(),
      });
      expect(login.status).toBe(303);
      expect(login.headers.get('set-cookie')).toMatch(/; Secure$/);
      expect(login.headers.get('strict-transport-security')).toBe('max-age=31536000');
    } finally {
      await proxied.close();
    }
    await expect(
      serveFleetPage({ db: bmdb.db, host: '0.0.0.0', port: 0, token: TOKEN, insecureHttp: true, tls }),
    ).rejects.toThrow(/not both/);
  });
});

test('html escapes every value it is given, and only once', () => {
  const cause = '<script>x</script>';
  expect(html`<td title="${cause}">${cause}</td>`.value).toBe(
    '<td title="&lt;script&gt;x&lt;/script&gt;">&lt;script&gt;x&lt;/script&gt;</td>',
  );
  expect(html`<p>${html`<b>${'&'}</b>`}${[1, '<', null, undefined, false]}</p>`.value).toBe('<p><b>&amp;</b>1&lt;</p>');
  expect(escapeHtml(`"'`).value).toBe('&quot;&#39;');
});

describe('bad input', () => {
  let counted: FleetPageServer;
  const failures: string[] = [];
  beforeAll(async () => {
    counted = await serveFleetPage({
      db: bmdb.db,
      host: '127.0.0.1',
      port: 0,
      onError: (_, path) => failures.push(path),
    });
  });
  afterAll(() => counted?.close());
  beforeEach(() => {
    failures.length = 0;
  });

  /** One request with `target` exactly as the request line's target (fetch would normalise `//`). */
  const raw = (target: string) =>
    new Promise<{ status: number; type: string | undefined; body: string }>((resolve, reject) => {
      const req = httpRequest({ host: '127.0.0.1', port: counted.port, path: target }, (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (chunk: string) => {
          body += chunk;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, type: res.headers['content-type'], body }));
      });
      req.on('error', reject);
      req.end();
    });

  test('a machine path that is not valid percent-encoding is a 400 naming it, not a database failure', async () => {
    const page = await raw('/machines/%E0%A4%A');
    expect(page.status).toBe(400);
    expect(page.type).toBe('text/html; charset=utf-8');
    expect(page.body).toContain('machine ID &quot;%E0%A4%A&quot; is not valid percent-encoding');
    const api = await raw('/api/machines/%E0%A4%A');
    expect(api.status).toBe(400);
    expect(JSON.parse(api.body)).toEqual({ error: 'machine ID "%E0%A4%A" is not valid percent-encoding' });
    // UTF-8 that encodes a surrogate half, and a lone `%`.
    expect((await raw('/machines/%ED%A0%80')).status).toBe(400);
    expect((await raw('/api/machines/%')).status).toBe(400);
    expect(failures).toEqual([]);
  });

  test('two leading slashes are a path, not a host; a target that is no URL is a 400 naming it', async () => {
    // Read as a URL with a host, `//` is no URL and `//x/machines` is `/machines` of host x.
    const empty = await raw('//');
    expect(empty.status).toBe(404);
    expect(empty.body).toContain('nothing at &quot;//&quot;');
    const doubled = await raw('//x/machines');
    expect(doubled.status).toBe(404);
    expect(doubled.body).toContain('nothing at &quot;//x/machines&quot;');
    // The absolute form (as to a proxy) is read as the URL it is, and refused when it is none.
    expect((await raw(`http://127.0.0.1:${counted.port}/api/overview`)).status).toBe(200);
    const noUrl = await raw('http://[/');
    expect(noUrl.status).toBe(400);
    expect(noUrl.body).toContain('the request target &quot;http://[/&quot; is not a URL');
    expect(failures).toEqual([]);
  });

  test('a filter with a control character or longer than 200 characters is a 400 naming the parameter', async () => {
    for (const name of ['provider', 'work', 'backoff', 'q']) {
      const nul = await raw(`/api/machines?${name}=a%00b`);
      expect(nul.status, name).toBe(400);
      expect(JSON.parse(nul.body), name).toEqual({ error: `${name} "a\\u0000b" holds a control character` });
      const long = await raw(`/api/machines?${name}=${'x'.repeat(201)}`);
      expect(long.status, name).toBe(400);
      expect(JSON.parse(long.body), name).toEqual({ error: `${name} is at most 200 characters` });
    }
    // The page's search, which looks for an exact ID first, refuses it too.
    const search = await raw('/machines?q=%00');
    expect(search.status).toBe(400);
    expect(search.body).toContain('q &quot;\\u0000&quot; holds a control character');
    // 200 characters are a filter like any other.
    expect((await raw(`/api/machines?provider=${'x'.repeat(200)}`)).status).toBe(200);
    expect(failures).toEqual([]);
  });

  test('IDs that are no machine ID, however long, and bytes that are no UTF-8 in a filter, are no database failure', async () => {
    const notUuid = await raw('/api/machines/not-a-machine');
    expect(notUuid.status).toBe(404);
    expect(JSON.parse(notUuid.body)).toEqual({ error: 'no machine "not-a-machine" in the BMDB' });
    expect((await raw(`/machines/${'a'.repeat(4000)}`)).status).toBe(404);
    expect((await raw('/api/machines?provider=%E0%A4%A')).status).toBe(200);
    expect((await raw('/api/machines?after=%E0%A4%A')).status).toBe(400);
    expect((await raw('/api/machines?limit=99999999999999999999')).status).toBe(400);
    // Past Node's header limit (16 KiB), Node itself refuses it.
    expect((await raw(`/machines?q=${'x'.repeat(20_000)}`)).status).toBe(431);
    expect(failures).toEqual([]);
  });
});

test('a BMDB without the schema the page reads answers 503 saying to migrate', async () => {
  const bare = await createTestDatabase();
  const unmigrated = await openTestBMDB(bare, { migrate: false });
  const errors: string[] = [];
  const server = await serveFleetPage({
    db: unmigrated.db,
    host: '127.0.0.1',
    port: 0,
    onError: (_, path) => errors.push(path),
  });
  try {
    const response = await fetch(new URL('/api/overview', server.url));
    expect(response.status).toBe(503);
    expect(((await response.json()) as { error: string }).error).toMatch(/does not exist.*run `shepherd migrate`/);
    const page = await fetch(new URL('/', server.url));
    expect(page.status).toBe(503);
    expect(await page.text()).toContain('run `shepherd migrate`');
    expect(errors).toEqual(['/api/overview', '/']);
  } finally {
    await server.close();
  }
});
