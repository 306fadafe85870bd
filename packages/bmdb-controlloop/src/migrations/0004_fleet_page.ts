import { type Kysely, sql } from 'kysely';

/**
 * What the read-only fleet page (`@bmaas/web`) needs to answer every page from
 * indexes at 100,000 machines and millions of history rows. Adds to the
 * schema and changes nothing in it. Released: never edit, add a migration.
 *
 * - `sessions.processor`: which loop holds a session (`shepherd-initializer`),
 *   so the page can say which shepherds are alive and doing what. Null for
 *   sessions started before this migration.
 * - `work_history_failed_idx`: the fleet's most recent failures, newest
 *   first, without reading every machine's history.
 * - `machine_provided_provider_machine_idx`: the machines of one provider in
 *   machine ID order, for keyset pages filtered by provider.
 * - `machine_provided_provider_id_pattern_idx`: search by provider ID or its
 *   prefix across providers (`text_pattern_ops` serves `LIKE 'prefix%'`
 *   whatever the database's collation).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`ALTER TABLE sessions ADD COLUMN processor text`.execute(db);
  await sql`
    CREATE INDEX work_history_failed_idx ON work_history ("timestamp") WHERE event = 'Failed'`.execute(db);
  await sql`
    CREATE INDEX machine_provided_provider_machine_idx ON machine_provided (provider, machine_id)`.execute(db);
  await sql`
    CREATE INDEX machine_provided_provider_id_pattern_idx ON machine_provided (provider_id text_pattern_ops)`.execute(
    db,
  );
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP INDEX machine_provided_provider_id_pattern_idx`.execute(db);
  await sql`DROP INDEX machine_provided_provider_machine_idx`.execute(db);
  await sql`DROP INDEX work_history_failed_idx`.execute(db);
  await sql`ALTER TABLE sessions DROP COLUMN processor`.execute(db);
}
