import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { PreparedStatements } from '../src/internal/prepared.js';

let pool: pg.Pool;
let prepared: PreparedStatements;

const db = await createTestDatabase();

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: db.url, max: 3 });
  pool.on('error', () => {});
  prepared = new PreparedStatements(pool);
});
afterAll(() => pool.end());

const TYPED = `
  SELECT $1::int AS n, $2::uuid AS id, $3::timestamptz AS at, $4::boolean AS yes,
         $5::uuid[] AS ids, $6::text AS nothing, $7::bytea AS bytes, $8::bigint AS big`;

describe('PreparedStatements', () => {
  test('rows keep their types on every execution, on every connection, after the first described them', async () => {
    const id = '0b8e4c6e-6d1f-4f6a-9a51-3c2f7f0e2a10';
    const at = new Date('2026-11-23T12:00:00.000Z');
    const values = [7, id, at, true, [id, id], null, Buffer.from([1, 2, 3]), '9007199254740993'];
    // Held clients force the later executions onto connections that never ran the statement.
    const results = await Promise.all(Array.from({ length: 6 }, () => prepared.query(typedQuery(values))));
    for (const rows of [...results, await prepared.query(typedQuery(values))]) {
      expect(rows).toEqual([
        {
          n: 7,
          id,
          at,
          yes: true,
          ids: [id, id],
          nothing: null,
          bytes: Buffer.from([1, 2, 3]),
          big: '9007199254740993',
        },
      ]);
    }
    // Every connection of the pool parsed it once, and holds it prepared.
    const statements = await Promise.all(
      Array.from({ length: 3 }, async () => {
        const client = await pool.connect();
        try {
          return (await client.query('SELECT count(*)::int AS n FROM pg_prepared_statements')).rows[0].n;
        } finally {
          client.release();
        }
      }),
    );
    expect(statements.every((n) => n >= 1)).toBe(true);
  });

  test('many rows, and none', async () => {
    const many = { sql: 'SELECT g AS n, g::text AS s FROM generate_series(1, $1::int) g', parameters: [500] };
    expect(await prepared.query(many)).toHaveLength(500);
    expect(await prepared.query({ ...many, parameters: [0] })).toEqual([]);
    expect((await prepared.query<{ n: number; s: string }>({ ...many, parameters: [3] })).at(-1)).toEqual({
      n: 3,
      s: '3',
    });
  });

  test("a statement's error rejects with the server's code, and the pool carries on", async () => {
    const failing = { sql: 'SELECT 1 / $1::int AS quotient', parameters: [0] };
    await expect(prepared.query(failing)).rejects.toMatchObject({ code: '22012' });
    expect(await prepared.query({ ...failing, parameters: [1] })).toEqual([{ quotient: 1 }]);
    await expect(prepared.query({ sql: 'SELECT nonsense(', parameters: [] })).rejects.toMatchObject({
      code: '42601',
    });
  });

  test('a value pg cannot send fails the call before anything reaches the server', async () => {
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    await expect(prepared.query({ sql: 'SELECT $1::jsonb AS j', parameters: [circular] })).rejects.toThrow();
    expect(await prepared.query({ sql: 'SELECT $1::jsonb AS j', parameters: [{ a: 1 }] })).toEqual([{ j: { a: 1 } }]);
  });
});

function typedQuery(values: unknown[]) {
  return { sql: TYPED, parameters: values };
}
