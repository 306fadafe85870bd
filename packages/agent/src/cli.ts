import { spawn, spawnSync } from 'node:child_process';
import { createPrivateKey, type KeyObject } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import { appendFile, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { type TakeoverInit, TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { fromBinary } from '@bufbuild/protobuf';
import { runAgent } from './agent.js';
import type { AgentService } from './callback/heartbeat-client.js';
import { EnrollmentRefusedError, enrollAgent, parseEnrollment } from './enrollment.js';
import { readHardware } from './hardware/inventory.js';
import { readNics } from './hardware/nics.js';
import { agentConfigArchive, handOverText } from './image/config.js';
import { ENROLLMENT_JSON } from './image/init-script.js';
import { KexecError, type KexecImage, kexecCommandLine, kexecUnavailable, sessionEnded, stageKexec } from './kexec.js';
import { bringUpNetwork, networkSteps } from './network/bring-up.js';
import { captureNetwork } from './network/capture.js';
import type { NetworkConfig } from './network/config.js';
import { runRebootCommand } from './reboot.js';
import { IN_PLACE_WARNING, takeover, takeoverResponse } from './takeover.js';

const USAGE = `Usage: bmaas-agent <command> [flags]

The BMaaS agent. Commands:
  takeover     Read a TakeoverInit on standard input, answer with a TakeoverResponse on
               standard output (the agent's new ed25519 key). With --image-dir: capture the
               network configuration, load the agent image with it (kexec -l), and once the
               SSH session has ended, boot it (kexec -e). Without, or where kexec cannot run
               (said in the answer's warnings): run the agent in place, detached (with
               --foreground, in this process after closing standard output).
  run          Run the agent with the settings "takeover" hands it on standard input
               (JSON: the init and the key). Not for people.
  enroll       On a machine its BMC booted into the agent image: make the agent's key, enroll
               it with the one-time token of --enrollment (retrying while the server cannot be
               reached; a refusal runs --reboot-command, the machine's disk boots, and ends
               it, exit 1), then run the agent as "run" does.
  boot-image   Wait for the SSH session of process --after-pid to end, then kexec -e into
               the loaded agent image; if that returns, run the agent in place. Not for people.
  network-up   In the agent image: bring up the network a takeover captured (the JSON file
               given) by MAC; print the interfaces to ask DHCP on. Not for people.
  report       Print this machine's hardware inventory as JSON.

Flags:
  --interval <duration>        Between heartbeats (500ms, 30s, 1m). Default 30s.
  --service <package>          cloud.agent.api (default) or cloud.bmaas.server.api.
  --root <dir>                 Where sysfs, procfs and /dev are. Default /.
  --efivars <dir>              efivarfs, for the boot entry. Default /sys/firmware/efi/efivars.
  --install-timeout <duration> The bound of one installation. Default 15m.
  --reboot-command <command>   Run with sh -c after a successful installation was reported
                               (reboot -f), and by enroll after a refusal. Default: none; the
                               agent stops instead.
  --log-file <file>            Append the agent's log lines there (else standard error); its
                               tail goes to the server with the heartbeats.
  --send-log <file>            run: the log whose tail (last 64 KiB) heartbeats carry to the
                               server when it changed. Default --log-file's.
  --foreground                 takeover: run the agent (or wait and kexec) in this process.
  --in-place <why>             run: the agent runs in place on the machine's own OS, for this
                               reason (the takeover sets it where kexec cannot run): it refuses
                               installations and wipes, and its hardware report says so.
  --image-dir <dir>            takeover: the agent image to kexec into (vmlinuz, initramfs).
  --kexec <program>            takeover: kexec-tools' kexec. Default kexec (on the PATH).
  --node <program>             takeover: how to start node again for the detached process.
                               Default this one's.
  --after-pid <pid>            boot-image: the process whose SSH session to wait for.
  --enrollment <file>          enroll: the enrollment file (JSON: the init, base64, and the
                               token). Default ${ENROLLMENT_JSON}.
  --write-handover <file>      enroll: once enrolled, write what "run" reads (the init and the
                               key) there, mode 0600, so a restarted agent runs, not enrolls.
  --help                       This text.
`;

/** A flag the agent could not use; names the flag. */
export class AgentUsageError extends Error {
  override name = 'AgentUsageError';
}

const OPTIONS = {
  interval: { type: 'string', default: '30s' },
  service: { type: 'string', default: 'cloud.agent.api' },
  root: { type: 'string', default: '/' },
  efivars: { type: 'string', default: '/sys/firmware/efi/efivars' },
  'install-timeout': { type: 'string', default: '15m' },
  'reboot-command': { type: 'string' },
  'log-file': { type: 'string' },
  'send-log': { type: 'string' },
  foreground: { type: 'boolean', default: false },
  'in-place': { type: 'string' },
  'image-dir': { type: 'string' },
  kexec: { type: 'string', default: 'kexec' },
  node: { type: 'string' },
  'after-pid': { type: 'string' },
  enrollment: { type: 'string', default: ENROLLMENT_JSON },
  'write-handover': { type: 'string' },
  help: { type: 'boolean', default: false },
} as const;

/** How long the detached process waits for the takeover's SSH session to end before it kexecs anyway. */
const SESSION_BOUND_MS = 60_000;

/** Runs the agent's command line; resolves with its exit code. */
export async function main(argv: readonly string[]): Promise<number> {
  let parsed: ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>;
  try {
    parsed = parseArgs({ args: [...argv], options: OPTIONS, allowPositionals: true });
  } catch (error) {
    process.stderr.write(`bmaas-agent: ${(error as Error).message}\n${USAGE}`);
    return 2;
  }
  const { values, positionals } = parsed;
  const command = positionals[0];
  if (values.help || command === undefined) {
    process.stdout.write(USAGE);
    return values.help ? 0 : 2;
  }
  try {
    switch (command) {
      case 'takeover':
        return await takeoverCommand(argv, values);
      case 'run':
        return await runCommand(values);
      case 'enroll':
        return await enrollCommand(values);
      case 'boot-image':
        return await bootImageCommand(values);
      case 'network-up':
        return await networkUpCommand(positionals[1]);
      case 'report':
        process.stdout.write(`${JSON.stringify(await readHardware(values.root), null, 2)}\n`);
        return 0;
      default:
        throw new AgentUsageError(`unknown command ${JSON.stringify(command)}; see --help`);
    }
  } catch (error) {
    process.stderr.write(`bmaas-agent: ${(error as Error).message}\n`);
    return error instanceof AgentUsageError ? 2 : 1;
  }
}

/** The flags' values, defaults filled in. */
interface Values {
  interval: string;
  service: string;
  root: string;
  efivars: string;
  'install-timeout': string;
  'reboot-command'?: string | undefined;
  'log-file'?: string | undefined;
  'send-log'?: string | undefined;
  foreground: boolean;
  'in-place'?: string | undefined;
  'image-dir'?: string | undefined;
  kexec: string;
  node?: string | undefined;
  'after-pid'?: string | undefined;
  enrollment: string;
  'write-handover'?: string | undefined;
  help: boolean;
}

async function takeoverCommand(argv: readonly string[], values: Values): Promise<number> {
  settingsOf(values); // Refuse bad flags before answering the shepherd.
  const answer = takeover(await readAll(process.stdin));
  if (!answer.ok) {
    await writeOut(answer.response);
    process.stderr.write(`bmaas-agent: ${answer.message}\n`);
    return 1;
  }
  const { init, privateKey } = answer;
  const warnings: string[] = [];
  const staged = await stageImage(values, init, privateKey, warnings);
  if (!staged) warnings.push(IN_PLACE_WARNING);
  // Why the agent runs in place: it refuses installations and wipes, and its hardware report says so.
  const notPossible = 'kexec into the agent image is not possible: ';
  const inPlace = staged
    ? undefined
    : (warnings.find((w) => w.startsWith(notPossible))?.slice(notPossible.length) ??
      'no agent image to kexec into (no --image-dir)');
  await writeOut(takeoverResponse(init, privateKey, warnings));
  // The shepherd's SSH command returns once standard output is closed and this process has exited.
  process.stdout.end();
  const handOver = handOverText(init, privateKey);
  if (values.foreground) {
    return staged ? bootImage(values, handOver, process.ppid) : runWith({ ...values, 'in-place': inPlace }, handOver);
  }
  // On in a process of its own, detached, so that the SSH command returns; the key goes over a
  // pipe, never on a command line.
  const script = process.argv[1] as string;
  const args = argv.filter((_, index) => index !== argv.indexOf('takeover'));
  const command = staged ? ['boot-image', `--after-pid=${process.pid}`] : ['run', `--in-place=${inPlace}`];
  const child = spawn(values.node ?? process.execPath, [script, ...command, ...args], {
    detached: true,
    stdio: ['pipe', 'ignore', 'ignore'],
  });
  await new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.stdin.end(handOver, resolve);
  });
  child.unref();
  return 0;
}

/**
 * Loads the agent image of `--image-dir` with this machine's config (the
 * takeover's init and key, the agent's flags, the captured network) into the
 * running kernel; false, with the reason in `warnings`, where kexec cannot
 * run, so that the agent runs in place instead.
 */
async function stageImage(
  values: Values,
  init: TakeoverInit,
  privateKey: KeyObject,
  warnings: string[],
): Promise<boolean> {
  const dir = values['image-dir'];
  if (dir === undefined) return false;
  const image: KexecImage = {
    kernel: path.join(dir, 'vmlinuz'),
    initramfs: path.join(dir, 'initramfs'),
    kexec: values.kexec,
  };
  const unavailable = await kexecUnavailable(image, values.root);
  if (unavailable !== undefined) {
    warnings.push(`kexec into the agent image is not possible: ${unavailable}`);
    return false;
  }
  const captured = await captureNetwork(values.root);
  for (const warning of captured.warnings) warnings.push(`network configuration: ${warning}`);
  const config = agentConfigArchive({
    init,
    privateKey,
    flags: [
      `--interval=${values.interval}`,
      `--service=${values.service}`,
      `--install-timeout=${values['install-timeout']}`,
    ],
    capturedNetwork: captured.config,
  });
  const commandLine = kexecCommandLine(
    await readFile(path.join(values.root, 'proc/cmdline'), 'utf8').catch(() => undefined),
  );
  try {
    await stageKexec(image, config, commandLine);
    return true;
  } catch (error) {
    if (!(error instanceof KexecError)) throw error;
    warnings.push(`kexec into the agent image is not possible: ${error.message}`);
    return false;
  }
}

async function bootImageCommand(values: Values): Promise<number> {
  const after = Number(values['after-pid']);
  if (!Number.isSafeInteger(after) || after < 1) {
    throw new AgentUsageError(`--after-pid ${JSON.stringify(values['after-pid'])}: want a process ID`);
  }
  return bootImage(values, (await readAll(process.stdin)).toString('utf8'), after);
}

/**
 * Once the takeover's SSH session has ended, kexecs into the loaded agent
 * image (after a sync: kexec -e does not shut the running OS down). If
 * kexec -e returns, the image did not boot: the agent runs in place, so the
 * machine still heartbeats, and the kernel log says why.
 */
async function bootImage(values: Values, handOver: string, after: number): Promise<number> {
  await sessionEnded(after, SESSION_BOUND_MS);
  spawnSync('sync');
  const result = spawnSync(values.kexec, ['-e'], { encoding: 'utf8' });
  const detail = result.error?.message ?? (result.stderr?.trim() || `status ${result.status}`);
  const why = `bmaas-agent: kexec -e returned (${detail}): running the agent in place\n`;
  await appendFile('/dev/kmsg', why).catch(() => {});
  if (values['log-file']) await appendFile(values['log-file'], why).catch(() => {});
  return runWith({ ...values, 'in-place': `kexec -e returned (${detail})` }, handOver);
}

/** In the agent image: sets the captured network up by MAC; prints the interfaces to ask DHCP on. */
async function networkUpCommand(file: string | undefined): Promise<number> {
  if (file === undefined) throw new AgentUsageError('network-up: name the network.json to bring up');
  const config = JSON.parse(await readFile(file, 'utf8')) as NetworkConfig;
  const plan = networkSteps(config, await readNics('/'));
  await bringUpNetwork(plan, (line) => process.stderr.write(`bmaas-agent: ${line}\n`));
  process.stdout.write(plan.dhcp.map((nic) => `${nic}\n`).join(''));
  return 0;
}

function writeOut(bytes: Uint8Array): Promise<void> {
  return new Promise<void>((resolve, reject) =>
    process.stdout.write(bytes, (error) => (error ? reject(error) : resolve())),
  );
}

async function runCommand(values: Values): Promise<number> {
  return runWith(values, (await readAll(process.stdin)).toString('utf8'));
}

/**
 * Enrolls with the token of `--enrollment`, then runs the agent with the key
 * enrolled. A refusal runs `--reboot-command` first, then is thrown (exit 1,
 * the server's message naming the machine and why): asking again would be
 * refused again, and the boot that brought the agent was a one-time
 * override whose media the booter ejects, so the machine boots its disk (an
 * installed machine its OS) rather than sitting in the agent. The token is
 * in no line written.
 */
async function enrollCommand(values: Values): Promise<number> {
  settingsOf(values); // Refuse bad flags before enrolling: the token is good once.
  const file = values.enrollment;
  const enrollment = parseEnrollment(await readFile(file, 'utf8'), file);
  const log = agentLog(values, enrollment.init.machineId);
  const stop = stopSignal();
  let privateKey: KeyObject;
  try {
    privateKey = await enrollAgent(enrollment, {
      root: values.root,
      maxDelayMs: settingsOf(values).intervalMs,
      signal: stop,
      log,
    });
  } catch (error) {
    if (error instanceof EnrollmentRefusedError) {
      const reboot = values['reboot-command'];
      log(`${error.message}; ${reboot ? `rebooting: ${reboot}` : 'no reboot command: stopping'}`);
      if (reboot) await runRebootCommand(reboot, log);
      throw error;
    }
    if (!stop.aborted) throw error;
    log('stopped before enrolling');
    return 0;
  }
  const handOver = handOverText(enrollment.init, privateKey);
  const handOverFile = values['write-handover'];
  if (handOverFile !== undefined) await writeFile(handOverFile, handOver, { mode: 0o600 });
  return runWith(values, handOver, stop);
}

/** One line of the agent's log: to --log-file, else standard error, with the process and the machine. */
function agentLog(values: Values, machineId: string): (line: string) => void {
  const logFile = values['log-file'];
  return (line) => {
    const text = `${new Date().toISOString()} ${process.pid} ${machineId}: ${line}\n`;
    if (logFile) appendFileSync(logFile, text);
    else process.stderr.write(text);
  };
}

/** Aborted by SIGTERM or SIGINT. */
function stopSignal(): AbortSignal {
  const stop = new AbortController();
  for (const signal of ['SIGTERM', 'SIGINT'] as const) process.once(signal, () => stop.abort());
  return stop.signal;
}

async function runWith(values: Values, handOver: string, stop = stopSignal()): Promise<number> {
  const settings = settingsOf(values);
  const { init, privateKey } = JSON.parse(handOver) as { init: string; privateKey: string };
  const parsedInit = fromBinary(TakeoverInitSchema, Buffer.from(init, 'base64'));
  const logFile = values['log-file'];
  const log = agentLog(values, parsedInit.machineId);
  await runAgent({
    init: parsedInit,
    privateKey: createPrivateKey(privateKey),
    ...settings,
    signal: stop,
    log,
    logFile: values['send-log'] ?? logFile,
    inPlace: values['in-place'],
  });
  return 0;
}

function settingsOf(values: Values) {
  const service = values.service;
  if (service !== 'cloud.agent.api' && service !== 'cloud.bmaas.server.api') {
    throw new AgentUsageError(`--service ${JSON.stringify(service)}: want cloud.agent.api or cloud.bmaas.server.api`);
  }
  return {
    intervalMs: duration('--interval', values.interval),
    service: service as AgentService,
    root: values.root,
    efivars: values.efivars,
    installTimeoutMs: duration('--install-timeout', values['install-timeout']),
    rebootCommand: values['reboot-command'],
  };
}

/** A duration flag (500ms, 2s, 1m, 1h) in milliseconds. */
function duration(flag: string, text: string): number {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(text.trim());
  if (!match) throw new AgentUsageError(`${flag} ${JSON.stringify(text)}: want a duration such as 500ms, 30s, 15m`);
  const ms = Number(match[1]) * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[match[2] as 'ms' | 's' | 'm' | 'h'];
  if (ms <= 0) throw new AgentUsageError(`${flag} ${JSON.stringify(text)}: want more than nothing`);
  return ms;
}

async function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(Buffer.from(chunk as Buffer));
  return Buffer.concat(chunks);
}
