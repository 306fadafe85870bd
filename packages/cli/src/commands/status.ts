import { createHash } from 'node:crypto';
import {
  type AgentBootCounts,
  activeBackoffs,
  agentBootCounts,
  type FirstBoot,
  type FirstBootCounts,
  type FleetStats,
  firstBootCounts,
  fleetStats,
  heldMachines,
  type OSInstallationCounts,
  osInstallationCounts,
  osInstallations,
  type RootDeviceHints,
  retiredMachineCount,
  retiredMachines,
} from '@bmaas/bmdb-model';
import { openBMDB } from '../database.js';
import { type Argv, databaseSettings } from '../settings.js';
import { describeRootDevice } from './install.js';

/** A machine whose work for a process is backing off. */
interface Backoff {
  readonly machineId: string;
  readonly provider: string | null;
  readonly providerId: string | null;
  readonly process: string;
  readonly until: string;
  readonly secondsLeft: number;
  readonly cause: string;
}

/** A machine an operator holds. */
interface Hold {
  readonly machineId: string;
  readonly provider: string | null;
  readonly providerId: string | null;
  readonly reason: string;
  readonly actor: string;
  readonly since: string;
  readonly ageSeconds: number;
}

/** A machine's OS installation request that is under way or failed. */
interface Installation {
  readonly machineId: string;
  readonly provider: string | null;
  readonly providerId: string | null;
  readonly generation: number;
  readonly state: string;
  /** `DiskImage`, or `DiskWipe` (no image: `imageUrl` empty). */
  readonly kind: string;
  readonly imageUrl: string;
  /** Null when the request names its disk by hints alone. */
  readonly rootDevice: string | null;
  readonly rootDeviceHints: RootDeviceHints | null;
  readonly requestedBy: string;
  readonly requestedAt: string;
  readonly deliveredAt: string | null;
  /** The agent's error, for Failed. */
  readonly error: string | null;
}

/** A decommissioned machine the provisioner leaves out while its provider lists it. */
interface Retired {
  readonly provider: string;
  readonly providerId: string;
  /** The machine ID it had. */
  readonly machineId: string;
  readonly retiredAt: string;
  readonly actor: string | null;
  readonly reason: string | null;
  /** Whether its disks were wiped before (`decommission --wipe`). */
  readonly wiped: boolean;
}

/** A succeeded disk image installation and whether its OS reported its first boot. */
interface InstalledOS {
  readonly machineId: string;
  readonly provider: string | null;
  readonly providerId: string | null;
  readonly generation: number;
  readonly hostname: string;
  readonly installedAt: string | null;
  /** `booted`, `booting` (not yet, within the bound) or `installed-not-booted`. */
  readonly firstBoot: FirstBoot;
  /** When the OS reported its first boot. */
  readonly bootedAt: string | null;
  /** The SSH host keys it sent with it. */
  readonly hostKeys: readonly string[];
}

/** What `shepherd status --json` prints. */
export interface Status extends FleetStats {
  readonly backoffs: readonly Backoff[];
  /** Held machines, longest held first (at most 50; `held` counts them all). */
  readonly holds: readonly Hold[];
  /** Machines per OS installation state. */
  readonly installations: OSInstallationCounts;
  /** Machines whose BMC boots their agent, per boot method; the other provided machines are taken over through SSH. */
  readonly agentBoots: AgentBootCounts;
  /** Installations requested, delivered (installing) or failed, most recent first (at most 50). */
  readonly installationRequests: readonly Installation[];
  /** Retired (decommissioned) machines, of every provider. */
  readonly retired: number;
  /** Retired machines, most recently retired first (at most 50). */
  readonly retiredMachines: readonly Retired[];
  /** Succeeded disk image installations per first boot. */
  readonly firstBoots: FirstBootCounts;
  /** Succeeded disk image installations, most recently requested first (at most 50), with their first boot. */
  readonly installedOSes: readonly InstalledOS[];
}

const BACKOFFS_SHOWN = 50;
const HOLDS_SHOWN = 50;
const INSTALLATIONS_SHOWN = 50;
const RETIRED_SHOWN = 50;

/**
 * `shepherd status`: the fleet at a glance — machines per lifecycle stage,
 * held machines with reason, actor and age, machines per power state, OS
 * installations per state (those under way or failed listed, with the
 * agent's error), installed OSes by their first boot (booted with its time
 * and host keys, booting, or installed-not-booted past the bound), machines
 * per boot method, live work per process, machines in backoff with cause and
 * time left, retired machines (decommissioned: left out by the provisioner
 * until recommissioned) with who retired them, when and why.
 */
export async function status(argv: Argv, write: (text: string) => void): Promise<void> {
  const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, readOnly: true, attach: true });
  try {
    const q = bmdb.db;
    const stats = await fleetStats(q);
    const backoffs = await activeBackoffs(q, { limit: BACKOFFS_SHOWN });
    const holds = await heldMachines(q, { limit: HOLDS_SHOWN });
    const installations = await osInstallations(q, {
      states: ['Requested', 'Delivered', 'Failed'],
      limit: INSTALLATIONS_SHOWN,
    });
    const retired = await retiredMachines(q, { limit: RETIRED_SHOWN });
    const installed = await osInstallations(q, { states: ['Succeeded'], limit: INSTALLATIONS_SHOWN });
    const result: Status = {
      ...stats,
      retired: await retiredMachineCount(q),
      retiredMachines: retired.map((r) => ({ ...r, retiredAt: r.retiredAt.toISOString() })),
      installations: await osInstallationCounts(q),
      agentBoots: await agentBootCounts(q),
      installationRequests: installations.map((i) => ({
        machineId: i.machineId,
        provider: i.provider,
        providerId: i.providerId,
        generation: Number(i.generation),
        state: i.state,
        kind: i.kind,
        imageUrl: i.imageUrl,
        rootDevice: i.rootDevice ?? null,
        rootDeviceHints: i.rootDeviceHints ?? null,
        requestedBy: i.requestedBy,
        requestedAt: i.requestedAt.toISOString(),
        deliveredAt: i.deliveredAt?.toISOString() ?? null,
        error: i.error,
      })),
      firstBoots: await firstBootCounts(q),
      installedOSes: installed.flatMap((i) =>
        i.firstBoot === undefined
          ? []
          : [
              {
                machineId: i.machineId,
                provider: i.provider,
                providerId: i.providerId,
                generation: Number(i.generation),
                hostname: i.hostname,
                installedAt: i.endedAt?.toISOString() ?? null,
                firstBoot: i.firstBoot,
                bootedAt: i.bootedAt?.toISOString() ?? null,
                hostKeys: i.bootedHostKeys,
              },
            ],
      ),
      holds: holds.map((h) => ({
        machineId: h.machineId,
        provider: h.provider,
        providerId: h.providerId,
        reason: h.reason,
        actor: h.actor,
        since: h.since.toISOString(),
        ageSeconds: h.ageSeconds,
      })),
      backoffs: backoffs.map((b) => ({
        machineId: b.machineId,
        provider: b.provider,
        providerId: b.providerId,
        process: b.process,
        until: b.until.toISOString(),
        secondsLeft: b.secondsLeft,
        cause: b.cause,
      })),
    };
    write(argv.json === true ? `${JSON.stringify(result, null, 2)}\n` : render(result));
  } finally {
    await bmdb.close();
  }
}

const STAGES: [keyof FleetStats['stages'], string][] = [
  ['provided', 'provided'],
  ['agentStarting', 'agent starting'],
  ['agentStarted', 'agent started'],
  ['heartbeating', 'heartbeating'],
  ['awaitingRecovery', 'awaiting recovery'],
  ['installed', 'installed'],
  ['unprovided', 'not provided'],
];

const INSTALLATION_STATES: [keyof OSInstallationCounts, string][] = [
  ['Requested', 'requested'],
  ['Delivered', 'installing'],
  ['Succeeded', 'installed'],
  ['Failed', 'failed'],
  ['Canceled', 'canceled'],
];

/** An OpenSSH public key as `ssh-keygen -l` names it: its type and `SHA256:` fingerprint. */
function fingerprint(key: string): string {
  const [type = '', blob = ''] = key.split(/\s+/);
  return `${type} SHA256:${createHash('sha256').update(Buffer.from(blob, 'base64')).digest('base64').replace(/=+$/, '')}`;
}

function render(status: Status): string {
  const lines = [`Machines: ${status.machines}`];
  for (const [key, label] of STAGES) {
    if (key === 'unprovided' && status.stages.unprovided === 0) continue;
    lines.push(`  ${label.padEnd(20)}${String(status.stages[key]).padStart(8)}`);
  }
  lines.push('', `Held: ${status.held}`);
  if (status.holds.length > 0) {
    lines.push(
      ...table([
        ['MACHINE', 'PROVIDER ID', 'BY', 'AGE', 'REASON'],
        ...status.holds.map((h) => [h.machineId, h.providerId ?? '-', h.actor, left(h.ageSeconds), h.reason]),
      ]),
    );
    if (status.held > status.holds.length) lines.push(`  … ${status.held - status.holds.length} more`);
  }
  lines.push('', 'Power:');
  for (const [state, label] of POWER_STATES) {
    const count = status.powerStates[state];
    if (count > 0 || state === 'On') lines.push(`  ${label.padEnd(20)}${String(count).padStart(8)}`);
  }
  if (status.powerReadFailed > 0)
    lines.push(`  ${'last read failed'.padEnd(20)}${String(status.powerReadFailed).padStart(8)}`);
  const requested = Object.values(status.installations).reduce((a, b) => a + b, 0);
  lines.push('', `OS installations: ${requested}`);
  for (const [state, label] of INSTALLATION_STATES) {
    if (status.installations[state] > 0)
      lines.push(`  ${label.padEnd(20)}${String(status.installations[state]).padStart(8)}`);
  }
  if (status.installationRequests.length > 0) {
    lines.push(
      ...table([
        ['MACHINE', 'PROVIDER ID', 'GEN', 'STATE', 'IMAGE', 'ERROR'],
        ...status.installationRequests.map((i) => [
          i.machineId,
          i.providerId ?? '-',
          String(i.generation),
          i.state,
          i.kind === 'DiskWipe'
            ? 'wipe every disk'
            : `${i.imageUrl} onto ${describeRootDevice(i.rootDevice ?? undefined, i.rootDeviceHints ?? undefined)}`,
          i.error ?? '',
        ]),
      ]),
    );
  }
  const firstBoots = Object.values(status.firstBoots).reduce((a, b) => a + b, 0);
  if (firstBoots > 0) {
    lines.push('', `First boots of installed OSes: ${firstBoots}`);
    for (const [state, count] of Object.entries(status.firstBoots)) {
      if (count > 0) lines.push(`  ${state.padEnd(20)}${String(count).padStart(8)}`);
    }
    lines.push(
      ...table([
        ['MACHINE', 'PROVIDER ID', 'GEN', 'HOSTNAME', 'FIRST BOOT', 'AT', 'HOST KEYS'],
        ...status.installedOSes.map((i) => [
          i.machineId,
          i.providerId ?? '-',
          String(i.generation),
          i.hostname,
          i.firstBoot,
          i.bootedAt ?? (i.installedAt === null ? '' : `installed ${i.installedAt}`),
          i.hostKeys.map(fingerprint).join(', '),
        ]),
      ]),
    );
  }
  // Machines the BMDB has no method for are taken over through SSH, the default.
  const bmcBooted = status.agentBoots['virtual-media'] + status.agentBoots.network;
  lines.push('', 'Agent boot:');
  for (const [label, count] of [
    ['ssh', Math.max(0, status.machines - status.stages.unprovided - bmcBooted)],
    ['virtual-media', status.agentBoots['virtual-media']],
    ['network', status.agentBoots.network],
  ] as const) {
    if (count > 0 || label === 'ssh') lines.push(`  ${label.padEnd(20)}${String(count).padStart(8)}`);
  }
  lines.push('', 'Active work:');
  const work = Object.entries(status.activeWork);
  if (work.length === 0) lines.push('  none');
  for (const [process, count] of work) lines.push(`  ${process.padEnd(20)}${String(count).padStart(8)}`);
  const total = Object.values(status.activeBackoffs).reduce((a, b) => a + b, 0);
  lines.push('', `Backoffs: ${total}`);
  for (const [process, count] of Object.entries(status.activeBackoffs)) {
    lines.push(`  ${process.padEnd(20)}${String(count).padStart(8)}`);
  }
  if (status.backoffs.length > 0) {
    lines.push('');
    lines.push(
      ...table([
        ['MACHINE', 'PROVIDER ID', 'PROCESS', 'LEFT', 'CAUSE'],
        ...status.backoffs.map((b) => [b.machineId, b.providerId ?? '-', b.process, left(b.secondsLeft), b.cause]),
      ]),
    );
    if (total > status.backoffs.length) lines.push(`  … ${total - status.backoffs.length} more`);
  }
  lines.push('', `Retired: ${status.retired}`);
  if (status.retiredMachines.length > 0) {
    lines.push(
      ...table([
        ['PROVIDER', 'PROVIDER ID', 'WAS MACHINE', 'RETIRED', 'BY', 'WIPED', 'REASON'],
        ...status.retiredMachines.map((r) => [
          r.provider,
          r.providerId,
          r.machineId,
          r.retiredAt,
          r.actor ?? '-',
          r.wiped ? 'yes' : 'no',
          r.reason ?? '',
        ]),
      ]),
    );
    if (status.retired > status.retiredMachines.length) {
      lines.push(`  … ${status.retired - status.retiredMachines.length} more`);
    }
  }
  return `${lines.join('\n')}\n`;
}

/** Rows as aligned columns, indented; the last column runs free. */
function table(rows: readonly (readonly string[])[]): string[] {
  const columns = (rows[0]?.length ?? 1) - 1;
  const widths = Array.from({ length: columns }, (_, i) => Math.max(...rows.map((row) => (row[i] ?? '').length)));
  return rows.map((row) => `  ${row.map((cell, i) => (i < columns ? cell.padEnd(widths[i] ?? 0) : cell)).join('  ')}`);
}

const POWER_STATES: [keyof FleetStats['powerStates'], string][] = [
  ['On', 'on'],
  ['Off', 'off'],
  ['PoweringOn', 'powering on'],
  ['PoweringOff', 'powering off'],
  ['Unknown', 'unknown'],
  ['Unread', 'not read yet'],
];

function left(seconds: number): string {
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${String(seconds % 60).padStart(2, '0')}s`;
  return `${Math.floor(seconds / 3600)}h${String(Math.floor((seconds % 3600) / 60)).padStart(2, '0')}m`;
}
