/** Operators' holds: machines a person is working on, which no loop claims. */
import { type Kysely, sql } from 'kysely';
import { BMDBError } from '../errors.js';
import { type Database, OperatorAction, OperatorOutcome } from '../schema.js';
import { checkActor, checkReason, recordOperatorAction } from './operator-history.js';

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

/** Who holds a machine and why (see {@link Queries.holdMachine}). */
export interface HoldRequest {
  readonly reason: string;
  readonly actor: string;
  /** Particulars for the history entry (a power off's implied hold: `{ impliedBy: 'PowerOff' }`). */
  readonly detail?: Readonly<Record<string, unknown>> | undefined;
}

export async function holdMachine(
  db: Kysely<Database>,
  machineId: string,
  request: HoldRequest,
): Promise<{ readonly hold: MachineHold; readonly placed: boolean }> {
  const what = `hold of machine ${machineId}`;
  checkReason(request.reason, what, 'what is being done to the machine');
  checkActor(request.actor, what);
  const placed = await db
    .insertInto('machine_hold')
    .values({ machine_id: machineId, hold_reason: request.reason, hold_actor: request.actor })
    .onConflict((oc) => oc.column('machine_id').doNothing())
    .returningAll()
    .executeTakeFirst();
  if (placed) {
    await recordOperatorAction(db, {
      machineId,
      action: OperatorAction.Hold,
      outcome: OperatorOutcome.Succeeded,
      reason: request.reason,
      actor: request.actor,
      detail: request.detail,
    });
    return { hold: toHold(placed), placed: true };
  }
  const existing = await machineHold(db, machineId);
  // Released between the insert and the read: a rare race, told as such.
  if (existing === undefined) throw new BMDBError(`${what}: the machine's hold changed concurrently; try again`);
  return { hold: existing, placed: false };
}

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

export async function machineHold(db: Kysely<Database>, machineId: string): Promise<MachineHold | undefined> {
  const row = await db.selectFrom('machine_hold').selectAll().where('machine_id', '=', machineId).executeTakeFirst();
  return row && toHold(row);
}

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

function toHold(row: { machine_id: string; hold_reason: string; hold_actor: string; held_at: Date }): MachineHold {
  return { machineId: row.machine_id, reason: row.hold_reason, actor: row.hold_actor, since: row.held_at };
}
