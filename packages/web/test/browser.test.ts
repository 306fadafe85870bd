import { createHash, X509Certificate } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { AgentHeartbeats } from '@bmaas/bmdb-model';
import { AgentHardwareReportSchema, selfSignedServerTls } from '@bmaas/server';
import { create, toBinary } from '@bufbuild/protobuf';
import puppeteer, { type Browser, type Page } from 'puppeteer-core';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { HOSTILE_CAUSE, HOSTILE_REASON, type SeededFleet, seedFleet } from '../../../test/support/fleet.js';
import { type FleetPageServer, serveFleetPage } from '../src/index.js';

/** Debian's chromium package; the tests drive it, they never download a browser. */
const CHROMIUM = '/usr/bin/chromium';
const hasChromium = existsSync(CHROMIUM);
if (!hasChromium) {
  console.warn(`browser tests skipped: ${CHROMIUM} is missing (install it with: apt-get install -y chromium)`);
}

/** Screenshots of each page, kept as test artifacts (gitignored). */
const SCREENSHOTS = fileURLToPath(new URL('../../../.tmp/screenshots/', import.meta.url));
const TOKEN = 'browser-test-token-0123456789';

describe.skipIf(!hasChromium)(`in a real browser (${CHROMIUM}, headless)`, () => {
  let bmdb: BMDB;
  let fleet: SeededFleet;
  let open: FleetPageServer;
  let guarded: FleetPageServer;
  let secured: FleetPageServer;
  let browser: Browser;
  let profile: string;
  let page: Page;
  /** Dialogs the page opened: a script from a failure cause would open one. */
  const dialogs: string[] = [];

  beforeAll(async () => {
    const file = await testBMDB();
    bmdb = file.bmdb;
    fleet = await seedFleet(file.db, bmdb);
    open = await serveFleetPage({ db: bmdb.db, host: '127.0.0.1', port: 0 });
    guarded = await serveFleetPage({ db: bmdb.db, host: '127.0.0.1', port: 0, token: TOKEN });
    await mkdir(SCREENSHOTS, { recursive: true });
    profile = await mkdtemp(path.join(tmpdir(), 'shepherd-web-chromium-'));
    // The page over HTTPS with a self-signed certificate made as `shepherd web --web-tls-self-signed` does;
    // the browser trusts that one key (by its SPKI digest), nothing else.
    const tls = await selfSignedServerTls(profile, { name: 'web' });
    secured = await serveFleetPage({ db: bmdb.db, host: '127.0.0.1', port: 0, token: TOKEN, tls });
    const spki = new X509Certificate(tls.cert).publicKey.export({ type: 'spki', format: 'der' });
    browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      headless: true,
      userDataDir: profile,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        `--ignore-certificate-errors-spki-list=${createHash('sha256').update(spki).digest('base64')}`,
      ],
    });
    page = await browser.newPage();
    page.on('dialog', (dialog) => {
      dialogs.push(dialog.message());
      void dialog.dismiss();
    });
    await page.setViewport({ width: 1280, height: 900 });
  });

  afterAll(async () => {
    await browser?.close();
    await open?.close();
    await guarded?.close();
    await secured?.close();
    if (profile) await rm(profile, { recursive: true, force: true });
  });

  const shot = (name: string) => page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true });
  const text = (selector: string) => page.$eval(selector, (el) => el.textContent ?? '');

  test('loads the overview, the hostile cause shown as text and never run', async () => {
    await page.goto(open.url);
    expect(await text('h1')).toBe('Fleet: 8 machines');
    const bars = await page.$$eval('table.chart rect.fill', (rects) => rects.map((r) => r.getAttribute('width')));
    expect(bars).toContain('100.0%');
    const causes = await page.$$eval('td.cause', (cells) => cells.map((c) => c.textContent));
    expect(causes).toContain(HOSTILE_CAUSE);
    expect(dialogs).toEqual([]);
    expect(await page.$('head meta[http-equiv="refresh"]')).not.toBeNull();
    await shot('overview');
  });

  test('follows a machine link to the machine page', async () => {
    await page.goto(open.url);
    await Promise.all([page.waitForNavigation(), page.click(`a[href="/machines/${fleet.backedOff}"]`)]);
    expect(new URL(page.url()).pathname).toBe(`/machines/${fleet.backedOff}`);
    expect(await text('h1')).toBe(fleet.backedOff);
    expect(await text('.timeline .cause')).toBe(HOSTILE_CAUSE);
    const title = await page.$eval('time', (el) => el.getAttribute('title'));
    expect(title).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/);
    expect(dialogs).toEqual([]);
    await shot('machine');
  });

  test('filters the machine table by stage', async () => {
    await page.goto(new URL('/machines', open.url).href);
    await shot('machines');
    await page.select('select[name="stage"]', 'heartbeating');
    await Promise.all([page.waitForNavigation(), page.click('form.filters button[type="submit"]')]);
    expect(new URL(page.url()).searchParams.get('stage')).toBe('heartbeating');
    const ids = await page.$$eval('tbody a.id', (links) => links.map((a) => a.textContent));
    expect(ids).toEqual([fleet.heartbeating]);
    await shot('machines-heartbeating');
  });

  test('filters the machine table by held and by power state; shows the hold and the power columns', async () => {
    await page.goto(new URL('/machines', open.url).href);
    const headers = await page.$$eval('thead th', (cells) => cells.map((c) => c.textContent));
    expect(headers).toEqual(expect.arrayContaining(['power', 'hold']));
    await page.select('select[name="held"]', 'yes');
    await Promise.all([page.waitForNavigation(), page.click('form.filters button[type="submit"]')]);
    expect(new URL(page.url()).searchParams.get('held')).toBe('yes');
    expect(await page.$$eval('tbody a.id', (links) => links.map((a) => a.textContent))).toEqual([fleet.held]);
    expect(await text('tbody .cause')).toBe(HOSTILE_REASON);
    expect(await text('tbody .power')).toBe('off');
    await shot('machines-held');

    await page.select('select[name="held"]', '');
    await page.select('select[name="power"]', 'PoweringOn');
    await Promise.all([page.waitForNavigation(), page.click('form.filters button[type="submit"]')]);
    expect(new URL(page.url()).searchParams.get('power')).toBe('PoweringOn');
    expect(await page.$$eval('tbody a.id', (links) => links.map((a) => a.textContent))).toEqual([fleet.agentStarted]);
    expect(dialogs).toEqual([]);
  });

  test('the machine page shows the hold, the power state read and the operator actions', async () => {
    await page.goto(open.url);
    await Promise.all([page.waitForNavigation(), page.click('a[href="/machines?held=yes"]')]);
    await Promise.all([page.waitForNavigation(), page.click(`tbody a[href="/machines/${fleet.held}"]`)]);
    expect(await text('dl.tags .held')).toBe('held');
    expect(await text('dl.tags .power')).toBe('off');
    const actions = await page.$$eval('ol.operator li .event:first-child', (events) =>
      events.map((e) => e.textContent),
    );
    expect(actions).toEqual(['PowerOff', 'Hold']);
    expect(await page.$$eval('ol.operator .reason', (r) => r.map((e) => e.textContent))).toEqual([
      HOSTILE_REASON,
      HOSTILE_REASON,
    ]);
    expect(dialogs).toEqual([]);
    await shot('machine-held');
  });

  test('searches by provider ID: an exact one opens its machine', async () => {
    await page.goto(open.url);
    await page.type('header input[name="q"]', 'dummy-silent');
    await Promise.all([page.waitForNavigation(), page.keyboard.press('Enter')]);
    expect(new URL(page.url()).pathname).toBe(`/machines/${fleet.awaitingRecovery}`);
    expect(await page.$('.stage-awaitingRecovery')).not.toBeNull();
    await page.goto(new URL('/machines?q=dummy-s', open.url).href);
    expect((await page.$$('tbody tr')).length).toBe(3);
  });

  test('turns auto refresh off and on', async () => {
    await page.goto(new URL('/machines', open.url).href);
    await Promise.all([page.waitForNavigation(), page.click('a.refresh')]);
    expect(new URL(page.url()).pathname).toBe('/machines');
    expect(await page.$('head meta[http-equiv="refresh"]')).toBeNull();
    await Promise.all([page.waitForNavigation(), page.click('a.refresh')]);
    expect(await page.$('head meta[http-equiv="refresh"]')).not.toBeNull();
  });

  test('reads on a phone without sideways scrolling of the page', async () => {
    const phone = await browser.newPage();
    try {
      await phone.setViewport({ width: 390, height: 844, isMobile: true, deviceScaleFactor: 1 });
      for (const [name, route] of [
        ['phone-overview', '/'],
        ['phone-machine', `/machines/${fleet.heartbeating}`],
      ] as const) {
        await phone.goto(new URL(route, open.url).href);
        const overflow = (await phone.evaluate('document.documentElement.scrollWidth - window.innerWidth')) as number;
        expect(overflow, route).toBeLessThanOrEqual(0);
        await phone.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true });
      }
    } finally {
      await phone.close();
    }
  });

  test('behind a token: the login form, once, then the pages', async () => {
    const context = await browser.createBrowserContext();
    const guest = await context.newPage();
    try {
      await guest.goto(new URL('/machines?stage=provided', guarded.url).href);
      expect(new URL(guest.url()).pathname).toBe('/login');
      await guest.screenshot({ path: path.join(SCREENSHOTS, 'login.png') });
      await guest.type('input[name="token"]', TOKEN);
      await Promise.all([guest.waitForNavigation(), guest.click('form button[type="submit"]')]);
      expect(new URL(guest.url()).pathname + new URL(guest.url()).search).toBe('/machines?stage=provided');
      expect(await guest.$$eval('tbody tr', (rows) => rows.length)).toBe(2);
      // The cookie is HttpOnly: scripts on the page cannot read it.
      expect(await guest.evaluate('document.cookie')).not.toContain('shepherd_web_session');
      await guest.goto(guarded.url);
      expect(new URL(guest.url()).pathname).toBe('/');
    } finally {
      await context.close();
    }
  });

  test('over HTTPS: the login form, once, a Secure cookie, and HSTS', async () => {
    const context = await browser.createBrowserContext();
    const guest = await context.newPage();
    try {
      const first = await guest.goto(new URL('/machines', secured.url).href);
      expect(new URL(guest.url()).protocol).toBe('https:');
      expect(new URL(guest.url()).pathname).toBe('/login');
      expect(first?.headers()['strict-transport-security']).toBe('max-age=31536000');
      await guest.type('input[name="token"]', TOKEN);
      await Promise.all([guest.waitForNavigation(), guest.click('form button[type="submit"]')]);
      expect(new URL(guest.url()).pathname).toBe('/machines');
      expect(await guest.$$eval('tbody tr', (rows) => rows.length)).toBe(8);
      const [cookie] = (await guest.cookies()).filter((c) => c.name === 'shepherd_web_session');
      expect(cookie).toMatchObject({ secure: true, httpOnly: true, sameSite: 'Strict' });
      await guest.screenshot({ path: path.join(SCREENSHOTS, 'machines-https.png') });
    } finally {
      await context.close();
    }
  });
  test('the machine page shows its hardware report: system, boot, memory, CPUs, each disk and NIC; the same in its JSON', async () => {
    // As the server stores an agent's report: its heartbeat, with the key the seeded machine's agent started with.
    const report = create(AgentHardwareReportSchema, {
      report: {
        manufacturer: 'Dell Inc.',
        product: 'PowerEdge R640',
        serialNumber: '7XQ2K93',
        efiSupport: 4, // EFI_SUPPORT_ENABLED
        memoryInstalledBytes: 192n * 2n ** 30n,
        memoryUsableRatio: 0.975,
        cpu: [
          { vendor: 'GenuineIntel', model: 'Xeon Gold 6130', cores: 16, hardwareThreads: 32 },
          { vendor: 'GenuineIntel', model: 'Xeon Gold 6130', cores: 16, hardwareThreads: 32 },
        ],
        blockDevice: [
          {
            deviceModel: 'SAMSUNG MZQLB960HAJR',
            serialNumber: 'S437NA0M512345',
            wwn: Buffer.from('0025385b71b0fa2e', 'hex'),
            capacityBytes: 960_197_124_096n,
            logicalBlockSizeBytes: 512,
            physicalBlockSizeBytes: 512,
            protocol: 3, // NVMe
            criticalWarning: true,
          },
          {
            vendor: 'SEAGATE',
            deviceModel: HOSTILE_CAUSE,
            serialNumber: 'ZC20ABCD',
            capacityBytes: 2_000_398_934_016n,
            logicalBlockSizeBytes: 512,
            physicalBlockSizeBytes: 4096,
            protocol: 1, // SCSI
            rotational: true,
          },
        ],
        networkInterface: [
          {
            mac: Buffer.from('b026281a2b3c', 'hex'),
            driver: 'bnxt_en',
            linkUp: true,
            currentSpeedBytes: 3_125_000_000n,
          },
          { mac: Buffer.from('b026281a2b3f', 'hex'), driver: 'igb', linkUp: false },
        ],
      },
      warning: ['no EFI variables'],
    });
    const recorded = await AgentHeartbeats.of(bmdb).record({
      machineId: fleet.heartbeating,
      publicKey: new Uint8Array(32).fill(7),
      hardwareReport: toBinary(AgentHardwareReportSchema, report),
    });
    expect(recorded).toBe('recorded');
    await page.goto(new URL(`/machines/${fleet.heartbeating}`, open.url).href);
    const dd = (term: string) =>
      page.$$eval(
        'section.hardware dl.tags dt',
        (terms, wanted) => terms.find((t) => t.textContent === wanted)?.nextElementSibling?.textContent ?? null,
        term,
      );
    expect(await dd('system')).toBe('Dell Inc. PowerEdge R640');
    expect(await dd('serial')).toBe('7XQ2K93');
    expect(await dd('boot')).toBe('EFI (EFI support enabled)');
    expect(await dd('memory')).toBe('192 GiB installed, 187 GiB usable');
    expect(await dd('CPU')).toBe('2 × Xeon Gold 6130: 32 cores, 64 threads GenuineIntel');
    const rows = (selector: string) =>
      page.$$eval(selector, (trs) =>
        trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent?.replace(/\s+/g, ' ').trim())),
      );
    expect(await rows('section.hardware table.disks tbody tr')).toEqual([
      [
        'SAMSUNG MZQLB960HAJR',
        'S437NA0M512345',
        '0x0025385b71b0fa2e',
        '894 GiB (512/512 B blocks)',
        'NVMe',
        'no',
        'critical warning',
      ],
      [`SEAGATE ${HOSTILE_CAUSE}`, 'ZC20ABCD', '–', '1.82 TiB (512/4096 B blocks)', 'SCSI', 'yes', 'OK'],
    ]);
    expect(await rows('section.hardware table.nics tbody tr')).toEqual([
      ['b0:26:28:1a:2b:3c', 'bnxt_en', '25 Gb/s', 'up'],
      ['b0:26:28:1a:2b:3f', 'igb', '–', 'down'],
    ]);
    expect(await page.$$eval('section.hardware .warnings li', (li) => li.map((l) => l.textContent))).toEqual([
      'no EFI variables',
    ]);
    expect(dialogs).toEqual([]);
    await shot('machine-hardware');

    const json = (await (await fetch(new URL(`/api/machines/${fleet.heartbeating}`, open.url))).json()) as {
      hardware: { report: unknown; reportedAt: unknown };
    };
    expect(json.hardware.report).toMatchObject({
      system: { manufacturer: 'Dell Inc.', product: 'PowerEdge R640', serialNumber: '7XQ2K93' },
      boot: 'EFI',
      memory: { installedBytes: 192 * 2 ** 30 },
      cpus: [
        { cores: 16, threads: 32 },
        { cores: 16, threads: 32 },
      ],
      disks: [
        {
          serialNumber: 'S437NA0M512345',
          wwn: '0x0025385b71b0fa2e',
          sizeBytes: 960_197_124_096,
          protocol: 'NVMe',
          rotational: false,
          health: { criticalWarning: true },
        },
        { model: HOSTILE_CAUSE, serialNumber: 'ZC20ABCD', wwn: '', protocol: 'SCSI', rotational: true },
      ],
      nics: [
        { mac: 'b0:26:28:1a:2b:3c', driver: 'bnxt_en', linkUp: true, speedBytesPerSecond: 3_125_000_000 },
        { mac: 'b0:26:28:1a:2b:3f', driver: 'igb', linkUp: false, speedBytesPerSecond: 0 },
      ],
    });
    expect(json.hardware.reportedAt).toEqual(expect.any(String));
  });

  test('the machine page shows its agent’s log as text, never run, with when it came; the same in its JSON', async () => {
    const log = `bmaas-init: starting the agent\n${HOSTILE_CAUSE}\n</pre><img src=x onerror="alert(1)">\n`;
    // As the server stores it: a heartbeat with the key the seeded machine's agent started with.
    expect(
      await AgentHeartbeats.of(bmdb).record({
        machineId: fleet.heartbeating,
        publicKey: new Uint8Array(32).fill(7),
        agentLog: log,
      }),
    ).toBe('recorded');
    await page.goto(new URL(`/machines/${fleet.heartbeating}`, open.url).href);
    expect(await text('pre.agent-log')).toBe(log);
    expect(await page.$('pre.agent-log img, pre.agent-log script')).toBeNull();
    expect(await page.$eval('pre.agent-log', (pre) => pre.previousElementSibling?.querySelector('time') !== null)).toBe(
      true,
    );
    expect(dialogs).toEqual([]);
    await shot('machine-agent-log');

    const json = (await (await fetch(new URL(`/api/machines/${fleet.heartbeating}`, open.url))).json()) as {
      agentLog: { text: string; receivedAt: string };
    };
    expect(json.agentLog.text).toBe(log);
    expect(Number.isNaN(Date.parse(json.agentLog.receivedAt))).toBe(false);
  });

  test('a machine whose agent sent no log says so', async () => {
    await page.goto(new URL(`/machines/${fleet.held}`, open.url).href);
    expect(await page.$('pre.agent-log')).toBeNull();
    expect(await page.content()).toContain('No agent log: its agent has sent none.');
  });
});
