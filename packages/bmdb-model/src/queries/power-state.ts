/** Each machine's power state as last read, and the power sync's choice of what to read next. */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import { type Kysely, sql } from 'kysely';
import { type Database, PowerState } from '../schema.js';

/** A machine's last power state read. */
export interface PowerStateRecord {
  readonly machineId: string;
  /** `null` until a read succeeded. */
  readonly state: PowerState | null;
  /** When `state` was read. */
  readonly readAt: Date | null;
  /** The last read that failed and its cause, if it failed since the last good read. */
  readonly failedAt: Date | null;
  readonly failedCause: string | null;
}

/** A machine taken up by a power sync for a read (see {@link leasePowerReads}). */
export interface PowerReadLease {
  readonly machineId: string;
  readonly providerId: string;
  /** Passed back to {@link recordPowerRead}: the read is recorded only while the lease is the latest. */
  readonly token: string;
}

/** What a read of a machine's power state gave: a state, or the failure's cause. */
export type PowerReadResult = { readonly state: PowerState } | { readonly failure: string };

const STATES: readonly string[] = Object.values(PowerState);

/**
 * Up to `limit` machines of `provider` due for a read: never read first,
 * then those last taken up longest ago, if over `intervalSeconds` ago. Each
 * is marked taken up now, in the same statement, so concurrent syncs (of
 * other shepherd processes) take up others. Two index range scans of
 * `machine_power_state_due_idx`; rows locked by another sync are skipped.
 * Outside a transaction it runs at READ COMMITTED, where concurrent leases
 * skip each other's rows instead of failing on them (40001).
 */
export async function leasePowerReads(
  db: Kysely<Database>,
  options: { provider: string; limit: number; intervalSeconds: number },
): Promise<PowerReadLease[]> {
  const { provider, limit, intervalSeconds } = options;
  if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`leasePowerReads: limit must be >= 1, got ${limit}`);
  if (!(intervalSeconds >= 0)) throw new RangeError(`leasePowerReads: intervalSeconds must be >= 0`);
  if (!db.isTransaction) return readCommitted(db, (trx) => leasePowerReads(trx, options));
  // Each scan locks its rows as it finds them, skipping rows another lease
  // holds: concurrent leases take up different machines rather than the
  // same few. A row taken up and committed since this statement's snapshot
  // is re-checked on its newest version, and is no longer due.
  const { rows } = await sql<{ machine_id: string; provider_id: string; token: string }>`
    WITH never_read AS (
      SELECT machine_id, power_checked_at FROM machine_power_state
      WHERE provider = ${provider} AND power_checked_at IS NULL
      LIMIT ${limit} FOR UPDATE SKIP LOCKED),
    oldest AS (
      SELECT machine_id, power_checked_at FROM machine_power_state
      WHERE provider = ${provider} AND power_checked_at < now() - make_interval(secs => ${intervalSeconds})
      ORDER BY power_checked_at
      LIMIT greatest(0, ${limit} - (SELECT count(*) FROM never_read)) FOR UPDATE SKIP LOCKED),
    leased AS (
      UPDATE machine_power_state ps SET power_checked_at = now()
      FROM (SELECT machine_id FROM never_read UNION ALL SELECT machine_id FROM oldest) l
      WHERE ps.machine_id = l.machine_id
      RETURNING ps.machine_id, ps.power_checked_at)
    SELECT l.machine_id, mp.provider_id, l.power_checked_at::text AS token
    FROM leased l JOIN machine_provided mp ON mp.machine_id = l.machine_id`.execute(db);
  return rows.map((row) => ({ machineId: row.machine_id, providerId: row.provider_id, token: row.token }));
}

/**
 * Takes up one machine for a read now, due or not (`shepherd power status`):
 * as {@link leasePowerReads} does, it marks the machine taken up, so a read
 * under way that began before does not count, and this one does not once a
 * power action or another read came after it. `undefined` for a machine
 * without a power state row (unprovided).
 */
export async function leasePowerRead(db: Kysely<Database>, machineId: string): Promise<PowerReadLease | undefined> {
  const { rows } = await sql<{ machine_id: string; provider_id: string; token: string }>`
    UPDATE machine_power_state ps SET power_checked_at = now()
    FROM machine_provided mp
    WHERE ps.machine_id = ${machineId} AND mp.machine_id = ps.machine_id
    RETURNING ps.machine_id, mp.provider_id, ps.power_checked_at::text AS token`.execute(db);
  const row = rows[0];
  return row && { machineId: row.machine_id, providerId: row.provider_id, token: row.token };
}

/**
 * Records a leased read and returns the record it replaced. Refused
 * (`undefined`) when the machine was taken up again since (a power action
 * asked for a fresh read): the result may predate it. Outside a
 * transaction it runs at READ COMMITTED: it locks the one row it writes, and
 * concurrent syncs' records would only fail each other at SERIALIZABLE.
 */
export async function recordPowerRead(
  db: Kysely<Database>,
  lease: Pick<PowerReadLease, 'machineId' | 'token'>,
  result: PowerReadResult,
): Promise<PowerStateRecord | undefined> {
  if (!db.isTransaction) return readCommitted(db, (trx) => recordPowerRead(trx, lease, result));
  const set = resultColumns(lease.machineId, result);
  const { rows } = await sql<PowerStateRow>`
    WITH before AS (
      SELECT * FROM machine_power_state
      WHERE machine_id = ${lease.machineId} AND power_checked_at = ${lease.token}::timestamptz
      FOR UPDATE),
    recorded AS (
      UPDATE machine_power_state ps SET ${sql.join(
        Object.entries(set).map(([column, value]) => sql`${sql.ref(column)} = ${value}`),
      )}
      FROM before b WHERE ps.machine_id = b.machine_id)
    SELECT machine_id, power_state, power_state_read_at, power_read_failed_at, power_read_failed_cause FROM before`.execute(
    db,
  );
  return rows[0] && toPowerStateRecord(rows[0]);
}

/**
 * Records a state known as of now, with nothing read for it that took time
 * (a fixture, a provider that pushes states): it counts as the latest read,
 * and one under way does not. A read that takes time leases the machine
 * first ({@link leasePowerRead}) and records with {@link recordPowerRead},
 * so it never overwrites a state recorded after it began.
 */
export async function recordPowerState(
  db: Kysely<Database>,
  machineId: string,
  result: PowerReadResult,
): Promise<boolean> {
  const { numUpdatedRows } = await db
    .updateTable('machine_power_state')
    .set({ ...resultColumns(machineId, result), power_checked_at: sql`now()` })
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return numUpdatedRows > 0n;
}

/** Makes the machine the power sync's next read, and any read under way not count (after a power action). */
export async function forgetPowerRead(db: Kysely<Database>, machineId: string): Promise<void> {
  await db
    .updateTable('machine_power_state')
    .set({ power_checked_at: null })
    .where('machine_id', '=', machineId)
    .execute();
}

/** The machine's power state as last read, with the last read's failure; `undefined` for an unprovided machine. */
export async function powerState(db: Kysely<Database>, machineId: string): Promise<PowerStateRecord | undefined> {
  const row = await db
    .selectFrom('machine_power_state')
    .selectAll()
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return row && toPowerStateRecord(row);
}

interface PowerStateRow {
  machine_id: string;
  power_state: PowerState | null;
  power_state_read_at: Date | null;
  power_read_failed_at: Date | null;
  power_read_failed_cause: string | null;
}

export function toPowerStateRecord(row: PowerStateRow): PowerStateRecord {
  return {
    machineId: row.machine_id,
    state: row.power_state,
    readAt: row.power_state_read_at,
    failedAt: row.power_read_failed_at,
    failedCause: row.power_read_failed_cause,
  };
}

/**
 * `fn` in a READ COMMITTED transaction of its own: the power sync's
 * statements lock the rows they write and are exact there, where
 * SERIALIZABLE would fail concurrent syncs on each other's index pages.
 */
function readCommitted<T>(db: Kysely<Database>, fn: (trx: Kysely<Database>) => Promise<T>): Promise<T> {
  return db.transaction().setIsolationLevel('read committed').execute(fn);
}

function resultColumns(machineId: string, result: PowerReadResult): Record<string, unknown> {
  if ('state' in result) {
    if (!STATES.includes(result.state)) {
      throw new BMDBError(
        `power state of machine ${machineId}: ${JSON.stringify(result.state)} is none of ${STATES.join(', ')}`,
      );
    }
    return {
      power_state: result.state,
      power_state_read_at: sql<Date>`now()`,
      power_read_failed_at: null,
      power_read_failed_cause: null,
    };
  }
  return { power_read_failed_at: sql<Date>`now()`, power_read_failed_cause: result.failure };
}
