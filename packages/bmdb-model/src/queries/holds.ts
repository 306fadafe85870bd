/** Operators' holds: machines a person is working on, which no loop claims. */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import { type Kysely, sql } from 'kysely';
import { type Database, OperatorAction, OperatorOutcome, OSInstallationState } from '../schema.js';
import { checkActor, checkReason, recordOperatorAction } from './operator-history.js';
import { type OSInstallation, osInstallation } from './os-installation.js';

/** An operator's hold on a machine. */
export interface MachineHold {
  readonly machineId: string;
  readonly reason: string;
  /** Who held it (`user@host`). */
  readonly actor: string;
  readonly since: Date;
}

/** A hold with the machine's provider ID and its age, for status lists. */
export interface HeldMachine extends MachineHold {
  readonly provider: string | null;
  readonly providerId: string | null;
  /** Seconds since the hold was placed, by the database's clock. */
  readonly ageSeconds: number;
}

/** Who holds a machine and why (see {@link holdMachine}). */
export interface HoldRequest {
  readonly reason: string;
  readonly actor: string;
  /** Particulars for the history entry (a power off's implied hold: `{ impliedBy: 'PowerOff' }`). */
  readonly detail?: Readonly<Record<string, unknown>> | undefined;
}

/** What {@link holdMachine} did, and what goes on on the machine under the hold. */
export interface PlacedHold {
  /** The machine's hold: the one placed, or the one it already had. */
  readonly hold: MachineHold;
  /** Whether this call placed it (false: the machine was already held, and nothing was recorded). */
  readonly placed: boolean;
  /**
   * Processes with work held on the machine by a live session as the hold
   * took effect: every claim committed before it. They end on their own; no
   * claim committed after it is on the machine (unless its selection opted
   * in to held machines).
   */
  readonly liveWork: readonly string[];
  /** Its OS installation under way (the request `Delivered`: its agent is installing), if any. */
  readonly installing: OSInstallation | undefined;
}

/**
 * Holds the machine in one transaction (the caller's, or one of its own).
 * First it updates the machine's row, bumping `claim_version` as a claim
 * does: that waits for the claims in flight on the machine to commit, and
 * every claim whose snapshot is older and not yet locked skips the machine
 * (claims re-check the version under their lock; see sql/claim.ts). Then,
 * with the row locked, one statement places the hold (`held_at` is that
 * moment), records it in the operator history and reads the work running,
 * so every claim committed before the hold is named. At REPEATABLE READ or SERIALIZABLE, a claim committed since
 * the transaction's snapshot fails the update with a serialization error,
 * and the caller's retry reads it.
 */
export async function holdMachine(db: Kysely<Database>, machineId: string, request: HoldRequest): Promise<PlacedHold> {
  const what = `hold of machine ${machineId}`;
  checkReason(request.reason, what, 'what is being done to the machine');
  checkActor(request.actor, what);
  if (db.isTransaction) return placeHold(db, machineId, request, what);
  // READ COMMITTED: the update waits for the claims in flight instead of failing on them, and the next
  // statement's snapshot sees them; nothing here would retry a serialization failure.
  return db
    .transaction()
    .setIsolationLevel('read committed')
    .execute((trx) => placeHold(trx, machineId, request, what));
}

async function placeHold(
  trx: Kysely<Database>,
  machineId: string,
  request: HoldRequest,
  what: string,
): Promise<PlacedHold> {
  const locked = await sql<{ machine_id: string }>`
    UPDATE machines SET claim_version = claim_version + 1 WHERE machine_id = ${machineId}
    RETURNING machine_id`.execute(trx);
  if (locked.rows.length === 0) throw new BMDBError(`${what}: machine ${machineId} is not in the BMDB`);
  const { rows } = await sql<HoldRow & { placed: boolean; live_work: string[] }>`
    WITH placed AS (
      INSERT INTO machine_hold (machine_id, hold_reason, hold_actor, held_at)
      VALUES (${machineId}, ${request.reason}, ${request.actor}, clock_timestamp())
      ON CONFLICT (machine_id) DO NOTHING
      RETURNING machine_id, hold_reason, hold_actor, held_at),
    -- Its history entry is dated as the hold is: the moment it took effect.
    recorded AS (
      INSERT INTO operator_history (machine_id, action, outcome, reason, actor, "timestamp", detail)
      SELECT machine_id, ${OperatorAction.Hold}, ${OperatorOutcome.Succeeded}, hold_reason, hold_actor, held_at,
             ${request.detail === undefined ? null : JSON.stringify(request.detail)}::jsonb
      FROM placed)
    SELECT h.machine_id IS NULL AS placed,
           coalesce(h.machine_id, p.machine_id) AS machine_id,
           coalesce(h.hold_reason, p.hold_reason) AS hold_reason,
           coalesce(h.hold_actor, p.hold_actor) AS hold_actor,
           coalesce(h.held_at, p.held_at) AS held_at,
           ARRAY(
             SELECT w.process FROM work w JOIN sessions s ON s.session_id = w.session_id
             WHERE w.machine_id = ${machineId} AND s.deadline > now() ORDER BY w.process) AS live_work
    FROM (SELECT 1) AS one
    LEFT JOIN placed p ON true
    LEFT JOIN machine_hold h ON h.machine_id = ${machineId}`.execute(trx);
  const row = rows[0];
  // Released between the lock and the insert's conflict check: a rare race, told as such.
  if (row === undefined || row.machine_id === null) {
    throw new BMDBError(`${what}: the machine's hold changed concurrently; try again`);
  }
  const installation = await osInstallation(trx, machineId);
  const installing = installation?.state === OSInstallationState.Delivered ? installation : undefined;
  return { hold: toHold(row), placed: row.placed, liveWork: row.live_work, installing };
}

/**
 * Releases the machine's hold, recording `Unhold` in the operator history;
 * the loops' idle workers are woken. Returns the hold released, or
 * `undefined` when the machine was not held (nothing is recorded).
 */
export async function unholdMachine(
  db: Kysely<Database>,
  machineId: string,
  request: { readonly actor: string; readonly reason?: string | undefined },
): Promise<MachineHold | undefined> {
  checkActor(request.actor, `unhold of machine ${machineId}`);
  const removed = await db
    .deleteFrom('machine_hold')
    .where('machine_id', '=', machineId)
    .returningAll()
    .executeTakeFirst();
  if (removed === undefined) return undefined;
  const hold = toHold(removed);
  await recordOperatorAction(db, {
    machineId,
    action: OperatorAction.Unhold,
    outcome: OperatorOutcome.Succeeded,
    reason: request.reason ?? null,
    actor: request.actor,
    detail: { heldBy: hold.actor, heldSince: hold.since.toISOString(), heldFor: hold.reason },
  });
  return hold;
}

/** The machine's hold, if it is held. */
export async function machineHold(db: Kysely<Database>, machineId: string): Promise<MachineHold | undefined> {
  const row = await db.selectFrom('machine_hold').selectAll().where('machine_id', '=', machineId).executeTakeFirst();
  return row && toHold(row);
}

/** Held machines, longest held first (default at most 100), with provider ID and age. */
export async function heldMachines(db: Kysely<Database>, options: { limit?: number } = {}): Promise<HeldMachine[]> {
  const rows = await db
    .selectFrom('machine_hold as hd')
    .leftJoin('machine_provided as mp', 'mp.machine_id', 'hd.machine_id')
    .selectAll('hd')
    .select([
      'mp.provider',
      'mp.provider_id',
      sql<number>`floor(extract(epoch FROM now() - hd.held_at))::int`.as('age_seconds'),
    ])
    .orderBy('hd.held_at')
    .orderBy('hd.machine_id')
    .limit(options.limit ?? 100)
    .execute();
  return rows.map((row) => ({
    ...toHold(row),
    provider: row.provider,
    providerId: row.provider_id,
    ageSeconds: row.age_seconds,
  }));
}

interface HoldRow {
  machine_id: string;
  hold_reason: string;
  hold_actor: string;
  held_at: Date;
}

function toHold(row: HoldRow): MachineHold {
  return { machineId: row.machine_id, reason: row.hold_reason, actor: row.hold_actor, since: row.held_at };
}
