import { createHash } from 'node:crypto';
import type pg from 'pg';

/**
 * Runs compiled queries as named prepared statements: each connection of the
 * pool parses and plans a statement once, then only binds and executes it.
 * For the claim, a statement of many CTEs run for every work item, planning
 * costs more than executing.
 */
export class PreparedStatements {
  /** Statement names by SQL text; a name is a digest of the text, so every connection agrees. */
  readonly #names = new Map<string, string>();

  constructor(private readonly pool: pg.Pool) {}

  async query<R>(compiled: { readonly sql: string; readonly parameters: readonly unknown[] }): Promise<R[]> {
    let name = this.#names.get(compiled.sql);
    if (name === undefined) {
      name = `bmdb_${createHash('sha256').update(compiled.sql).digest('hex').slice(0, 24)}`;
      this.#names.set(compiled.sql, name);
    }
    const result = await this.pool.query<R & pg.QueryResultRow>({
      name,
      text: compiled.sql,
      values: [...compiled.parameters],
    });
    return result.rows;
  }
}
