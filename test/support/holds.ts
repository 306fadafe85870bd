import type { TestDatabase } from './database.js';

/** A hold as its placer told it: the machine and the work it named running. */
export interface ToldHold {
  readonly machineId: string;
  readonly liveWork: readonly string[];
}

/**
 * What the BMDB's work history says a hold got wrong, one line each (none
 * when it kept its word): a claim of `process` on the held machine that
 * started at or after the hold took effect (`held_at`), or a claim of
 * `process` running then (its last event before `held_at` is `Started`)
 * that the hold did not name. A claim's `Started` is written at its
 * transaction's start, before it commits, so one that started after the
 * hold committed after it. The holds must still be in place.
 */
export async function holdViolations(db: TestDatabase, process: string, holds: readonly ToldHold[]): Promise<string[]> {
  const { rows } = await db.admin(
    `SELECT h.machine_id::text AS machine_id, h.held_at::text AS held_at,
            (SELECT count(*)::int FROM work_history wh
             WHERE wh.machine_id = h.machine_id AND wh.process = $2 AND wh.event = 'Started'
               AND wh."timestamp" >= h.held_at) AS started_after,
            (SELECT wh.event FROM work_history wh
             WHERE wh.machine_id = h.machine_id AND wh.process = $2 AND wh."timestamp" < h.held_at
             ORDER BY wh."timestamp" DESC LIMIT 1) AS last_before
     FROM machine_hold h WHERE h.machine_id = ANY ($1::uuid[])`,
    [holds.map((hold) => hold.machineId), process],
  );
  const byMachine = new Map(
    rows.map((row: { machine_id: string; held_at: string; started_after: number; last_before: string | null }) => [
      row.machine_id,
      row,
    ]),
  );
  const violations: string[] = [];
  for (const hold of holds) {
    const row = byMachine.get(hold.machineId);
    if (row === undefined) {
      violations.push(`machine ${hold.machineId}: not held`);
      continue;
    }
    if (row.started_after > 0) {
      violations.push(
        `machine ${hold.machineId}: ${row.started_after} claim(s) started after its hold at ${row.held_at}`,
      );
    }
    if (row.last_before === 'Started' && !hold.liveWork.includes(process)) {
      violations.push(`machine ${hold.machineId}: its claim running at the hold (${row.held_at}) is not named`);
    }
  }
  return violations;
}

/** The machines whose hold named work of `process` running: the holds that met a claim. */
export function holdsMeetingClaims(process: string, holds: readonly ToldHold[]): number {
  return holds.filter((hold) => hold.liveWork.includes(process)).length;
}
