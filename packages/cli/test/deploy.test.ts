/**
 * What an operator plugs in, in deploy/: the Prometheus alert rules and their
 * unit tests (promtool), the Grafana dashboard, the systemd units
 * (systemd-analyze). Every metric a rule or a panel names is checked against
 * the metrics the processes themselves serve, not against a list kept here.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import yaml from 'js-yaml';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { buildOnce, eventually, type Shepherd, shepherd, start } from './helpers.js';
import { metricNames } from './promql.js';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const deploy = path.join(root, 'deploy');
const RULES = path.join(deploy, 'prometheus', 'shepherd-rules.yml');
const RULE_TESTS = path.join(deploy, 'prometheus', 'shepherd-rules.test.yml');
const DASHBOARD = path.join(deploy, 'grafana', 'shepherd.json');
const UNITS = path.join(deploy, 'systemd');
const BIN = path.join(root, 'packages', 'cli', 'bin', 'shepherd.js');

/** Debian's prometheus package; CI installs it (.ci/run). */
const PROMTOOL = '/usr/bin/promtool';
const SYSTEMD_ANALYZE = '/usr/bin/systemd-analyze';
const hasPromtool = existsSync(PROMTOOL);
const hasSystemdAnalyze = existsSync(SYSTEMD_ANALYZE);
if (!hasPromtool) {
  console.warn(`alert rule tests skipped: ${PROMTOOL} is missing (install it with: apt-get install -y prometheus)`);
}
if (!hasSystemdAnalyze) console.warn(`systemd unit checks skipped: ${SYSTEMD_ANALYZE} is missing (Debian: systemd)`);

interface RuleFile {
  groups: { name: string; rules: { alert?: string; record?: string; expr: string }[] }[];
}
interface RuleTests {
  rule_files: string[];
  tests: { alert_rule_test?: { alertname: string; exp_alerts: unknown[] }[] }[];
}
interface Panel {
  type: string;
  title: string;
  id: number;
  datasource?: { type: string; uid: string };
  targets?: { expr: string; refId: string }[];
  panels?: Panel[];
}
interface Dashboard {
  uid: string;
  panels: Panel[];
  templating: { list: { name: string; type: string; query: string | { query: string } }[] };
}

const rules = async () => yaml.load(await readFile(RULES, 'utf8')) as RuleFile;
const alerts = async () => (await rules()).groups.flatMap((group) => group.rules.filter((rule) => rule.alert));
const dashboard = async () => JSON.parse(await readFile(DASHBOARD, 'utf8')) as Dashboard;
const panels = (list: Panel[]): Panel[] => list.flatMap((panel) => [panel, ...panels(panel.panels ?? [])]);

/** Every PromQL query of the dashboard: panels' targets and template variables'. */
async function dashboardQueries(): Promise<string[]> {
  const board = await dashboard();
  const targets = panels(board.panels).flatMap((panel) => (panel.targets ?? []).map((target) => target.expr));
  const variables = board.templating.list
    .filter((variable) => variable.type === 'query')
    .map((variable) => (typeof variable.query === 'string' ? variable.query : variable.query.query));
  return [...targets, ...variables];
}

describe('PromQL names', () => {
  test('the reader of metric names finds metrics, not functions, labels, keywords or variables', () => {
    expect(
      metricNames(
        'sum by (instance) (rate(a_total{code!="ok", x=~"$v"}[$__rate_interval])) > 0.5 * on () group_left (z) b or absent(c == 1) unless d offset 5m',
      ),
    ).toEqual(new Set(['a_total', 'b', 'c', 'd']));
    expect(metricNames('histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m]))) > 1e3')).toEqual(
      new Set(['h_bucket']),
    );
    expect(metricNames('label_values(m{provider=~"$provider"}, location)')).toEqual(new Set(['m']));
    expect(metricNames('max without (instance, job) (g{stage="awaitingRecovery"}) / ignoring (x) bool k')).toEqual(
      new Set(['g', 'k']),
    );
  });
});

describe('the metrics the rules and the dashboard name', () => {
  let db: TestDatabase;
  let dir: string;
  const running: Shepherd[] = [];
  /** The families each process serves (# TYPE lines), histograms' series included, by process. */
  const served = new Map<string, Set<string>>();
  const bodies = new Map<string, string>();

  beforeAll(async () => {
    await buildOnce();
    db = await createTestDatabase();
    dir = await mkdtemp(path.join(tmpdir(), 'shepherd-deploy-'));
    expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
    const ports = { run: await freePort(), server: await freePort(), web: await freePort() };
    const common = ['--bmdb-url', db.url, '--fleet-metrics-interval', '1s'];
    const processes: Record<string, string[]> = {
      run: ['run', 'dummy', ...common, '--dummy-capacity', '3', '--metrics-listen', `127.0.0.1:${ports.run}`],
      server: [
        'server',
        ...common,
        '--data-dir',
        path.join(dir, 'server'),
        '--listen',
        `127.0.0.1:${await freePort()}`,
        '--metrics-listen',
        `127.0.0.1:${ports.server}`,
      ],
      web: [
        'web',
        ...common,
        '--web-listen',
        `127.0.0.1:${await freePort()}`,
        '--metrics-listen',
        `127.0.0.1:${ports.web}`,
      ],
    };
    for (const args of Object.values(processes)) running.push(start(args));
    // Every process reached the BMDB, and one of them read the fleet.
    await eventually('every process up and the fleet read', async () => {
      for (const [name, port] of Object.entries(ports)) {
        const response = await fetch(`http://127.0.0.1:${port}/metrics`).catch(() => undefined);
        if (!response?.ok) return undefined;
        bodies.set(name, await response.text());
      }
      const all = [...bodies.values()];
      return all.every((body) => /^bmdb_up 1$/m.test(body)) && all.some((body) => /^bmdb_fleet_machines\{/m.test(body))
        ? true
        : undefined;
    });
    for (const [name, body] of bodies) served.set(name, families(body));
  });
  afterAll(async () => {
    for (const process of running) process.child.kill('SIGTERM');
    for (const process of running) expect((await process.exited).code, process.stderr).toBe(0);
    await rm(dir, { recursive: true, force: true });
  });

  test('of run, server and web, exactly one reads the fleet; the others serve no fleet gauge', () => {
    const leading = [...bodies].filter(([, body]) => /^bmdb_fleet_reader_leading 1$/m.test(body)).map(([name]) => name);
    expect(leading).toHaveLength(1);
    for (const [name, body] of bodies) {
      expect(/^bmdb_fleet_machines\{/m.test(body), name).toBe(leading.includes(name));
      if (!leading.includes(name)) expect(body, name).toMatch(/^bmdb_fleet_reader_leading 0$/m);
    }
  });

  test('every metric an alert rule names is served', async () => {
    const exported = new Set([...served.values()].flatMap((names) => [...names]));
    const named = (await rules()).groups.flatMap((group) =>
      group.rules.flatMap((rule) =>
        [...metricNames(rule.expr)].map((name) => ({ name, rule: rule.alert ?? rule.record })),
      ),
    );
    expect(named.length).toBeGreaterThan(10);
    expect(named.filter(({ name }) => !exported.has(name))).toEqual([]);
  });

  test('every metric a dashboard panel or variable names is served', async () => {
    const exported = new Set([...served.values()].flatMap((names) => [...names]));
    const named = (await dashboardQueries()).flatMap((query) =>
      [...metricNames(query)].map((name) => ({ name, query })),
    );
    expect(named.length).toBeGreaterThan(20);
    expect(named.filter(({ name }) => !exported.has(name))).toEqual([]);
  });
});

/** Metric families of a text exposition, with the series names of histograms and summaries. */
function families(exposition: string): Set<string> {
  const names = new Set<string>();
  for (const [, name = '', type] of exposition.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    names.add(name);
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(name + suffix);
    if (type === 'summary') for (const suffix of ['_sum', '_count']) names.add(name + suffix);
  }
  return names;
}

describe('the dashboard', () => {
  test('every panel queries the dashboard’s Prometheus, with unique ids and reference IDs', async () => {
    const board = await dashboard();
    expect(board.uid).toBe('shepherd-ts');
    expect(board.templating.list.find((variable) => variable.name === 'datasource')).toMatchObject({
      type: 'datasource',
      query: 'prometheus',
    });
    const all = panels(board.panels);
    expect(new Set(all.map((panel) => panel.id)).size).toBe(all.length);
    const graphs = all.filter((panel) => panel.type !== 'row');
    expect(graphs.length).toBeGreaterThan(20);
    for (const panel of graphs) {
      // Grafana's own `${…}` variable syntax, not a template string.
      expect(panel.datasource, panel.title).toEqual({ type: 'prometheus', uid: `\${datasource}` });
      expect(panel.targets?.length, panel.title).toBeGreaterThan(0);
      const refIds = (panel.targets ?? []).map((target) => target.refId);
      expect(new Set(refIds).size, panel.title).toBe(refIds.length);
    }
  });
});

describe.skipIf(!hasPromtool)(`alert rules (${PROMTOOL})`, () => {
  const promtool = (...args: string[]) =>
    spawnSync(PROMTOOL, args, { cwd: path.dirname(RULES), encoding: 'utf8', timeout: 60_000 });

  test('promtool check rules accepts them', async () => {
    const result = promtool('check', 'rules', RULES);
    expect(result.status, result.stdout + result.stderr).toBe(0);
    expect(result.stdout).toContain(`SUCCESS: ${(await rules()).groups.flatMap((g) => g.rules).length} rules found`);
  });

  test('every alert has unit tests where it fires and where it does not, and promtool test rules passes them', async () => {
    const tests = yaml.load(await readFile(RULE_TESTS, 'utf8')) as RuleTests;
    expect(tests.rule_files).toEqual([path.basename(RULES)]);
    const cases = tests.tests.flatMap((t) => t.alert_rule_test ?? []);
    for (const alert of await alerts()) {
      const mine = cases.filter((c) => c.alertname === alert.alert);
      expect(
        mine.some((c) => c.exp_alerts.length > 0),
        `${alert.alert} fires in a test`,
      ).toBe(true);
      expect(
        mine.some((c) => c.exp_alerts.length === 0),
        `${alert.alert} stays quiet in a test`,
      ).toBe(true);
    }
    const result = promtool('test', 'rules', RULE_TESTS);
    expect(result.status, result.stdout + result.stderr).toBe(0);
    expect(result.stdout).toContain('SUCCESS');
  });
});

describe.skipIf(!hasSystemdAnalyze)(`systemd units (${SYSTEMD_ANALYZE})`, () => {
  let scratch: string;
  /** The units as shipped; the template as one of its instances, which is what systemd loads. */
  let units: string[];
  beforeAll(async () => {
    scratch = await mkdtemp(path.join(tmpdir(), 'shepherd-units-'));
    units = [];
    for (const name of await readdir(UNITS)) {
      if (!name.endsWith('.service')) continue;
      const text = await readFile(path.join(UNITS, name), 'utf8');
      if (name.endsWith('@.service')) {
        const instance = path.join(scratch, name.replace('@.service', '@static.service'));
        await writeFile(instance, text);
        units.push(instance);
      } else units.push(path.join(UNITS, name));
    }
    expect(units.map((unit) => path.basename(unit)).sort()).toEqual([
      'shepherd-run@static.service',
      'shepherd-server.service',
      'shepherd-web.service',
    ]);
  });
  afterAll(() => rm(scratch, { recursive: true, force: true }));

  /**
   * Runs systemd-analyze on the units with the shepherd where they run it:
   * `verify` checks that ExecStart's program exists. In a mount namespace of
   * its own, the directory the units run it from (`/opt`) is this checkout's
   * shepherd (a symlink to the built binary), and nothing else on the host
   * changes. Where namespaces are not allowed (an unprivileged container),
   * copies of the units run this checkout's binary instead, differing from
   * the shipped ones in that path alone.
   */
  async function analyze(args: string[]): Promise<{ status: number | null; output: string; how: string }> {
    const program = await execStartProgram();
    const top = `/${program.split('/')[1]}`;
    const shadow = path.join(scratch, 'opt');
    await mkdir(path.dirname(path.join(shadow, path.relative(top, program))), { recursive: true });
    await symlink(BIN, path.join(shadow, path.relative(top, program))).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== 'EEXIST') throw error;
    });
    const quoted = [SYSTEMD_ANALYZE, ...args, ...units].map((word) => `'${word}'`).join(' ');
    const isolated = spawnSync('unshare', ['--mount', 'sh', '-c', `mount --bind '${shadow}' '${top}' && ${quoted}`], {
      encoding: 'utf8',
      timeout: 120_000,
    });
    if (isolated.error === undefined && !/unshare failed|mount: .*(permission|denied)/i.test(isolated.stderr)) {
      return { status: isolated.status, output: isolated.stdout + isolated.stderr, how: 'the units as shipped' };
    }
    console.warn(`systemd units checked as copies running ${BIN}: no mount namespace here (${isolated.stderr.trim()})`);
    const copies: string[] = [];
    for (const unit of units) {
      const text = await readFile(unit, 'utf8');
      const copy = path.join(scratch, 'copies', path.basename(unit));
      await mkdir(path.dirname(copy), { recursive: true });
      const changed = text.replaceAll(program, BIN);
      expect(diffLines(text, changed).every((line) => line.startsWith('ExecStart='))).toBe(true);
      await writeFile(copy, changed);
      copies.push(copy);
    }
    const direct = spawnSync(SYSTEMD_ANALYZE, [...args, ...copies], { encoding: 'utf8', timeout: 120_000 });
    return { status: direct.status, output: direct.stdout + direct.stderr, how: 'copies' };
  }

  /** The one program every unit runs. */
  async function execStartProgram(): Promise<string> {
    const programs = new Set<string>();
    for (const unit of units) {
      for (const [, program = ''] of (await readFile(unit, 'utf8')).matchAll(/^ExecStart=(\S+)/gm)) {
        programs.add(program);
      }
    }
    expect([...programs]).toHaveLength(1);
    return [...programs][0] as string;
  }

  test('systemd-analyze verify passes on them without a word', async () => {
    const { status, output, how } = await analyze(['verify']);
    expect(status, `${how}: ${output}`).toBe(0);
    expect(output, how).toBe('');
  });

  test('they are hardened: systemd-analyze security rates each at most 2.0 exposure', async () => {
    const { status, output, how } = await analyze(['security', '--offline=yes', '--threshold=20', '--no-pager']);
    expect(status, `${how}: ${output}`).toBe(0);
    const levels = [...output.matchAll(/Overall exposure level for (\S+): (\d+\.\d+)/g)];
    expect(levels.map(([, unit]) => unit).sort()).toEqual([
      'shepherd-run@static.service',
      'shepherd-server.service',
      'shepherd-web.service',
    ]);
    for (const [, unit, level] of levels) expect(Number(level), unit).toBeLessThanOrEqual(2);
    // Restart on failure, as the dedicated user, with the settings file.
    for (const unit of units) {
      const text = await readFile(unit, 'utf8');
      expect(text, unit).toMatch(/^Restart=on-failure$/m);
      expect(text, unit).toMatch(/^User=shepherd$/m);
      expect(text, unit).toMatch(/^EnvironmentFile=\/etc\/shepherd\/shepherd\.env$/m);
    }
  });

  test('every SHEPHERD_* setting of a unit, and of the settings file, is a flag of the command it runs', async () => {
    const shared = variables(await readFile(path.join(UNITS, 'shepherd.env'), 'utf8'));
    expect(shared.length).toBeGreaterThan(2);
    for (const unit of units) {
      const text = await readFile(unit, 'utf8');
      const command = /^ExecStart=\S+ (\S+)/m.exec(text)?.[1] as string;
      const own = [...text.matchAll(/^Environment=(SHEPHERD_[A-Z0-9_]+)=/gm)].map(([, name]) => name as string);
      const help = (await shepherd([command, ...(command === 'run' ? ['static'] : []), '--help'])).stdout;
      for (const variable of [...own, ...shared]) {
        const flag = `--${variable.slice('SHEPHERD_'.length).toLowerCase().replaceAll('_', '-')}`;
        expect(help, `${path.basename(unit)}: ${variable}`).toContain(flag);
      }
    }
  });

  test('the sysusers file makes the dedicated user, its home the state directory', async () => {
    const sysusers = '/usr/bin/systemd-sysusers';
    if (!existsSync(sysusers)) return console.warn(`sysusers check skipped: ${sysusers} is missing`);
    const target = path.join(scratch, 'root');
    await mkdir(path.join(target, 'etc'), { recursive: true });
    const result = spawnSync(sysusers, [`--root=${target}`, path.join(UNITS, 'shepherd.sysusers.conf')], {
      encoding: 'utf8',
    });
    expect(result.status, result.stderr).toBe(0);
    expect(await readFile(path.join(target, 'etc', 'passwd'), 'utf8')).toMatch(
      /^shepherd:x:\d+:\d+:BMaaS shepherd:\/var\/lib\/shepherd:\/usr\/sbin\/nologin$/m,
    );
  });
});

/** `SHEPHERD_*` names an environment file sets. */
function variables(text: string): string[] {
  return [...text.matchAll(/^(SHEPHERD_[A-Z0-9_]+)=/gm)].map(([, name]) => name as string);
}

/** The lines of `after` that `before` does not have at the same place. */
function diffLines(before: string, after: string): string[] {
  const old = before.split('\n');
  return after.split('\n').filter((line, i) => line !== old[i]);
}
