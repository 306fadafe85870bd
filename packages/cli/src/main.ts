/**
 * The `shepherd` command.
 *
 * @packageDocumentation
 */

import yargs, { type Argv as Yargs } from 'yargs';
import { migrate } from './commands/migrate.js';
import { type ProviderKind, run } from './commands/run.js';
import { sshKey } from './commands/ssh-key.js';
import { status } from './commands/status.js';
import { web } from './commands/web.js';
import { FLAG_GROUPS, type FlagGroup, flagNames, flagOptions } from './flags.js';
import { enableLogs } from './logging.js';
import { UsageError } from './settings.js';
import { VERSION } from './version.js';

/** Exit statuses: 0 done, 1 failed at run time, 2 bad input (nothing was touched). */
export const EXIT = { ok: 0, failed: 1, usage: 2 } as const;

interface Io {
  readonly stdout: (text: string) => void;
  readonly stderr: (text: string) => void;
}

const PROVIDERS: readonly string[] = ['dummy', 'equinix'] satisfies ProviderKind[];

/**
 * Runs the CLI on `args` (without `node` and the script) and resolves with
 * the exit status. Never calls `process.exit` itself, except on a second stop
 * signal during `run`.
 */
export async function main(
  args: readonly string[],
  io: Io = { stdout: (t) => process.stdout.write(t), stderr: (t) => process.stderr.write(t) },
): Promise<number> {
  let exitCode: number = EXIT.ok;
  const fail = (error: unknown) => {
    if (error instanceof UsageError) {
      io.stderr(`shepherd: ${error.message}\n`);
      exitCode = EXIT.usage;
    } else {
      io.stderr(`shepherd: ${error instanceof Error ? error.message : String(error)}\n`);
      exitCode = EXIT.failed;
    }
  };

  const command = commandOf(args);
  const provider = command === 'run' ? args.filter((arg) => !arg.startsWith('-'))[1] : undefined;
  if (provider !== undefined && !PROVIDERS.includes(provider)) {
    io.stderr(`shepherd: run: unknown provider ${JSON.stringify(provider)}: want ${PROVIDERS.join(' or ')}\n`);
    return EXIT.usage;
  }
  const unknown = unknownFlag(args);
  if (unknown) {
    const hint = unknown.startsWith('--') ? '' : ' (a value starting with "-" is written --flag=value)';
    io.stderr(
      `shepherd: ${unknown}: unknown flag${commandOf(args) ? ` for ${commandOf(args)}` : ''}; see --help${hint}\n`,
    );
    return EXIT.usage;
  }

  const cli: Yargs = yargs([...args])
    .scriptName('shepherd')
    .usage(
      '$0 <command> [flags]\n\nKeeps a fleet of bare-metal servers in step with the BMDB: brings machines in from a provider, starts the agent on each over SSH, and reboots those whose agent went silent.',
    )
    .env('SHEPHERD')
    .strict()
    .version(VERSION)
    .help()
    .alias('help', 'h')
    .wrap(Math.min(120, process.stdout.columns ?? 120))
    .epilogue(
      'Every flag can also be set in the environment as SHEPHERD_<FLAG>, e.g. SHEPHERD_BMDB_URL or SHEPHERD_EQUINIX_API_KEY. Logs go to stderr; DEBUG narrows or widens them (default shepherd:*,bmdb:*).',
    )
    .command(
      'run <provider>',
      'Run the provisioner, initializer and recoverer (and the provider’s own loop) until SIGINT/SIGTERM',
      (y) =>
        y
          .positional('provider', { describe: 'Where machines come from', choices: ['dummy', 'equinix'] as const })
          .options(flagOptions(...FLAG_GROUPS))
          .strict(),
      async (argv) => {
        enableLogs();
        await run(argv, argv.provider as ProviderKind);
      },
    )
    .command(
      'migrate',
      'Bring the BMDB schema up to date (run does this too)',
      (y) => y.options(flagOptions('database')).strict(),
      async (argv) => {
        enableLogs();
        await migrate(argv, io.stdout);
      },
    )
    .command(
      'status',
      'The fleet at a glance: machines per lifecycle stage, active work, backoffs with causes',
      (y) =>
        y
          .options(flagOptions('database'))
          .option('json', { type: 'boolean', default: false, describe: 'Print JSON, for scripts' })
          .strict(),
      (argv) => status(argv, io.stdout),
    )
    .command(
      'ssh-key',
      'Print the shepherd’s SSH public key (authorized_keys form), generating the key if missing',
      (y) =>
        y
          .options(flagOptions('database'))
          .options(pick(flagOptions('ssh'), 'ssh-key-path'))
          .strict(),
      (argv) => sshKey(argv, io.stdout),
    )
    .command(
      'web',
      'Serve the read-only fleet page (machines, work, backoffs, each machine’s story) until SIGINT/SIGTERM',
      (y) =>
        y
          .options(flagOptions('database', 'web'))
          .options(pick(flagOptions('recoverer'), ...WEB_RECOVERER_FLAGS))
          .strict(),
      async (argv) => {
        enableLogs();
        await web(argv, io.stdout);
      },
    )
    .demandCommand(1, 'Say which command to run: run, migrate, status, ssh-key or web (see --help)')
    .fail((message, error) => {
      // Our handlers' errors and yargs' own validation (unknown flag, missing command) end here.
      if (error) fail(error);
      else {
        io.stderr(`shepherd: ${message}; see --help\n`);
        exitCode = EXIT.usage;
      }
    })
    .exitProcess(false);

  try {
    await cli.parseAsync();
  } catch (error) {
    if (exitCode === EXIT.ok) fail(error);
  }
  return exitCode;
}

const COMMAND_GROUPS: Record<string, FlagGroup[]> = {
  run: FLAG_GROUPS,
  migrate: ['database'],
  status: ['database'],
  'ssh-key': ['database'],
  web: ['database', 'web'],
};
/** The recoverer's thresholds decide who is awaiting recovery on the page too. */
const WEB_RECOVERER_FLAGS = ['recoverer-first-heartbeat-timeout', 'recoverer-heartbeat-timeout'];
const COMMAND_FLAGS: Record<string, string[]> = {
  status: ['json'],
  'ssh-key': ['ssh-key-path'],
  web: WEB_RECOVERER_FLAGS,
};
const GLOBAL_FLAGS = ['help', 'version'];

function commandOf(args: readonly string[]): string | undefined {
  return args.find((arg) => !arg.startsWith('-'));
}

/**
 * The first flag on the command line that its command does not know. yargs'
 * strict mode reports these only after the command ran; bad input must stop
 * a command before it touches anything.
 */
function unknownFlag(args: readonly string[]): string | undefined {
  const command = commandOf(args);
  const groups = command === undefined ? [] : (COMMAND_GROUPS[command] ?? []);
  const known = new Set([
    ...GLOBAL_FLAGS,
    ...groups.flatMap((group) => flagNames(group)),
    ...(command === undefined ? [] : (COMMAND_FLAGS[command] ?? [])),
  ]);
  for (const arg of args) {
    if (arg === '--') break;
    if (!arg.startsWith('-') || arg === '-') continue;
    // Single-dash: -h is --help, a negative number a flag's value; yargs would take anything
    // else as short flags and leave the flag before it at its default (`--x -1s`).
    if (!arg.startsWith('--')) {
      if (arg === '-h' || /^-\d+(\.\d+)?$/.test(arg)) continue;
      return arg;
    }
    const name = arg.slice(2).split('=')[0] ?? '';
    if (!known.has(name) && !(name.startsWith('no-') && known.has(name.slice(3)))) return `--${name}`;
  }
  return undefined;
}

function pick<T>(record: Record<string, T>, ...keys: string[]): Record<string, T> {
  return Object.fromEntries(keys.flatMap((key) => (key in record ? [[key, record[key] as T]] : [])));
}
