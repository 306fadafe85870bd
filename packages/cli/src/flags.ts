import type { Options } from 'yargs';

/**
 * Every flag of the shepherd, in kebab case after the original's, grouped as
 * `--help` shows them. Each is also read from the environment as
 * `SHEPHERD_<NAME>` (`--agent-ssh-port` ← `SHEPHERD_AGENT_SSH_PORT`).
 *
 * Values are read as strings and parsed by settings.ts, so a bad one is
 * reported with the flag's name and the syntax it wants.
 */
interface Flag {
  readonly describe: string;
  readonly default?: string;
  readonly boolean?: true;
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
    'data-dir': { describe: 'Directory of the embedded PostgreSQL (and the default SSH key)', default: './.shepherd' },
    'component-name': { describe: 'Name recorded with this process’s BMDB sessions', default: 'shepherd' },
    'bmdb-session-interval': {
      describe:
        'How long a BMDB session lives without a heartbeat (whole seconds); a crashed shepherd’s machines are free again after it',
      default: '5s',
    },
  },
  observability: {
    'metrics-listen': {
      describe: 'host:port to serve Prometheus metrics at /metrics (e.g. 127.0.0.1:9090); off when unset',
    },
  },
  ssh: {
    'ssh-key-path': {
      describe:
        'The shepherd’s ed25519 SSH key (OpenSSH format, or the original’s raw 64 bytes); generated there when missing',
      defaultDescription: '<data-dir>/ssh_key',
    },
    'agent-ssh-user': { describe: 'User the shepherd logs in to machines as', default: 'root' },
    'agent-ssh-port': { describe: 'SSH port of the machines', default: '22' },
    'agent-ssh-connect-timeout': { describe: 'Time to connect and authenticate over SSH', default: '2s' },
    'agent-ssh-exec-timeout': { describe: 'Time to upload and run the agent once connected', default: '60s' },
  },
  agent: {
    'agent-executable-path': {
      describe: 'The agent executable uploaded to machines (required for equinix; dummy: the bundled test agent)',
    },
    'agent-target-path': {
      describe: 'Where the agent is uploaded to and run from on machines',
      default: '/root/agent',
    },
    'agent-endpoint': { describe: 'Address of the BMaaS endpoint the agent connects to (required for equinix)' },
    'agent-endpoint-ca-certificate-path': {
      describe: 'PEM CA certificate of the endpoint, passed to the agent (DER); unset: the agent trusts system CAs',
    },
  },
  provisioner: {
    'provisioner-max-machines': { describe: 'Most machines to bring into the BMDB; 0 for no limit', default: '50' },
    'provisioner-reconciler-rate': { describe: 'Rate of reconciliation passes (duration,count)', default: '1m,1' },
    'provisioner-device-creation-rate': { describe: 'Rate of machine creation (duration,count)', default: '5s,1' },
    'provisioner-reservation-chunk-size': { describe: 'Most machines created in one pass', default: '20' },
  },
  initializer: {
    'initializer-db-query-rate': {
      describe: 'Rate of BMDB queries for agent starts (duration,count)',
      default: '250ms,8',
    },
    'initializer-loop-parallelism': { describe: 'Agent starts run in parallel', default: '1' },
  },
  recoverer: {
    'recoverer-db-query-rate': { describe: 'Rate of BMDB queries for recoveries (duration,count)', default: '250ms,8' },
    'recoverer-loop-parallelism': { describe: 'Recoveries run in parallel', default: '1' },
    'recoverer-first-heartbeat-timeout': {
      describe: 'Reboot a machine whose agent sent no heartbeat this long after it started',
      default: '30m',
    },
    'recoverer-heartbeat-timeout': {
      describe: 'Reboot a machine whose agent’s last heartbeat is this old',
      default: '10m',
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
      describe: 'Wait after a reboot request before the machine counts as rebooted',
      default: '30s',
    },
    'equinix-reservation-cache-timeout': {
      describe: 'How long a listing of hardware reservations is reused',
      default: '15m',
    },
  },
  dummy: {
    'dummy-capacity': { describe: 'Machines the dummy provider can hand out', default: '20' },
    'dummy-agent-failure-rate': { describe: 'Share (0-1) of agent starts that fail', default: '0.1' },
    'dummy-heartbeat-failure-rate': { describe: 'Share (0-1) of started agents that never heartbeat', default: '0.1' },
    'dummy-heartbeat-interval': { describe: 'Interval of the fake agents’ heartbeats', default: '10s' },
    'dummy-agent-start-duration': {
      describe: 'How long each fake agent start takes before it answers (0s: at once)',
      default: '0s',
    },
    'dummy-agent-start-log': {
      describe:
        'Append one JSON line to this file as each fake agent start begins and ends (machine, address, pid, time); off when unset',
    },
  },
  web: {
    'web-listen': {
      describe:
        'host:port to serve the read-only fleet page at (HTML, JSON under /api/); beyond loopback it needs --web-token',
      defaultDescription: '127.0.0.1:8080 for web; off for run',
    },
    'web-token': {
      describe:
        'Token the fleet page asks for, as a bearer token or once in a login form (16+ characters; secret: prefer SHEPHERD_WEB_TOKEN)',
      secret: true,
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
  equinix: 'Equinix provider (run equinix)',
  dummy: 'Dummy provider (run dummy)',
  web: 'Fleet page (web, run)',
};

/** yargs options of the given groups, strings throughout (see the module comment). */
export function flagOptions(...groups: FlagGroup[]): Record<string, Options> {
  const options: Record<string, Options> = {};
  for (const group of groups) {
    for (const [name, flag] of Object.entries(flags[group]) as [string, Flag][]) {
      options[name] = {
        group: `${GROUP_TITLES[group]}:`,
        describe: flag.describe,
        type: flag.boolean ? 'boolean' : 'string',
        ...(flag.boolean ? { default: false } : {}),
        ...(flag.default !== undefined && !flag.secret ? { default: flag.default } : {}),
        ...(flag.defaultDescription ? { defaultDescription: flag.defaultDescription } : {}),
        // A value from the environment is never echoed back in help or errors.
        ...(flag.secret ? { defaultDescription: '(none)' } : {}),
      };
    }
  }
  return options;
}

/** Every group, in --help order: `run` takes them all. */
export const FLAG_GROUPS = Object.keys(flags) as FlagGroup[];

/** The flags of a group, for tests and docs. */
export function flagNames(group: FlagGroup): string[] {
  return Object.keys(flags[group]);
}
