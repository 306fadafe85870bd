/**
 * The `shepherd` command.
 *
 * @packageDocumentation
 */

import { describeError } from '@bmaas/common';
import yargs, { type Options, type Argv as Yargs } from 'yargs';
import { AGENT_IMAGE_ACTIONS, agentImage } from './commands/agent-image.js';
import { decommission } from './commands/decommission.js';
import { hold, unhold } from './commands/hold.js';
import { install } from './commands/install.js';
import { migrate } from './commands/migrate.js';
import { POWER_COMMANDS, type PowerCommand, power, powerCommand } from './commands/power.js';
import { recommission } from './commands/recommission.js';
import { type ProviderKind, run } from './commands/run.js';
import { server } from './commands/server.js';
import { sshKey } from './commands/ssh-key.js';
import { status } from './commands/status.js';
import { web } from './commands/web.js';
import {
  allFlagNames,
  commandOption,
  FLAG_GROUPS,
  type Flag,
  type FlagGroup,
  flagNames,
  flagOptions,
  isArrayFlag,
  isBooleanFlag,
  namedFlagOptions,
  SERVER_GROUPS,
} from './flags.js';
import { DEFAULT_LOG_NAMESPACES, enableLogs as enableLogsFrom } from './logging.js';
import { envName, UsageError } from './settings.js';
import { VERSION } from './version.js';

/** Exit statuses: 0 done, 1 failed at run time, 2 bad input (nothing was touched). */
export const EXIT = { ok: 0, failed: 1, usage: 2 } as const;

interface Io {
  readonly stdout: (text: string) => void;
  readonly stderr: (text: string) => void;
}

export interface MainOptions {
  readonly io?: Io;
  /**
   * `DEBUG` as the process was started with it. The `debug` package deletes
   * an empty `DEBUG` from the environment when it loads, and empty means "no
   * logs" here, so the executable reads it before loading anything.
   */
  readonly debug?: string | undefined;
}

const PROVIDERS: readonly string[] = ['dummy', 'equinix', 'static'] satisfies ProviderKind[];
const PROVIDER_LIST = `${PROVIDERS.slice(0, -1).join(', ')} or ${PROVIDERS.at(-1)}`;
const POWER_LIST = `${POWER_COMMANDS.slice(0, -1).join(', ')} or ${POWER_COMMANDS.at(-1)}`;

/**
 * Runs the CLI on `args` (without `node` and the script) and resolves with
 * the exit status. Never calls `process.exit` itself, except on a second stop
 * signal during `run`.
 */
export async function main(args: readonly string[], options: MainOptions = {}): Promise<number> {
  const io = options.io ?? { stdout: (t) => process.stdout.write(t), stderr: (t) => process.stderr.write(t) };
  const debug = 'debug' in options ? options.debug : process.env.DEBUG;
  for (const variable of unknownVariables(process.env)) {
    io.stderr(`shepherd: warning: ${variable} is set, but no shepherd command has such a flag; ignored\n`);
  }
  const refusal = commandLineRefusal(args);
  if (refusal !== undefined) {
    io.stderr(`shepherd: ${refusal}\n`);
    return EXIT.usage;
  }

  let exitCode: number = EXIT.ok;
  const fail = (error: unknown) => {
    if (error instanceof UsageError) {
      io.stderr(`shepherd: ${error.message}\n`);
      exitCode = EXIT.usage;
    } else {
      io.stderr(`shepherd: ${describeError(error)}\n`);
      exitCode = EXIT.failed;
    }
  };
  const cli = withCommands(parserOf(args), { io, enableLogs: () => enableLogsFrom(debug) })
    .demandCommand(
      1,
      'say which command to run: run, migrate, status, ssh-key, server, decommission, recommission, hold, unhold, install, power, web or agent-image',
    )
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

/**
 * Why the command line is refused before yargs reads it (a missing or
 * unknown provider, power command or agent-image command, an unknown flag,
 * an extra word), as the line after `shepherd: `; undefined when it is not.
 */
function commandLineRefusal(args: readonly string[]): string | undefined {
  const command = commandOf(args);
  const words = positionals(args);
  const wantsHelp = args.some((arg) => arg === '--help' || arg === '-h' || arg === '--version');
  const provider = command === 'run' ? words[1] : undefined;
  if (command === 'run' && provider === undefined && !wantsHelp) {
    return `run: say which provider: ${PROVIDER_LIST} (e.g. shepherd run dummy)`;
  }
  if (provider !== undefined && !PROVIDERS.includes(provider)) {
    return `run: unknown provider ${JSON.stringify(provider)}: want ${PROVIDER_LIST}`;
  }
  const powerWord = command === 'power' ? words[1] : undefined;
  if (command === 'power' && powerCommand(powerWord) === undefined && !wantsHelp) {
    return powerWord === undefined
      ? `power: say what to do: ${POWER_LIST} (e.g. shepherd power status --provider Static --provider-id node1)`
      : `power: unknown command ${JSON.stringify(powerWord)}: want ${POWER_LIST}`;
  }
  const imageAction = command === 'agent-image' ? words[1] : undefined;
  if (command === 'agent-image' && !wantsHelp && !AGENT_IMAGE_ACTIONS.some((action) => action === imageAction)) {
    return imageAction === undefined
      ? 'agent-image: say what to do: build (e.g. shepherd agent-image build --out dist/agent-image)'
      : `agent-image: unknown command ${JSON.stringify(imageAction)}: want build`;
  }
  const unknown = unknownFlag(args);
  if (unknown) {
    const hint = unknown.startsWith('--') ? '' : ' (a value starting with "-" is written --flag=value)';
    return `${unknown}: unknown flag${command ? ` for ${command}` : ''}; see --help${hint}`;
  }
  const extra = command === undefined ? undefined : extraArgument(command, words);
  if (extra !== undefined) return `${command}: unexpected argument ${JSON.stringify(extra)}; see --help`;
  return undefined;
}

/** The parser of `args`, before its commands: usage, help, version, the environment epilogue. */
function parserOf(args: readonly string[]): Yargs {
  const parser = yargs([...args]) as Yargs & UsageConfigurable;
  // Each flag's description carries its type and default (flags.ts).
  parser.usageConfiguration({ 'hide-types': true });
  return parser
    .scriptName('shepherd')
    .usage(
      '$0 <command> [flags]\n\nKeeps a fleet of bare-metal servers in step with the BMDB: brings machines in from a provider, starts the agent on each over SSH, and reboots those whose agent went silent.',
    )
    .strict()
    .version(VERSION)
    .help()
    .alias('help', 'h')
    .wrap(Math.min(120, process.stdout.columns ?? 120))
    .epilogue(
      `Every flag can also be set in the environment as SHEPHERD_<FLAG>, e.g. SHEPHERD_BMDB_URL or SHEPHERD_EQUINIX_API_KEY; each command takes the variables of its own flags. Logs go to stderr; DEBUG narrows or widens them (default ${DEFAULT_LOG_NAMESPACES}), DEBUG= turns them off.`,
    );
}

/** What the commands' handlers need of `main`: where they write, and the logs turned on. */
interface CommandContext {
  readonly io: Io;
  readonly enableLogs: () => void;
}

/** Every command, in the order `--help` lists them. */
function withCommands(cli: Yargs, context: CommandContext): Yargs {
  return withTools(withMachineCommands(withFleetCommands(cli, context), context), context);
}

/** The commands that run the shepherd or read and shape the BMDB as a whole. */
function withFleetCommands(cli: Yargs, { io, enableLogs }: CommandContext): Yargs {
  return cli
    .command(
      'run <provider>',
      'Run the provisioner, initializer and recoverer (and the provider’s own loop) until SIGINT/SIGTERM',
      (y) =>
        y
          .positional('provider', {
            describe: `Where machines come from: ${PROVIDER_LIST}`,
            choices: PROVIDERS,
          })
          .options(optionsOf('run'))
          .strict(),
      async (argv) => {
        enableLogs();
        await run(argv, argv.provider as ProviderKind);
      },
    )
    .command(
      'migrate',
      'Bring the BMDB schema up to date (run does this too)',
      (y) => y.options(optionsOf('migrate')).strict(),
      async (argv) => {
        enableLogs();
        await migrate(argv, io.stdout);
      },
    )
    .command(
      'status',
      'The fleet at a glance: machines per lifecycle stage, active work, backoffs with causes, retired machines',
      (y) => y.options(optionsOf('status')).strict(),
      (argv) => status(argv, io.stdout),
    )
    .command(
      'ssh-key',
      'Print the shepherd’s SSH public key (authorized_keys form), generating the key if missing',
      (y) => y.options(optionsOf('ssh-key')).strict(),
      (argv) => sshKey(argv, io.stdout),
    )
    .command(
      'server',
      'Run the BMaaS server agents heartbeat to (gRPC AgentCallback over TLS) until SIGINT/SIGTERM',
      (y) => y.options(optionsOf('server')).strict(),
      async (argv) => {
        enableLogs();
        await server(argv, io.stdout);
      },
    );
}

/** The operator's commands on machines named by provider ID (or machine ID). */
function withMachineCommands(cli: Yargs, { io, enableLogs }: CommandContext): Yargs {
  return cli
    .command(
      'decommission',
      'Remove machines from the BMDB and retire them, so that the provisioner does not bring them back while their provider lists them (refused for machines with live work; their history stays); with --wipe, wipe their disks first',
      (y) => y.options(optionsOf('decommission')).strict(),
      async (argv) => {
        enableLogs();
        await decommission(argv, io.stdout);
      },
    )
    .command(
      'recommission',
      'Bring retired (decommissioned) machines back: the provisioner brings each in again as a new machine while its provider lists it',
      (y) => y.options(optionsOf('recommission')).strict(),
      async (argv) => {
        enableLogs();
        await recommission(argv, io.stdout);
      },
    )
    .command(
      'hold',
      'Hold machines an operator is working on: no loop claims them until unhold (work running ends on its own)',
      (y) => y.options(optionsOf('hold')).strict(),
      async (argv) => {
        enableLogs();
        await hold(argv, io.stdout);
      },
    )
    .command(
      'unhold',
      'Release machines’ holds: the loops take them up again',
      (y) => y.options(optionsOf('unhold')).strict(),
      async (argv) => {
        enableLogs();
        await unhold(argv, io.stdout);
      },
    )
    .command(
      'install',
      'Request an OS installation of machines (a disk image their agent writes), or withdraw one with --cancel (recorded in their history)',
      (y) => y.options(optionsOf('install')).strict(),
      async (argv) => {
        enableLogs();
        await install(argv, io.stdout);
      },
    )
    .command(
      'power <command>',
      'Read machines’ power state, or power them on, off or cycle them through their provider (recorded in their history)',
      (y) =>
        y
          .positional('command', {
            describe: `status: read and record the power state; on, off (--graceful: ask the OS), cycle: power actions (need --reason; off holds the machine)`,
            choices: POWER_COMMANDS,
          })
          .options(optionsOf('power'))
          .strict(),
      async (argv) => {
        enableLogs();
        await power(argv, argv.command as PowerCommand, io.stdout);
      },
    );
}

/** The agent image's build and the fleet page. */
function withTools(cli: Yargs, { io, enableLogs }: CommandContext): Yargs {
  return cli
    .command(
      'agent-image <command>',
      'Build the agent environment (kernel, initramfs, an ISO booting under BIOS and UEFI) from this machine’s Debian packages',
      (y) =>
        y
          .positional('command', {
            describe: 'build: write vmlinuz, initramfs and agent.iso into --out',
            choices: AGENT_IMAGE_ACTIONS,
          })
          .options(optionsOf('agent-image'))
          .strict(),
      async (argv) => {
        enableLogs();
        await agentImage(argv, io.stdout);
      },
    )
    .command(
      'web',
      'Serve the read-only fleet page (machines, work, backoffs, each machine’s story) until SIGINT/SIGTERM',
      (y) => y.options(optionsOf('web')).strict(),
      async (argv) => {
        enableLogs();
        await web(argv, io.stdout);
      },
    );
}

/** How many words each command takes after its name (`run dummy`); yargs' strict mode would find more only after the command ran. */
const COMMAND_ARGUMENTS: Record<string, number> = {
  run: 1,
  migrate: 0,
  status: 0,
  'ssh-key': 0,
  server: 0,
  web: 0,
  decommission: 0,
  recommission: 0,
  hold: 0,
  unhold: 0,
  install: 0,
  power: 1,
  'agent-image': 1,
};

/** The first word after a command beyond those it takes; commands not in the table are left to yargs. */
function extraArgument(command: string, words: readonly string[]): string | undefined {
  const taken = COMMAND_ARGUMENTS[command];
  return taken === undefined ? undefined : words[1 + taken];
}

/** yargs 18 has it; its types (@types/yargs 17) do not yet. */
interface UsageConfigurable {
  usageConfiguration(config: { 'hide-types'?: boolean }): unknown;
}

/** Options of commands beyond the flags table, with their help. */
const COMMAND_OPTIONS: Record<string, Flag> = {
  json: { describe: 'Print JSON, for scripts', boolean: true },
};

/** Each command's flags: whole groups of the table, and single flags (of the table or COMMAND_OPTIONS). */
const COMMAND_GROUPS: Record<string, FlagGroup[]> = {
  run: FLAG_GROUPS,
  migrate: ['database'],
  status: ['database'],
  server: SERVER_GROUPS,
  decommission: ['database', 'decommission'],
  recommission: ['database', 'decommission'],
  web: ['database', 'observability', 'web'],
  hold: ['database', 'decommission'],
  unhold: ['database', 'decommission'],
  install: ['database', 'decommission', 'install'],
  // The provider's own flags, as `run <provider>` takes them: one environment serves both.
  power: ['database', 'decommission', 'dummy', 'equinix', 'static'],
  'agent-image': ['agent-image'],
};
/** The recoverer's thresholds decide who is awaiting recovery on the page too. */
const WEB_RECOVERER_FLAGS = ['recoverer-first-heartbeat-timeout', 'recoverer-heartbeat-timeout'];
const COMMAND_FLAGS: Record<string, string[]> = {
  hold: ['machine-id', 'reason', 'actor', 'json'],
  unhold: ['machine-id', 'reason', 'actor'],
  install: ['machine-id', 'reason', 'actor', 'inventory'],
  decommission: ['wipe', 'wipe-timeout', 'reason', 'actor'],
  recommission: ['reason', 'actor'],
  power: ['reason', 'actor', 'graceful'],
  status: ['json'],
  'ssh-key': ['data-dir', 'ssh-key-path'],
  server: WEB_RECOVERER_FLAGS,
  web: WEB_RECOVERER_FLAGS,
};
const GLOBAL_FLAGS = ['help', 'version'];

/** The yargs options of a command, from the tables above. */
function optionsOf(command: string): Record<string, Options> {
  const names = COMMAND_FLAGS[command] ?? [];
  const options: Record<string, Options> = {
    ...flagOptions(...(COMMAND_GROUPS[command] ?? [])),
    ...namedFlagOptions(...names.filter((name) => !(name in COMMAND_OPTIONS))),
  };
  for (const name of names) {
    const extra = COMMAND_OPTIONS[name];
    if (extra) Object.assign(options, commandOption(name, extra));
  }
  return options;
}

/**
 * `SHEPHERD_*` variables that are no flag of any command: probably a typo,
 * worth a word, but not worth refusing to work over (another tool may share
 * the prefix). Variables of other commands' flags are silently left to them.
 */
function unknownVariables(environment: NodeJS.ProcessEnv): string[] {
  const known = new Set([...allFlagNames(), ...Object.keys(COMMAND_OPTIONS)].map(envName));
  return Object.keys(environment)
    .filter((name) => name.startsWith('SHEPHERD_') && !known.has(name))
    .sort();
}

function commandOf(args: readonly string[]): string | undefined {
  return positionals(args)[0];
}

/** The words of the command line that are no flag and no flag's value (`run dummy` of `run --data-dir d dummy`). */
function positionals(args: readonly string[]): string[] {
  const words: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? '';
    if (arg === '--') return [...words, ...args.slice(i + 1)];
    if (!arg.startsWith('-') || arg === '-') words.push(arg);
    else if (arg.startsWith('--') && !arg.includes('=') && isArrayFlag(arg.slice(2))) {
      // Its values run to the next flag, as yargs reads them.
      while (i + 1 < args.length && !(args[i + 1] ?? '').startsWith('-')) i++;
    } else if (arg.startsWith('--') && !arg.includes('=') && takesValue(arg.slice(2))) i++;
  }
  return words;
}

function takesValue(name: string): boolean {
  if (GLOBAL_FLAGS.includes(name) || name.startsWith('no-')) return false;
  return !(isBooleanFlag(name) || COMMAND_OPTIONS[name]?.boolean === true);
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
