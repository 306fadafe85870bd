import { type FleetStats, Queries } from '@bmaas/bmdb-controlloop';
import { openBMDB } from '../database.js';
import { type Argv, databaseSettings } from '../settings.js';

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

/** What `shepherd status --json` prints. */
export interface Status extends FleetStats {
  readonly backoffs: readonly Backoff[];
}

const BACKOFFS_SHOWN = 50;

/**
 * `shepherd status`: the fleet at a glance — machines per lifecycle stage,
 * live work per process, machines in backoff with cause and time left.
 */
export async function status(argv: Argv, write: (text: string) => void): Promise<void> {
  const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, readOnly: true, attach: true });
  try {
    const q = new Queries(bmdb.db);
    const stats = await q.fleetStats();
    const backoffs = await q.activeBackoffs({ limit: BACKOFFS_SHOWN });
    const result: Status = {
      ...stats,
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
  ['unprovided', 'not provided'],
];

function render(status: Status): string {
  const lines = [`Machines: ${status.machines}`];
  for (const [key, label] of STAGES) {
    if (key === 'unprovided' && status.stages.unprovided === 0) continue;
    lines.push(`  ${label.padEnd(20)}${String(status.stages[key]).padStart(8)}`);
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
    const table = [
      ['MACHINE', 'PROVIDER ID', 'PROCESS', 'LEFT', 'CAUSE'],
      ...status.backoffs.map((b) => [b.machineId, b.providerId ?? '-', b.process, left(b.secondsLeft), b.cause]),
    ];
    const widths = [0, 1, 2, 3].map((i) => Math.max(...table.map((row) => (row[i] ?? '').length)));
    for (const row of table) {
      lines.push(`  ${row.map((cell, i) => (i < 4 ? cell.padEnd(widths[i] ?? 0) : cell)).join('  ')}`);
    }
    if (total > status.backoffs.length) lines.push(`  … ${total - status.backoffs.length} more`);
  }
  return `${lines.join('\n')}\n`;
}

function left(seconds: number): string {
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${String(seconds % 60).padStart(2, '0')}s`;
  return `${Math.floor(seconds / 3600)}h${String(Math.floor((seconds % 3600) / 60)).padStart(2, '0')}m`;
}
