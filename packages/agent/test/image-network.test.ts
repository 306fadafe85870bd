/**
 * The agent image's network scripts, run for real under busybox-static's
 * `sh` (the image's shell) in a scratch tree standing for the image's root:
 * its sysfs carrier files, /run, /etc, the log and the console are files
 * there. busybox runs its own applets before anything on the PATH, so
 * `udhcpc` and `ip` are shell functions defined before the script is
 * sourced: they record each call, and `ip` keeps the addresses and routes
 * a kernel would in two files.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
import { eventually } from '../../../test/support/wait.js';
import { AGENT_LOG, dhcpOnLinkScript, leaseScript, UDHCPC_SCRIPT } from '../src/image/init-script.js';

/** The image's busybox (Debian's busybox-static), as the image build takes it. */
const BUSYBOX = '/bin/busybox';

/** udhcpc and ip as the kernel would answer them, writing to $ROOT/calls, addresses and routes. */
const FAKES = `
udhcpc() { echo "udhcpc $*" >>"$ROOT/calls"; }
ip() {
  echo "ip $*" >>"$ROOT/calls"
  case "$1 $2" in
    "addr add")
      grep -q -x -F "$5 $3" "$ROOT/addresses" && return 2
      echo "$5 $3" >>"$ROOT/addresses" ;;
    "addr del")
      grep -q -x -F "$5 $3" "$ROOT/addresses" || return 2
      grep -v -x -F "$5 $3" "$ROOT/addresses" >"$ROOT/kept"; mv "$ROOT/kept" "$ROOT/addresses" ;;
    "addr flush") grep -v "^$4 " "$ROOT/addresses" >"$ROOT/kept"; mv "$ROOT/kept" "$ROOT/addresses" ;;
    "-4 addr") grep "^$5 " "$ROOT/addresses" | while read -r dev address; do echo "    inet $address scope global $dev"; done ;;
    "route add")
      grep -q -x -F "$7 $5" "$ROOT/routes" && return 2
      echo "$7 $5" >>"$ROOT/routes" ;;
    "route del")
      grep -q -x -F "$7 $5" "$ROOT/routes" || return 2
      grep -v -x -F "$7 $5" "$ROOT/routes" >"$ROOT/kept"; mv "$ROOT/kept" "$ROOT/routes" ;;
  esac
  return 0
}
`;

const roots: string[] = [];
const running = new Set<ChildProcess>();
afterEach(() => {
  for (const child of running) {
    if (child.pid !== undefined && child.exitCode === null) process.kill(-child.pid, 'SIGKILL');
  }
  running.clear();
});
afterAll(async () => {
  for (const root of roots) await rm(root, { recursive: true, force: true });
});

/** A scratch root with NICs whose carrier is `links`' (1 or 0), no addresses, no routes. */
async function scratchRoot(links: Record<string, 0 | 1>): Promise<string> {
  const root = await mkdtemp(path.join(tmpdir(), 'agent-image-net-'));
  roots.push(root);
  for (const dir of ['var/log', 'dev', 'etc', 'run']) await mkdir(path.join(root, dir), { recursive: true });
  for (const [nic, carrier] of Object.entries(links)) await setCarrier(root, nic, carrier);
  for (const file of ['dev/console', 'calls', 'addresses', 'routes']) await writeFile(path.join(root, file), '');
  return root;
}

async function setCarrier(root: string, nic: string, carrier: 0 | 1): Promise<void> {
  await mkdir(path.join(root, 'sys/class/net', nic), { recursive: true });
  await writeFile(path.join(root, 'sys/class/net', nic, 'carrier'), `${carrier}\n`);
}

const lines = async (root: string, file: string) =>
  (await readFile(path.join(root, file), 'utf8')).split('\n').filter((line) => line !== '');

interface Run {
  readonly child: ChildProcess;
  /** What it printed so far (the console, for /init's children). */
  output(): string;
  /** Resolves once every process of it (background ones too) has closed its output. */
  readonly closed: Promise<void>;
}

/** Runs `script` with `args` under busybox sh, the fakes defined, `env` set, in its own process group. */
async function runScript(root: string, script: string, args: readonly string[], env: Record<string, string> = {}) {
  const file = path.join(root, `script-${roots.length}-${Math.random().toString(36).slice(2)}`);
  await writeFile(file, script, { mode: 0o755 });
  const child = spawn(BUSYBOX, ['sh', '-c', `${FAKES}\n. "$0" "$@"`, file, ...args], {
    env: { PATH: '/bin:/usr/bin', ROOT: root, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  running.add(child);
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  child.stderr.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  const closed = new Promise<void>((resolve) => child.on('close', () => resolve()));
  return { child, output: () => output, closed } satisfies Run;
}

describe('dhcp-on-link: DHCP on every NIC as it gains link', () => {
  const asked = (nic: string) => `udhcpc -i ${nic} -s ${UDHCPC_SCRIPT} -t 5 -T 2 -b`;

  test('a NIC with link is asked at once; one that gains link later is asked then, while the unlinked one waits', async () => {
    const root = await scratchRoot({ eth0: 1, eth1: 0, eth2: 0 });
    const run = await runScript(root, dhcpOnLinkScript(root), ['eth0', 'eth1', 'eth2']);
    await eventually('the watch for link began', async () =>
      run.output().includes('bmaas-init: no link yet on eth1 eth2: watching for 600 s, DHCP on each that gains it')
        ? true
        : undefined,
    );
    expect(await lines(root, 'calls')).toEqual([asked('eth0')]);

    // The switch port of eth1 comes up (its spanning tree done, a cable plugged in).
    await setCarrier(root, 'eth1', 1);
    await eventually('eth1 was asked', async () =>
      (await lines(root, 'calls')).includes(asked('eth1')) ? true : undefined,
    );
    expect(await lines(root, 'calls')).toEqual([asked('eth0'), asked('eth1')]);
    expect(run.output()).toContain('bmaas-init: eth1: link up: asking DHCP');
    // What the console shows is in the agent's log too.
    expect(await readFile(path.join(root, AGENT_LOG), 'utf8')).toContain('bmaas-init: eth1: link up: asking DHCP');
  });

  test('the watch is bounded: a NIC still without link after it is left, saying so', async () => {
    const root = await scratchRoot({ eth0: 1, eth1: 0 });
    const run = await runScript(root, dhcpOnLinkScript(root, 2), ['eth0', 'eth1']);
    await run.closed;
    expect(run.output()).toContain('bmaas-init: no link on eth1 after 2 s: no longer watched');
    // Nothing of the script runs any more: a link now asks nothing.
    await setCarrier(root, 'eth1', 1);
    expect(await lines(root, 'calls')).toEqual([asked('eth0')]);
  });
});

describe("udhcpc's lease script: a lease takes away only what it added", () => {
  /** Runs the lease script as udhcpc does, with the lease's variables, and waits for its end. */
  async function udhcpc(root: string, event: string, lease: Record<string, string> = {}): Promise<void> {
    const run = await runScript(root, leaseScript(root), [event], { interface: 'eth0', ...lease });
    await run.closed;
    expect(run.child.exitCode).toBe(0);
  }
  const LEASE = { ip: '203.0.113.7', mask: '24', router: '203.0.113.1', dns: '192.0.2.53 192.0.2.54' };

  test('a static address beside the lease (a captured network) survives deconfig, the lease, its renewal, a new address and its loss', async () => {
    const root = await scratchRoot({ eth0: 1 });
    // network-up set the captured static address; then udhcpc starts with a deconfig.
    await writeFile(path.join(root, 'addresses'), 'eth0 192.0.2.10/24\n');
    await udhcpc(root, 'deconfig');
    expect(await lines(root, 'addresses')).toEqual(['eth0 192.0.2.10/24']);

    await udhcpc(root, 'bound', LEASE);
    expect(await lines(root, 'addresses')).toEqual(['eth0 192.0.2.10/24', 'eth0 203.0.113.7/24']);
    expect(await lines(root, 'routes')).toEqual(['eth0 203.0.113.1']);
    expect(await readFile(path.join(root, 'etc/resolv.conf'), 'utf8')).toBe(
      'nameserver 192.0.2.53\nnameserver 192.0.2.54\n',
    );
    expect(await readFile(path.join(root, 'dev/console'), 'utf8')).toBe('bmaas-init: eth0: 203.0.113.7/24 (DHCP)\n');

    // A renewal of the same lease changes nothing.
    const before = await lines(root, 'calls');
    await udhcpc(root, 'renew', LEASE);
    expect(await lines(root, 'calls')).toEqual(before);

    // A new address: the old lease's goes, the static one stays.
    await udhcpc(root, 'renew', { ...LEASE, ip: '203.0.113.8' });
    expect(await lines(root, 'addresses')).toEqual(['eth0 192.0.2.10/24', 'eth0 203.0.113.8/24']);
    expect(await lines(root, 'routes')).toEqual(['eth0 203.0.113.1']);

    // The lease is lost: its address and route go, nothing else.
    await udhcpc(root, 'deconfig');
    expect(await lines(root, 'addresses')).toEqual(['eth0 192.0.2.10/24']);
    expect(await lines(root, 'routes')).toEqual([]);
    expect((await lines(root, 'calls')).filter((call) => call.includes('flush'))).toEqual([]);
  });
});
