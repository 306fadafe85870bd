import { spawn } from 'node:child_process';
import { createPrivateKey } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { fromBinary } from '@bufbuild/protobuf';
import { runAgent } from './agent.js';
import type { AgentService } from './callback/heartbeat-client.js';
import { TakeoverInitSchema } from './gen/cloud/agent/api/takeover_pb.js';
import { readHardware } from './hardware/inventory.js';
import { handOverText } from './image/config.js';
import { takeover } from './takeover.js';

const USAGE = `Usage: bmaas-agent <command> [flags]

The BMaaS agent. Commands:
  takeover   Read a TakeoverInit on standard input, answer with a TakeoverResponse on
             standard output (the agent's new ed25519 key), then run the agent detached
             (as the shepherd's initializer starts it over SSH). With --foreground, run
             it in this process instead, after closing standard output.
  run        Run the agent with the settings "takeover" hands it on standard input
             (JSON: the init and the key). Not for people.
  report     Print this machine's hardware inventory as JSON.

Flags:
  --interval <duration>        Between heartbeats (500ms, 30s, 1m). Default 30s.
  --service <package>          cloud.agent.api (default) or cloud.bmaas.server.api.
  --root <dir>                 Where sysfs, procfs and /dev are. Default /.
  --efivars <dir>              efivarfs, for the boot entry. Default /sys/firmware/efi/efivars.
  --install-timeout <duration> The bound of one installation. Default 15m.
  --reboot-command <command>   Run with sh -c after a successful installation was reported
                               (reboot -f). Default: none; the agent stops instead.
  --log-file <file>            Append the agent's log lines there (else standard error).
  --foreground                 takeover: run the agent in this process.
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
  foreground: { type: 'boolean', default: false },
  help: { type: 'boolean', default: false },
} as const;

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
  foreground: boolean;
  help: boolean;
}

async function takeoverCommand(argv: readonly string[], values: Values): Promise<number> {
  settingsOf(values); // Refuse bad flags before answering the shepherd.
  const answer = takeover(await readAll(process.stdin));
  await new Promise<void>((resolve, reject) =>
    process.stdout.write(answer.response, (error) => (error ? reject(error) : resolve())),
  );
  if (!answer.ok) {
    process.stderr.write(`bmaas-agent: ${answer.message}\n`);
    return 1;
  }
  const handOver = handOverText(answer.init, answer.privateKey);
  if (values.foreground) {
    process.stdout.end();
    return runWith(values, handOver);
  }
  // The agent runs on in a process of its own, detached, so that the SSH command returns;
  // its key goes over a pipe, never on a command line.
  const script = process.argv[1] as string;
  const args = argv.filter((_, index) => index !== argv.indexOf('takeover'));
  const child = spawn(process.execPath, [script, 'run', ...args], {
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

async function runCommand(values: Values): Promise<number> {
  return runWith(values, (await readAll(process.stdin)).toString('utf8'));
}

async function runWith(values: Values, handOver: string): Promise<number> {
  const settings = settingsOf(values);
  const { init, privateKey } = JSON.parse(handOver) as { init: string; privateKey: string };
  const parsedInit = fromBinary(TakeoverInitSchema, Buffer.from(init, 'base64'));
  const logFile = values['log-file'];
  const log = (line: string) => {
    const text = `${new Date().toISOString()} ${process.pid} ${parsedInit.machineId}: ${line}\n`;
    if (logFile) appendFileSync(logFile, text);
    else process.stderr.write(text);
  };
  const stop = new AbortController();
  for (const signal of ['SIGTERM', 'SIGINT'] as const) process.once(signal, () => stop.abort());
  await runAgent({
    init: parsedInit,
    privateKey: createPrivateKey(privateKey),
    ...settings,
    signal: stop.signal,
    log,
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
