/**
 * The takeover payload (`shepherd agent-image build`'s `takeover`) as the
 * shepherd's initializer runs it: `sh` on the one uploaded file, a
 * TakeoverInit on standard input. It takes busybox, the image and node out
 * of itself, captures the network, loads the image with the machine's
 * config and answers; once its session has ended it kexecs. kexec here is a
 * stand-in script that records what it was asked and refuses `-e`: the real
 * one would load into (and boot away from) the machine running the tests,
 * and this machine's kernel has no kexec. The lab boots the real one
 * (packages/lab/test/lab.test.ts). The network and kexec are read from a
 * recorded tree (`--root`): a VM's procfs and sysfs.
 */
import { execFile, spawn } from 'node:child_process';
import { createHash, X509Certificate } from 'node:crypto';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { parseTakeoverResponse } from '@bmaas/shepherd-manager';
import { create, toBinary } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { type AgentImage, buildAgentImage } from '../src/index.js';
import { kexecCommandLine, kexecUnavailable, sessionEnded } from '../src/kexec.js';
import { networkFromProcfs } from '../src/network/from-procfs.js';
import { IN_PLACE_WARNING } from '../src/takeover.js';
import { bundleAgent } from './bundle-agent.js';

const run = promisify(execFile);
const fixtures = fileURLToPath(new URL('./fixtures/', import.meta.url));
/** Shared with image.test.ts: the image is built once. */
const cacheDir = path.join(tmpdir(), 'bmaas-agent-image-test-cache');
const { bmdb } = await testBMDB();
const q = bmdb.db;
const isRoot = process.getuid?.() === 0;

let dir: string;
let image: AgentImage;
let server: BmaasServer;
let caDer: Uint8Array;
/** A VM's tree: its hardware, network, kernel command line, and a kernel with kexec. */
let root: string;
const agents = new Set<number>();

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-payload-'));
  const bundle = path.join(dir, 'agent.cjs');
  await bundleAgent(bundle);
  image = await buildAgentImage({
    out: path.join(dir, 'image'),
    cacheDir,
    agentBundle: bundle,
    takeoverFlags: ['--interval=200ms'],
  });
  const tls = await selfSignedServerTls(dir);
  caDer = new X509Certificate(tls.cert).raw;
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  root = path.join(dir, 'root');
  await cp(path.join(fixtures, 'bios-vm'), root, { recursive: true, verbatimSymlinks: true });
  for (const part of ['proc/net', 'sys/class/net', 'etc']) {
    await cp(path.join(fixtures, 'network/virtio-vm', part), path.join(root, part), {
      recursive: true,
      verbatimSymlinks: true,
    });
  }
  await mkdir(path.join(root, 'sys/kernel'), { recursive: true });
  await writeFile(path.join(root, 'sys/kernel/kexec_loaded'), '0\n');
  await writeFile(path.join(root, 'proc/cmdline'), 'BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro console=ttyS1,57600 quiet\n');
}, 600_000);

afterAll(async () => {
  for (const pid of agents) {
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      // Already gone.
    }
  }
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A kexec stand-in in `at`: each call's arguments in `at/kexec.log`, the loaded initramfs kept; `-e` refused. */
async function kexecStandIn(at: string): Promise<string> {
  const program = path.join(at, 'kexec');
  await writeFile(
    program,
    `#!/bin/sh
echo "$*" >>'${at}/kexec.log'
case "$1" in
  -l) for a; do case "$a" in --initrd=*) cp "\${a#--initrd=}" '${at}/loaded-initrd' ;; esac; done; exit 0 ;;
  -e) echo 'kexec stand-in: no kexec on this machine' >&2; exit 1 ;;
esac
`,
    { mode: 0o755 },
  );
  return program;
}

/** Runs the payload as the initializer does (`sh` on the uploaded file), in a directory of its own. */
async function runPayload(machineId: string, args: readonly string[]) {
  const at = await mkdtemp(path.join(dir, 'machine-'));
  const payload = path.join(at, 'agent');
  await cp(image.takeover, payload);
  const sent = { machineId, bmaasEndpoint: `localhost:${server.port}`, caCertificate: caDer };
  const stdin = toBinary(TakeoverInitSchema, create(TakeoverInitSchema, sent));
  const result = await new Promise<{ code: number | null; stdout: Buffer; stderr: string }>((resolve, reject) => {
    const child = spawn('sh', [payload, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    const stdout: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(stdout), stderr }));
    child.stdin.end(stdin);
  });
  return { at, sent, payload, ...result };
}

/** The in-place agent's process ID, from its log, once it heartbeats. */
async function agentInPlace(log: string): Promise<number> {
  const pid = await eventually('the agent logged', async () => {
    const match = / (\d+) [0-9a-f-]{36}: heartbeating to /.exec(await readFile(log, 'utf8').catch(() => ''));
    return match ? Number(match[1]) : undefined;
  });
  agents.add(pid);
  return pid;
}

const lastHeartbeat = async (machineId: string) =>
  (
    await bmdb.db
      .selectFrom('machine_agent_heartbeat')
      .select('agent_heartbeat_at')
      .where('machine_id', '=', machineId)
      .executeTakeFirst()
  )?.agent_heartbeat_at;

describe('the takeover payload', () => {
  test.skipIf(!isRoot)(
    'run by sh, it answers, having loaded the image with the machine’s config and network; after its session it kexecs, and where kexec -e returns the agent runs in place',
    async () => {
      const machineId = await newMachine(q);
      const standIn = await kexecStandIn(await mkdtemp(path.join(dir, 'kexec-')));
      const at = path.dirname(standIn);
      const { code, stdout, stderr, payload, sent } = await runPayload(machineId, ['--root', root, '--kexec', standIn]);
      expect(code, stderr).toBe(0);
      const { key, warnings } = parseTakeoverResponse(stdout, sent);
      // Loaded for a kexec: no in-place warning; what the capture could not tell, said.
      expect(warnings).toEqual([
        'network configuration: read from procfs, which does not tell a DHCP lease from a static address: IPv4 addresses handed over as static',
      ]);
      const [load] = (await readFile(path.join(at, 'kexec.log'), 'utf8')).split('\n');
      const d = `${payload}.d`;
      expect(load).toMatch(
        new RegExp(
          `^-l ${d}/vmlinuz --initrd=${d}/initramfs\\.\\d+\\.kexec --command-line=console=ttyS1,57600 panic=10$`,
        ),
      );
      // The kernel and initramfs came out of the payload as they went in.
      const sha = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');
      expect(sha(await readFile(`${d}/vmlinuz`))).toBe(sha(await readFile(image.vmlinuz)));
      const initramfs = await readFile(image.initramfs);
      const loaded = await readFile(path.join(at, 'loaded-initrd'));
      // The image's initramfs, then (4-byte aligned) the machine's config archive.
      expect(sha(loaded.subarray(0, initramfs.length))).toBe(sha(initramfs));
      const configAt = Math.ceil(initramfs.length / 4) * 4;
      const config = path.join(at, 'config');
      await mkdir(config);
      await writeFile(path.join(at, 'config.cpio'), loaded.subarray(configAt));
      await run('sh', ['-c', `cd '${config}' && busybox cpio -i -d < ../config.cpio`]);
      expect(await readFile(path.join(config, 'etc/bmaas/agent-flags'), 'utf8')).toBe(
        '--interval=200ms\n--service=cloud.agent.api\n--install-timeout=15m\n',
      );
      expect(JSON.parse(await readFile(path.join(config, 'etc/bmaas/network.json'), 'utf8'))).toEqual(
        (await networkFromProcfs(root)).config,
      );
      const handOver = JSON.parse(await readFile(path.join(config, 'etc/bmaas/handover.json'), 'utf8'));
      expect(Buffer.from(handOver.init, 'base64')).toEqual(
        Buffer.from(toBinary(TakeoverInitSchema, create(TakeoverInitSchema, sent))),
      );

      // The session (here the takeover process) ended: kexec -e; the stand-in refuses, so the agent runs in place.
      await setAgentStarted(q, machineId, { publicKey: key });
      await eventually('kexec -e', async () =>
        (await readFile(path.join(at, 'kexec.log'), 'utf8')).includes('\n-e\n') ? true : undefined,
      );
      const log = `${d}/agent.log`;
      await agentInPlace(log);
      expect(await readFile(log, 'utf8')).toContain(
        'bmaas-agent: kexec -e returned (kexec stand-in: no kexec on this machine): running the agent in place',
      );
      await eventually('a heartbeat recorded', () => lastHeartbeat(machineId));
    },
  );

  test('where the kernel cannot kexec, it says why in its warnings and the agent runs in place', async () => {
    const machineId = await newMachine(q);
    const noKexec = await mkdtemp(path.join(dir, 'root-'));
    await cp(path.join(fixtures, 'bios-vm'), noKexec, { recursive: true, verbatimSymlinks: true });
    const { code, stdout, stderr, payload, sent } = await runPayload(machineId, ['--root', noKexec]);
    expect(code, stderr).toBe(0);
    const { key, warnings } = parseTakeoverResponse(stdout, sent);
    expect(warnings).toEqual([
      isRoot
        ? 'kexec into the agent image is not possible: the running kernel was built without kexec (no /sys/kernel/kexec_loaded)'
        : `kexec into the agent image is not possible: kexec needs root, and the agent runs as user ${process.getuid?.()}`,
      IN_PLACE_WARNING,
    ]);
    await setAgentStarted(q, machineId, { publicKey: key });
    await agentInPlace(`${payload}.d/agent.log`);
    await eventually('a heartbeat recorded', () => lastHeartbeat(machineId));
  });

  test('the payload is one file under 128 MiB: a shell header, busybox, the kernel, the initramfs', async () => {
    const header = (await readFile(image.takeover)).subarray(0, 4096).toString('latin1');
    expect(header.startsWith('#!/bin/sh\n')).toBe(true);
    expect(image.takeoverBytes).toBeLessThan(128 * 2 ** 20);
    process.stdout.write(
      `takeover payload: ${(image.takeoverBytes / 2 ** 20).toFixed(1)} MiB (initramfs ${(image.initramfsBytes / 2 ** 20).toFixed(1)} MiB)\n`,
    );
  });
});

describe('kexec', () => {
  test('is not possible without the image’s files, the kexec program, or a kernel that allows it; each said', async () => {
    const at = await mkdtemp(path.join(dir, 'unavailable-'));
    const files = { kernel: path.join(at, 'vmlinuz'), initramfs: path.join(at, 'initramfs'), kexec: 'sh' };
    expect(await kexecUnavailable(files, root)).toBe(`${files.kernel} is missing`);
    await writeFile(files.kernel, 'k');
    await writeFile(files.initramfs, 'i');
    expect(await kexecUnavailable({ ...files, kexec: 'no-such-kexec' }, root)).toBe(
      "no no-such-kexec program (Debian's kexec-tools)",
    );
    if (!isRoot) return;
    expect(await kexecUnavailable(files, root)).toBeUndefined();
    const disabled = await mkdtemp(path.join(dir, 'disabled-'));
    await mkdir(path.join(disabled, 'sys/kernel'), { recursive: true });
    await mkdir(path.join(disabled, 'proc/sys/kernel'), { recursive: true });
    await writeFile(path.join(disabled, 'sys/kernel/kexec_loaded'), '0\n');
    await writeFile(path.join(disabled, 'proc/sys/kernel/kexec_load_disabled'), '1\n');
    expect(await kexecUnavailable(files, disabled)).toBe(
      'kexec is disabled on the running kernel (kernel.kexec_load_disabled = 1)',
    );
  });

  test('the image’s command line keeps the running kernel’s consoles, else the first serial port', () => {
    expect(kexecCommandLine('root=/dev/sda1 console=tty0 console=ttyS1,115200n8 quiet')).toBe(
      'console=tty0 console=ttyS1,115200n8 panic=10',
    );
    expect(kexecCommandLine('root=/dev/sda1 quiet')).toBe('console=tty0 console=ttyS0,115200 panic=10');
    expect(kexecCommandLine(undefined)).toBe('console=tty0 console=ttyS0,115200 panic=10');
  });

  test('waits for the session’s end: the process it was given exiting, when no sshd runs it', async () => {
    const child = spawn(process.execPath, ['-e', "process.stdout.write('ready'); setInterval(() => {}, 1000)"], {
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    let ended = false;
    const waiting = sessionEnded(child.pid as number, 60_000).then(() => {
      ended = true;
    });
    // Node's start takes longer than the wait's first look at the process: a wait that ended at once shows here.
    await new Promise((resolve) => child.stdout.once('data', resolve));
    expect(ended).toBe(false);
    child.kill('SIGKILL');
    await waiting;
    expect(ended).toBe(true);
  });
});
