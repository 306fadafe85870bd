import type { Options } from 'yargs';
import { envName, UsageError } from './settings.js';

/**
 * Every flag of the shepherd, in kebab case after the original's, grouped as
 * `--help` shows them. Each is also read from the environment as
 * `SHEPHERD_<NAME>` (`--agent-ssh-port` ← `SHEPHERD_AGENT_SSH_PORT`).
 *
 * Values are read as strings and parsed by settings.ts, so a bad one is
 * reported with the flag's name and the syntax it wants.
 */
export interface Flag {
  readonly describe: string;
  readonly default?: string;
  readonly boolean?: true;
  /** What --help says the value is; `string` when unset. Values are strings to the parser either way. */
  readonly kind?: 'number' | 'duration' | 'rate' | 'path';
  /** Takes several values (`--flag a b`, `--flag a --flag b`, or comma-separated). */
  readonly array?: true;
  /** Shown in --help instead of a default computed at run time. */
  readonly defaultDescription?: string;
  /** Never shown or logged: no default, and the help says so. */
  readonly secret?: true;
}

const flags = {
  database: {
    'bmdb-url': {
      describe:
        'PostgreSQL URL of the BMDB (postgres://user:pass@host:5432/db); without it, an embedded PostgreSQL keeps its data under --data-dir',
    },
    'data-dir': {
      kind: 'path',
      describe: 'Directory of the embedded PostgreSQL (and the default SSH key)',
      default: './.shepherd',
    },
    'component-name': { describe: 'Name recorded with this process’s BMDB sessions', default: 'shepherd' },
    'bmdb-session-interval': {
      kind: 'duration',
      describe:
        'How long a BMDB session lives without a heartbeat (whole seconds); a crashed shepherd’s machines are free again after it',
      default: '5s',
    },
  },
  observability: {
    'metrics-listen': {
      describe:
        'host:port to serve Prometheus metrics at /metrics (e.g. 127.0.0.1:9090); off when unset. With it, this process may be the one reading the fleet gauges (bmdb_fleet_*)',
    },
    'fleet-metrics-interval': {
      kind: 'duration',
      describe:
        'How often the fleet gauges are read from the BMDB, by one of the processes serving metrics at a time (at least 1s)',
      default: '30s',
    },
  },
  ssh: {
    'ssh-key-path': {
      kind: 'path',
      describe:
        'The shepherd’s ed25519 SSH key (OpenSSH format, or the original’s raw 64 bytes); generated there when missing',
      defaultDescription: '<data-dir>/ssh_key',
    },
    'agent-ssh-user': { describe: 'User the shepherd logs in to machines as', default: 'root' },
    'agent-ssh-port': { kind: 'number', describe: 'SSH port of the machines', default: '22' },
    'agent-ssh-connect-timeout': {
      kind: 'duration',
      describe: 'Time to connect and authenticate over SSH',
      default: '2s',
    },
    'agent-ssh-exec-timeout': {
      kind: 'duration',
      describe: 'Time to upload and run the agent once connected',
      default: '60s',
    },
  },
  agent: {
    'agent-executable-path': {
      kind: 'path',
      describe:
        'The agent executable uploaded to machines taken over through SSH (required for equinix, and for static when its inventory has a machine with agentBoot ssh; dummy: the bundled test agent)',
    },
    'agent-target-path': {
      describe: 'Where the agent is uploaded to and run from on machines',
      default: '/root/agent',
    },
    'agent-endpoint': { describe: 'Address of the BMaaS endpoint the agent connects to (required for equinix)' },
    'agent-endpoint-ca-certificate-path': {
      kind: 'path',
      describe: 'PEM CA certificate of the endpoint, passed to the agent (DER); unset: the agent trusts system CAs',
    },
  },
  provisioner: {
    'provisioner-max-machines': {
      kind: 'number',
      describe: 'Most machines to bring into the BMDB; 0 for no limit',
      default: '50',
    },
    'provisioner-reconciler-rate': {
      kind: 'rate',
      describe: 'Rate of reconciliation passes (duration,count)',
      default: '1m,1',
    },
    'provisioner-device-creation-rate': {
      kind: 'rate',
      describe: 'Rate of machine creation (duration,count)',
      default: '5s,1',
    },
    'provisioner-reservation-chunk-size': {
      kind: 'number',
      describe: 'Most machines created in one pass',
      default: '20',
    },
  },
  initializer: {
    'initializer-db-query-rate': {
      kind: 'rate',
      describe: 'Rate of BMDB queries for agent starts (duration,count)',
      default: '250ms,8',
    },
    'initializer-loop-parallelism': { kind: 'number', describe: 'Agent starts run in parallel', default: '1' },
  },
  recoverer: {
    'recoverer-db-query-rate': {
      kind: 'rate',
      describe: 'Rate of BMDB queries for recoveries (duration,count)',
      default: '250ms,8',
    },
    'recoverer-loop-parallelism': { kind: 'number', describe: 'Recoveries run in parallel', default: '1' },
    'recoverer-first-heartbeat-timeout': {
      kind: 'duration',
      describe: 'Reboot a machine whose agent sent no heartbeat this long after it started',
      default: '30m',
    },
    'recoverer-heartbeat-timeout': {
      kind: 'duration',
      describe: 'Reboot a machine whose agent’s last heartbeat is this old',
      default: '10m',
    },
    'recoverer-installing-heartbeat-timeout': {
      kind: 'duration',
      describe:
        'Reboot a machine installing an OS (request delivered, not reported) only when its last heartbeat is this old',
      default: '1h',
    },
  },
  equinix: {
    'equinix-api-url': { describe: 'Equinix Metal API base URL', default: 'https://api.equinix.com/metal/v1' },
    'equinix-project-id': { describe: 'Equinix Metal project ID' },
    'equinix-api-username': { describe: 'Equinix Metal API user name (sent as X-Consumer-Token)' },
    'equinix-api-key': { describe: 'Equinix Metal API key (secret: prefer SHEPHERD_EQUINIX_API_KEY)', secret: true },
    'equinix-ssh-key-label': { describe: 'Label of the shepherd’s key among the project’s SSH keys' },
    'equinix-device-prefix': { describe: 'Hostname prefix of the shepherd’s devices; unique per shepherd' },
    'equinix-os': { describe: 'Operating system of new devices', default: 'ubuntu_22_04' },
    'equinix-use-project-keys': { describe: 'Install every project SSH key on new devices', boolean: true },
    'equinix-reboot-wait': {
      kind: 'duration',
      describe: 'Wait after a reboot request before the machine counts as rebooted',
      default: '30s',
    },
    'equinix-reservation-cache-timeout': {
      kind: 'duration',
      describe: 'How long a listing of hardware reservations is reused',
      default: '15m',
    },
  },
  dummy: {
    'dummy-capacity': { kind: 'number', describe: 'Machines the dummy provider can hand out', default: '20' },
    'dummy-agent-failure-rate': { kind: 'number', describe: 'Share (0-1) of agent starts that fail', default: '0.1' },
    'dummy-heartbeat-failure-rate': {
      kind: 'number',
      describe: 'Share (0-1) of started agents that never heartbeat',
      default: '0.1',
    },
    'dummy-heartbeat-interval': {
      kind: 'duration',
      describe: 'Interval of the fake agents’ heartbeats',
      default: '10s',
    },
    'dummy-agent-start-duration': {
      kind: 'duration',
      describe: 'How long each fake agent start takes before it answers (0s: at once)',
      default: '0s',
    },
    'dummy-agent-start-log': {
      kind: 'path',
      describe:
        'Append one JSON line to this file as each fake agent start begins and ends (machine, address, pid, time); off when unset',
    },
  },
  server: {
    listen: {
      describe: 'host:port the BMaaS server takes agents’ heartbeats on (gRPC over TLS)',
      default: '0.0.0.0:8443',
    },
    'tls-cert': {
      describe:
        'PEM certificate of the BMaaS server (with --tls-key); unset: a self-signed one made once as <data-dir>/server.crt, for agents to trust',
    },
    'tls-key': { describe: 'PEM private key of --tls-cert' },
    workers: {
      kind: 'number',
      describe:
        'Processes taking heartbeats, sharing the listen socket, each batching its own (1: one process; set it to the cores the server may use)',
      default: '1',
    },
    'max-connections': {
      kind: 'number',
      describe:
        'Connections open at once (of each worker; each a file descriptor); past it a new one is closed as it is accepted',
      default: '20000',
    },
    'max-streams-per-connection': {
      kind: 'number',
      describe: 'Requests one agent connection may have open at once (HTTP/2 streams; the client is told, and waits)',
      default: '100',
    },
    'max-buffered-bytes-per-connection': {
      describe:
        'Bytes of requests not yet answered one connection may make the server hold (e.g. 16MiB); the request that would pass it is cut off',
      default: '16MiB',
    },
    'max-buffered-bytes': {
      describe:
        'Bytes of requests not yet answered all connections together (of each worker) may make the server hold (e.g. 256MiB); the request that would pass it is cut off',
      default: '256MiB',
    },
    'request-timeout': {
      kind: 'duration',
      describe: 'How long a request may take from its headers to its answer; one slower is cut off',
      default: '30s',
    },
    'idle-timeout': {
      kind: 'duration',
      describe:
        'How long a connection may go without a new request (HTTP/2) or a byte (HTTP/1.1) before it is closed (agents connect again)',
      default: '5m',
    },
  },
  static: {
    inventory: {
      describe:
        'The machines: a JSON file or an http(s):// URL, read again on every reconciliation pass (see the README for its format)',
    },
    'redfish-username': { describe: 'BMC user name for machines whose inventory entry gives none' },
    'redfish-password-file': {
      describe:
        'File holding the BMC password for machines whose inventory entry gives none (mode 0600; read at each BMC request)',
    },
    'redfish-ca-file': {
      describe: 'PEM CA certificate(s) to verify BMCs with; unset: the system trust store',
    },
    'redfish-reset-type': {
      describe:
        'Reset type to power-cycle with, if the BMC allows it; unset: the first allowed of ForceRestart, PowerCycle, GracefulRestart',
    },
    'redfish-timeout': { describe: 'Time for each Redfish request', default: '30s' },
    'redfish-concurrency': { describe: 'Most BMC requests in flight at once, across the fleet', default: '8' },
    'ipmi-username': {
      describe: 'User name of IPMI BMCs whose inventory entry gives none; unset: --redfish-username',
    },
    'ipmi-password-file': {
      describe:
        'File holding the password of IPMI BMCs whose inventory entry gives none (mode 0600; read at each BMC request); unset: --redfish-password-file',
    },
    'ipmi-timeout': {
      describe: 'Time for each ipmitool run against an IPMI BMC ("protocol": "ipmi"), killed after it',
      default: '30s',
    },
    'ipmi-concurrency': { describe: 'Most ipmitool runs at once, across the fleet', default: '8' },
    'static-reboot-wait': {
      describe:
        'Wait after a BMC accepted a reset before the machine counts as rebooted (so its agent is not started on the OS going down)',
      default: '30s',
    },
  },
  decommission: {
    provider: { describe: 'Provider of the machines, as in the BMDB (Static, Equinix, Dummy, …)' },
    'provider-id': {
      describe: 'Provider IDs of the machines (several: repeated, space- or comma-separated)',
      array: true,
    },
  },
  operator: {
    'machine-id': {
      describe: 'Machine IDs (BMDB UUIDs) instead of --provider and --provider-id (hold, unhold, install)',
      array: true,
    },
    reason: {
      describe:
        'Why: recorded with the hold, power action, installation request or decommissioned machine’s retirement (required for hold, install, decommission --wipe and every power action but status)',
    },
    actor: {
      describe:
        'Who: recorded with the hold, power action, installation request or decommissioned machine’s retirement; logged by recommission',
      defaultDescription: '<user>@<host> of this process',
    },
    graceful: {
      describe: 'power off: ask the OS to shut down (Redfish GracefulShutdown) instead of cutting power',
      boolean: true,
    },
    wipe: {
      describe:
        "decommission: first wipe each machine's disks through its running agent, or one its BMC boots for it (discard, both ends zeroed), and remove it once its agent reported success; needs --reason",
      boolean: true,
    },
    'wipe-timeout': {
      describe:
        'decommission --wipe: how long to wait for the agents to report; machines still wiping stay, removed by the same command run again',
      default: '10m',
    },
  },
  install: {
    'image-url': { describe: 'http:// or https:// URL of the disk image the agent writes to the root device' },
    'image-sha256': { describe: 'sha256 of the image as downloaded (before decompression), 64 hex digits' },
    'root-device': {
      describe: 'The whole disk the image is written to, an absolute path (/dev/sda, or a /dev/disk/by-path link)',
    },
    'root-device-hint': {
      describe:
        'The root device by what it is, FIELD=VALUE (repeated; Metal3 rootDeviceHints: deviceName, model, vendor, serialNumber, wwn, minSizeGigabytes, rotational): the agent takes the one disk matching all, and --root-device too when given',
      array: true,
    },
    compression: {
      describe:
        'none: the agent writes the image as its first bytes say (raw, gzip, xz, zstd or qcow2); gzip: it must be gzip',
      default: 'none',
    },
    'user-data': { describe: 'File of cloud-init user-data for the installed OS (up to 64 KiB)' },
    hostname: {
      describe:
        "The installed OS's hostname (one machine only), in its config drive; default: the inventory's hostname (with --inventory), else the machine's provider ID",
    },
    'ssh-key': {
      describe:
        "File of OpenSSH public keys (authorized_keys lines) the installed OS lets in, in its config drive (repeated); default: the inventory's sshPublicKeys (with --inventory)",
      array: true,
    },
    network: {
      describe:
        "JSON file of the installed OS's network (interfaces by MAC, bonds, VLANs, static addresses, routes, nameservers; see the README; one machine only); default: the inventory's network (with --inventory), else DHCP on each NIC",
    },
    cancel: {
      describe: 'Withdraw the machines’ pending, delivered or failed installation request instead',
      boolean: true,
    },
  },
  'agent-image': {
    out: { kind: 'path', describe: 'Directory the agent image is written to (vmlinuz, initramfs, agent.iso)' },
    'cache-dir': {
      kind: 'path',
      describe: 'Where built parts are kept by their inputs’ hash, so a build reuses what did not change',
      defaultDescription: '~/.cache/bmaas/agent-image',
    },
    'agent-bundle': {
      kind: 'path',
      describe: 'The bundled agent put in the image',
      defaultDescription: '@bmaas/agent’s dist/agent.cjs (npm run bundle -w @bmaas/agent)',
    },
    'firmware-dir': {
      kind: 'path',
      describe:
        'Where the firmware the image’s drivers declare is taken from (Debian’s firmware packages install there); what is not found is listed',
      defaultDescription: '/lib/firmware',
    },
  },
  'agent-boot': {
    'agent-boot-image-dir': {
      kind: 'path',
      describe:
        'The agent image (shepherd agent-image build --out DIR) that machines whose inventory says "agentBoot": "virtual-media" or "network" are booted into through their BMC; no agent boot when unset',
    },
    'agent-boot-listen': {
      describe:
        'host:port the boot files (the image, this process’s virtual media ISOs, every network boot’s iPXE script and config) are served at',
      default: '0.0.0.0:8081',
    },
    'agent-boot-url': {
      describe:
        'URL the machines’ BMCs and iPXE reach the boot files at, without a path (https://shepherd.example:8081)',
      defaultDescription: 'the listening address',
    },
    'agent-boot-tls-cert': {
      kind: 'path',
      describe: 'PEM certificate (and chain) to serve the boot files over HTTPS with (with --agent-boot-tls-key)',
    },
    'agent-boot-tls-key': { kind: 'path', describe: 'PEM private key of --agent-boot-tls-cert' },
    'agent-boot-tls-self-signed': {
      boolean: true,
      describe:
        'Serve the boot files over HTTPS with a self-signed certificate made once as <data-dir>/agent-boot.crt (most BMCs do not check it; iPXE does)',
    },
    'agent-boot-idle-timeout': {
      kind: 'duration',
      describe:
        'How long a boot files connection may go without a byte read or written before it is closed (a download whose client stopped reading, its file with it)',
      default: '1m',
    },
    'agent-boot-max-connections': {
      kind: 'number',
      describe:
        'Boot files connections open at once; past it a new one is closed as it is accepted (the BMC tries again)',
      default: '1024',
    },
    'agent-boot-enrollment-timeout': {
      kind: 'duration',
      describe:
        'How long a booted agent has to enroll before the boot counts as failed (the firmware, the image download, the image’s start)',
      default: '10m',
    },
    'agent-booter-db-query-rate': {
      kind: 'rate',
      describe: 'Rate of BMDB queries for agent boots (duration,count)',
      default: '250ms,8',
    },
    'agent-booter-loop-parallelism': { kind: 'number', describe: 'Agent boots run in parallel', default: '10' },
  },
  'power-sync': {
    'power-sync-rate': {
      kind: 'rate',
      describe: 'Rate of power state reads across the fleet (duration,count)',
      default: '100ms,10',
    },
    'power-sync-concurrency': {
      kind: 'number',
      describe: 'Power state reads in flight at once; 0 turns the power sync off',
      default: '4',
    },
    'power-sync-interval': {
      kind: 'duration',
      describe: 'Each machine’s power state is read at most this often',
      default: '1m',
    },
  },
  stop: {
    'stop-grace-period': {
      kind: 'duration',
      describe:
        'After SIGINT/SIGTERM, how long agent starts and recoveries under way may go on before they are cancelled (their machines released, to be taken up again)',
      default: '30s',
    },
  },
  web: {
    'web-listen': {
      describe:
        'host:port to serve the read-only fleet page at (HTML, JSON under /api/); beyond loopback it needs --web-token and TLS (--web-tls-cert, --web-tls-self-signed or --web-insecure-http)',
      defaultDescription: '127.0.0.1:8080 for web; off for run and server',
    },
    'web-token': {
      describe:
        'Token the fleet page asks for, as a bearer token or once in a login form (16+ characters; secret: prefer SHEPHERD_WEB_TOKEN)',
      secret: true,
    },
    'web-tls-cert': {
      kind: 'path',
      describe: 'PEM certificate (and chain) to serve the fleet page over HTTPS with (with --web-tls-key)',
    },
    'web-tls-key': { kind: 'path', describe: 'PEM private key of --web-tls-cert' },
    'web-tls-self-signed': {
      boolean: true,
      describe:
        'Serve the fleet page over HTTPS with a self-signed certificate made once as <data-dir>/web.crt (trust it in your browser)',
    },
    'web-insecure-http': {
      boolean: true,
      describe:
        'Serve the fleet page as plain HTTP beyond loopback, for a TLS-terminating proxy in front (logged at every start; cookies stay Secure)',
    },
  },
} as const satisfies Record<string, Record<string, Flag>>;

export type FlagGroup = keyof typeof flags;
export type FlagName = { [G in FlagGroup]: keyof (typeof flags)[G] }[FlagGroup];

const GROUP_TITLES: Record<FlagGroup, string> = {
  database: 'BMDB',
  observability: 'Observability',
  ssh: 'SSH',
  agent: 'Agent',
  provisioner: 'Provisioner',
  initializer: 'Initializer',
  recoverer: 'Recoverer',
  equinix: 'Equinix provider (run equinix, power)',
  dummy: 'Dummy provider (run dummy, power)',
  server: 'BMaaS server (server)',
  static: 'Static provider (run static, power)',
  decommission: 'Machines (decommission, recommission, hold, unhold, power, install)',
  operator: 'Holds and power actions (hold, unhold, power)',
  install: 'OS installation (install)',
  'agent-image': 'Agent image (agent-image build)',
  'agent-boot': 'Agent boot through the BMC (run)',
  'power-sync': 'Power sync (run)',
  stop: 'Stopping (run)',
  web: 'Fleet page (web, run, server)',
};

/** yargs options of the given groups, strings throughout (see the module comment). */
export function flagOptions(...groups: FlagGroup[]): Record<string, Options> {
  const options: Record<string, Options> = {};
  for (const group of groups) {
    for (const [name, flag] of Object.entries(flags[group]) as [string, Flag][]) {
      options[name] = { ...flagOption(name, flag), group: `${GROUP_TITLES[group]}:` };
    }
  }
  return options;
}

/** yargs options of single flags of the table, under their groups' titles. */
export function namedFlagOptions(...names: string[]): Record<string, Options> {
  const options: Record<string, Options> = {};
  for (const group of ALL_GROUPS) {
    for (const [name, flag] of Object.entries(flags[group]) as [string, Flag][]) {
      if (names.includes(name)) options[name] = { ...flagOption(name, flag), group: `${GROUP_TITLES[group]}:` };
    }
  }
  return options;
}

/** Whether a flag of the table is a boolean (takes no value on the command line). */
export function isBooleanFlag(name: string): boolean {
  return ALL_GROUPS.some((group) => (flags[group] as Record<string, Flag>)[name]?.boolean === true);
}

/** Whether a flag of the table takes several values (`--provider-id a b`). */
export function isArrayFlag(name: string): boolean {
  return ALL_GROUPS.some((group) => (flags[group] as Record<string, Flag>)[name]?.array === true);
}

/**
 * A yargs option for a flag outside the table (a command's own, such as
 * `status --json`), with the same help layout and `SHEPHERD_<NAME>` reading.
 */
export function commandOption(name: string, flag: Flag): Record<string, Options> {
  return { [name]: flagOption(name, flag) };
}

/**
 * One flag as a yargs option. Its value from `SHEPHERD_<NAME>` becomes the
 * option's default, so the command line still wins and each command takes
 * from the environment only the flags it has: yargs' own `.env()` hands every
 * `SHEPHERD_*` variable to every command, whose strict mode then refuses
 * those meant for another command.
 *
 * The type and default are written into the description (yargs' own type
 * column is hidden): yargs would call every flag `[string]`, and runs a long
 * description into it.
 */
function flagOption(name: string, flag: Flag): Options {
  const variable = envName(name);
  const fromEnvironment = process.env[variable];
  const fallback = flag.boolean ? false : flag.default;
  let value: string | boolean | undefined = fallback;
  if (fromEnvironment !== undefined)
    value = flag.boolean ? booleanFrom(name, variable, fromEnvironment) : fromEnvironment;
  let shownDefault: string | undefined;
  if (flag.secret) shownDefault = fromEnvironment === undefined ? undefined : `set in ${variable}`;
  else if (fromEnvironment !== undefined) shownDefault = `${JSON.stringify(value)} from ${variable}`;
  else if (flag.defaultDescription !== undefined) shownDefault = flag.defaultDescription;
  else if (flag.default !== undefined)
    shownDefault = flag.kind === 'number' ? flag.default : JSON.stringify(flag.default);
  const type = flag.boolean ? 'boolean' : (flag.kind ?? 'string');
  return {
    describe: `${flag.describe} [${type}]${shownDefault === undefined ? '' : ` [default: ${shownDefault}]`}`,
    type: flag.boolean ? 'boolean' : 'string',
    ...(flag.array ? { array: true } : {}),
    ...(value === undefined ? {} : { default: value }),
  };
}

const TRUE = ['true', '1', 'yes', 'on'];
const FALSE = ['false', '0', 'no', 'off', ''];

function booleanFrom(flag: string, variable: string, value: string): boolean {
  const lower = value.trim().toLowerCase();
  if (TRUE.includes(lower)) return true;
  if (FALSE.includes(lower)) return false;
  throw new UsageError(flag, `invalid value ${JSON.stringify(value)} in ${variable}: want true or false`);
}

/** Every group of the table, in --help order. */
const ALL_GROUPS = Object.keys(flags) as FlagGroup[];

/** The groups of `server` alone; every other command's are a subset of `run`'s. */
export const SERVER_GROUPS: FlagGroup[] = ['database', 'observability', 'server', 'web'];

/** Every group `run` takes, in --help order. */
/** Groups of one command other than `run`. */
const OTHER_COMMAND_GROUPS: readonly FlagGroup[] = ['server', 'decommission', 'operator', 'install', 'agent-image'];

/** Every group `run` takes, in --help order. */
export const FLAG_GROUPS = ALL_GROUPS.filter((group) => !OTHER_COMMAND_GROUPS.includes(group));

/** The flags of a group, for tests and docs. */
export function flagNames(group: FlagGroup): string[] {
  return Object.keys(flags[group]);
}

/** Every flag of the table, whichever command takes it. */
export function allFlagNames(): string[] {
  return ALL_GROUPS.flatMap((group) => flagNames(group));
}
