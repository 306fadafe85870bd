import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import type pg from 'pg';
import { PreparedQuery, type Statement } from './prepared-query.js';

/** pg's own conversion of a query value to what it sends (arrays, dates, JSON...), which `@types/pg` leaves out. */
const { prepareValue } = createRequire(import.meta.url)('pg/lib/utils.js') as {
  prepareValue(value: unknown): string | Buffer | null;
};

/**
 * Runs compiled queries as named prepared statements: each connection of the
 * pool parses and plans a statement once, then only binds and executes it,
 * without asking again for the rows' description (see PreparedQuery). For
 * the claim, a statement of many CTEs run for every work item, planning
 * costs more than executing.
 */
export class PreparedStatements {
  /** Statements by SQL text; a name is a digest of the text, so every connection agrees. */
  readonly #statements = new Map<string, Statement>();

  constructor(private readonly pool: pg.Pool) {}

  async query<R>(compiled: { readonly sql: string; readonly parameters: readonly unknown[] }): Promise<R[]> {
    let statement = this.#statements.get(compiled.sql);
    if (statement === undefined) {
      const name = `bmdb_${createHash('sha256').update(compiled.sql).digest('hex').slice(0, 24)}`;
      statement = { name, text: compiled.sql, columns: undefined };
      this.#statements.set(compiled.sql, statement);
    }
    const values = compiled.parameters.map((value) => prepareValue(value));
    const client = await this.pool.connect();
    const typeParser = (oid: number) => client.getTypeParser(oid, 'text');
    try {
      const rows = await new Promise<R[]>((resolve, reject) => {
        client.query(
          new PreparedQuery<R>(statement, values, typeParser, (error, rows) =>
            error ? reject(error) : resolve(rows ?? []),
          ),
        );
      });
      client.release();
      return rows;
    } catch (error) {
      // As pg's pool.query: a client whose query failed is not reused.
      client.release(error instanceof Error ? error : true);
      throw error;
    }
  }
}
