import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import type pg from 'pg';

/*
 * A statement's execution, as the claims, ends and agent heartbeats send
 * it. This file reaches into pg below its documented API: its value
 * conversion (`pg/lib/utils.js`), its connection's protocol messages and its
 * record of parsed statements (PreparedQuery). That is why the library pins
 * pg's version exactly in its package.json; test/prepared.test.ts runs every
 * path of it against a real server.
 *
 * It is kept because `npm run bench` (BENCH_ONLY=throughput, the control loop
 * finishing with a tag, 4,000 items a round) measured it worth at least 10 %
 * of throughput at some parallelism against pg's own named prepared
 * statements (`pool.query({ name, text, values })`, the name the digest of
 * the text, `statementName`), the two variants run in turn, one run each,
 * on one 2-core machine:
 *
 * | workers | pairs | items/s, this file | items/s, pg's own | this / pg's, median of pairs | ahead in | Node CPU per item, this / pg's | load average |
 * | ------- | ----- | ------------------ | ----------------- | ---------------------------- | -------- | ------------------------------ | ------------ |
 * | 1       | 8     | 154                | 162               | 0.98                         | 4 of 8   | 1,264 / 1,482 µs (−15 %)       | 7.6 to 19.7  |
 * | 8       | 14    | 558                | 570               | 1.19                         | 8 of 14  | 328 / 310 µs (+6 %)            | 7.6 to 19.7  |
 * | 32      | 14    | 862                | 786               | 1.13 (medians +10 %)         | 8 of 14  | 178 / 189 µs (−6 %)            | 7.6 to 19.7  |
 *
 * items/s are medians of the runs (2026-11-26, other jobs sharing the two
 * cores, so single runs scatter by a factor of two); Node CPU per item from
 * 4 pairs. At 32 workers it is worth +10 % (medians) to +13 % (median of
 * pairs), at the threshold under that noise: measure again on a quiet
 * machine before trusting either way; if it falls below 10 %, this file goes,
 * the claims, ends and heartbeats call `pool.query({ name, text, values })`,
 * and pg is no longer pinned.
 */

/** pg's own conversion of a query value to what it sends (arrays, dates, JSON...), which `@types/pg` leaves out. */
const { prepareValue } = createRequire(import.meta.url)('pg/lib/utils.js') as {
  prepareValue(value: unknown): string | Buffer | null;
};

/** A prepared statement's name: a digest of its text, so every connection agrees, and a new text is a new plan. */
export function statementName(text: string): string {
  return `bmdb_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
}

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
      const name = statementName(compiled.sql);
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

/** A column of a prepared statement's rows: its name and how to read its text. */
interface Column {
  readonly name: string;
  readonly parse: (text: string) => unknown;
}

/** What a statement's executions share: its name, text and, once known, its columns. */
interface Statement {
  readonly name: string;
  readonly text: string;
  /** Known after the first execution anywhere: the same text has the same columns on every connection. */
  columns: readonly Column[] | undefined;
}

/** The messages a query sees that `@types/pg` leaves untyped. */
interface RowDescription {
  readonly fields: readonly { readonly name: string; readonly dataTypeID: number; readonly format?: string }[];
}
interface DataRow {
  readonly fields: readonly (string | null)[];
}

/**
 * One execution of a named prepared statement on a pg client, as a query
 * object the client runs in its turn (pg's `Submittable`, which pg-cursor
 * also is). It differs from pg's own `Query` in one thing: it asks for the
 * row description only while the statement's columns are unknown. pg's
 * `Query` sends Describe on every execution and rebuilds the row parsers
 * from the answer, a cost per round trip that a lone worker, two round trips
 * per item, pays in full.
 *
 * Values are turned into their text form before anything is sent (pg's own
 * `prepareValue`, by the caller), so a value that cannot be sent fails the
 * call without touching the connection.
 */
class PreparedQuery<R> {
  /** pg tracks parsed statements per connection by these two. */
  readonly name: string;
  readonly text: string;
  /** Set by pg's client to wrap a read timeout around it; called once. */
  callback: (error: Error | null, rows?: R[]) => void;
  readonly #rows: R[] = [];
  #columns: readonly Column[] | undefined;

  constructor(
    private readonly statement: Statement,
    private readonly values: readonly (string | Buffer | null)[],
    private readonly typeParser: (oid: number) => (text: string) => unknown,
    done: (error: Error | null, rows?: R[]) => void,
  ) {
    this.name = statement.name;
    this.text = statement.text;
    this.#columns = statement.columns;
    this.callback = done;
  }

  submit(connection: pg.Connection): void {
    const { stream } = connection;
    // pg's record of what this connection has parsed, kept by its client.
    const parsed = (connection as pg.Connection & { parsedStatements: Record<string, string> }).parsedStatements;
    // One write for the whole exchange (pg's Query does the same).
    stream.cork();
    try {
      if (parsed[this.name] === undefined) {
        connection.parse({ name: this.name, text: this.text, types: [] }, true);
      }
      connection.bind({ statement: this.name, values: [...this.values] }, true);
      if (!this.#columns) connection.describe({ type: 'P', name: '' }, true);
      connection.execute({ portal: '' }, true);
      connection.sync();
    } finally {
      stream.uncork();
    }
  }

  handleRowDescription(message: RowDescription): void {
    const columns = message.fields.map((field) => ({ name: field.name, parse: this.typeParser(field.dataTypeID) }));
    this.#columns = columns;
    this.statement.columns = columns;
  }

  handleDataRow(message: DataRow): void {
    const columns = this.#columns;
    if (!columns) return; // never: the description comes first when asked for
    const row: Record<string, unknown> = {};
    for (let i = 0; i < columns.length; i++) {
      const column = columns[i] as Column;
      const text = message.fields[i];
      row[column.name] = text === null || text === undefined ? null : column.parse(text);
    }
    this.#rows.push(row as R);
  }

  handleReadyForQuery(): void {
    this.callback(null, this.#rows);
  }

  handleError(error: Error): void {
    this.callback(error);
  }

  handleCommandComplete(): void {}
  handleEmptyQuery(): void {}
  handlePortalSuspended(): void {}
  handleCopyInResponse(connection: pg.Connection): void {
    (connection as pg.Connection & { sendCopyFail(message: string): void }).sendCopyFail(
      'a prepared statement of the BMDB does not copy',
    );
  }
  handleCopyData(): void {}
}
