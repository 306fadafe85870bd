import { createHash } from 'node:crypto';
import type pg from 'pg';

/*
 * A statement's execution, as the claims, ends and agent heartbeats send
 * it: pg's own named prepared statements (`pool.query({ name, text, values })`),
 * the name a digest of the text.
 *
 * A query object of this library's own (PreparedQuery: pg's protocol
 * messages driven by hand, so as to ask for a statement's row description
 * once rather than on every execution, with pg pinned exactly for it) stood
 * here until `npm run bench` (BENCH_ONLY=throughput, BENCH_SYSTEMS=bmdb-controlloop:
 * the control loop finishing with a tag, 4,000 items a round, one round a
 * run) measured it against this, the two run in turn, eight runs each, on
 * one 2-core machine shared with other jobs (2026-11-28, load average 5.1
 * to 9.8): it was to stay only where it paid at least 10 %, and it did
 * nowhere.
 *
 * | workers | items/s, PreparedQuery | items/s, pg's own | PreparedQuery / pg's, median of pairs (of medians) | ahead in |
 * | ------- | ---------------------- | ----------------- | ------------------------------------------------ | -------- |
 * | 1       | 769                    | 714               | 1.07 (1.08)                                      | 6 of 8   |
 * | 8       | 3,309                  | 3,239             | 0.97 (1.02)                                      | 3 of 8   |
 * | 32      | 3,155                  | 3,922             | 0.81 (0.80)                                      | 1 of 8   |
 *
 * items/s are medians of the runs; single runs scatter by up to a factor of
 * two (bench/results/issue-40-heartbeat.md has each run).
 */

/** A prepared statement's name: a digest of its text, so every connection agrees, and a new text is a new plan. */
export function statementName(text: string): string {
  return `bmdb_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
}

/**
 * Runs compiled queries as named prepared statements: each connection of the
 * pool parses and plans a statement once, then binds and executes it. For
 * the claim, a statement of many CTEs run for every work item, planning
 * costs more than executing.
 */
export class PreparedStatements {
  /** Statements' names by their SQL text: the digest is taken once a text. */
  readonly #names = new Map<string, string>();

  constructor(private readonly pool: pg.Pool) {}

  async query<R>(compiled: { readonly sql: string; readonly parameters: readonly unknown[] }): Promise<R[]> {
    let name = this.#names.get(compiled.sql);
    if (name === undefined) {
      name = statementName(compiled.sql);
      this.#names.set(compiled.sql, name);
    }
    const result = await this.pool.query({
      name,
      text: compiled.sql,
      values: [...compiled.parameters],
    });
    return result.rows as R[];
  }
}
