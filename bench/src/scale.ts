import { BMDB, type Database } from '@bmaas/bmdb-controlloop';
import {
  agentRecoverySelection,
  agentStartSelection,
  leasePowerReads,
  machinesForAgentRecovery,
  machinesForAgentStart,
  Process,
  powerActionSelection,
} from '@bmaas/bmdb-model';
import { type CompiledQuery, Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
// The claim statement is internal to the library; the bench runs from its sources.
import { claimSelectedStatement } from '../../packages/bmdb-controlloop/src/sql/claim.js';
import { fillFleet, PROVIDER } from './fleet.js';
import type { BenchServer } from './server.js';

const PUBLIC_KEY = new Uint8Array(32);

export interface ScaleResult {
  readonly machines: number;
  /** Milliseconds per claim (`Session.work` with the initializer's selection, one statement). */
  readonly claims: number[];
  /** Milliseconds per finish (release plus setting AgentStarted, one statement). */
  readonly finishes: number[];
  /** EXPLAIN (ANALYZE, BUFFERS) of each selection query, by name. */
  readonly plans: Record<string, string>;
}

/**
 * One claim and one finish at a time, `iterations` times in each of `rounds`
 * sessions, in a BMDB of `machines` machines of which only `ready` need an
 * agent start and a few need recovery: every other machine has a
 * heartbeating agent. The fleet is filled once for all rounds.
 */
export async function claimAtScale(
  server: BenchServer,
  machines: number,
  options: { ready: number; rounds: number; iterations: number },
): Promise<ScaleResult> {
  if (options.rounds * options.iterations > options.ready) throw new RangeError('not enough ready machines');
  const name = `bench_scale_${machines}`;
  const url = await server.createDatabase(name);
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-scale', runtimeInfo: 'bench' });
  try {
    await server.withClient(name, (client) => fillFleet(client, { total: machines, ready: options.ready, lost: 10 }));
    const selection = agentStartSelection(bmdb.db, { provider: PROVIDER });
    const claims: number[] = [];
    const finishes: number[] = [];
    let plans: Record<string, string> = {};
    for (let round = 0; round < options.rounds; round++) {
      const session = await bmdb.startSession({ processor: 'bench-scale' });
      if (round === 0) plans = await explainSelections(url, session.id);
      for (let i = 0; i < options.iterations; i++) {
        const claimStart = performance.now();
        const work = await session.work(Process.ShepherdAgentStart, selection);
        const claimed = performance.now();
        await work.finish({ set: { agentStarted: { publicKey: PUBLIC_KEY } } });
        finishes.push(performance.now() - claimed);
        claims.push(claimed - claimStart);
      }
      await session.close();
    }
    return { machines, claims, finishes, plans };
  } finally {
    await bmdb.close();
    await server.dropDatabase(name);
  }
}

/**
 * Planner settings of the library's pools (connection.ts): its transaction
 * pool discourages sequential scans; its claim pool also hash and merge joins.
 */
const TRANSACTION_POOL_OPTIONS = '-c enable_seqscan=off';
const CLAIM_POOL_OPTIONS = '-c enable_seqscan=off -c enable_mergejoin=off -c enable_hashjoin=off';

/** The selection queries and the claim as the library sends them, captured and explained. */
async function explainSelections(url: string, sessionId: string): Promise<Record<string, string>> {
  const pool = new pg.Pool({ connectionString: url, max: 1, options: TRANSACTION_POOL_OPTIONS });
  const claimPool = new pg.Pool({ connectionString: url, max: 1, options: CLAIM_POOL_OPTIONS });
  const captured: CompiledQuery[] = [];
  const db = new Kysely<Database>({
    dialect: new PostgresDialect({ pool }),
    log: (event) => {
      if (event.level === 'query') captured.push(event.query);
    },
  });
  try {
    const q = db;
    const plans: Record<string, string> = {};
    const selections: Record<string, () => Promise<unknown>> = {
      machinesForAgentStart: () => machinesForAgentStart(q, { provider: PROVIDER, limit: 1 }),
      machinesForAgentRecovery: () => machinesForAgentRecovery(q, { provider: PROVIDER, limit: 1 }),
      // The power sync's next reads: the never read, then the oldest read over a minute ago (none here).
      leasePowerReads: () => leasePowerReads(q, { provider: PROVIDER, limit: 4, intervalSeconds: 60 }),
    };
    for (const [selection, run] of Object.entries(selections)) {
      captured.length = 0;
      await run();
      // A lease runs in a transaction of its own: its BEGIN and COMMIT have no plan.
      const query = captured.filter((c) => /^\s*(select|with)\b/i.test(c.sql)).at(-1);
      if (!query) throw new Error(`${selection} sent no query`);
      plans[selection] = await explain(pool, query.sql, query.parameters);
    }
    // The claim statement the runner sends, at the READ COMMITTED it runs at.
    const [held] = (await db.selectFrom('machine_hold').select('machine_id').limit(1).execute()).map(
      (r) => r.machine_id,
    );
    for (const [name, selection] of [
      ['claim (agent start)', agentStartSelection(q, { provider: PROVIDER })],
      ['claim (agent recovery)', agentRecoverySelection(q, { provider: PROVIDER })],
      [
        'claim (power action on a held machine)',
        powerActionSelection(q, held ?? '00000000-0000-4000-8000-000000000000'),
      ],
    ] as const) {
      const claim = claimSelectedStatement(selection.process, selection.query, [sessionId]).compile(db);
      plans[name] = await explain(claimPool, claim.sql, claim.parameters);
    }
    return plans;
  } finally {
    await db.destroy();
    await claimPool.end();
  }
}

/** EXPLAIN (ANALYZE, BUFFERS) of a statement, rolled back afterwards. */
export async function explain(pool: pg.Pool, text: string, values: readonly unknown[]): Promise<string> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows } = await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN (ANALYZE, BUFFERS, SUMMARY ON) ${text}`, [
      ...values,
    ]);
    return rows.map((row) => row['QUERY PLAN']).join('\n');
  } finally {
    await client.query('ROLLBACK');
    client.release();
  }
}
