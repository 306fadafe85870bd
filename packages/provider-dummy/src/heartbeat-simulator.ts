import type { BMDB, Session } from '@bmaas/bmdb-controlloop';
import { runRounds } from '@bmaas/bmdb-controlloop';
import { setAgentHeartbeats, startedAgents } from '@bmaas/bmdb-model';
import { describeError } from '@bmaas/common';
import createDebug from 'debug';
import type { DummyProvider } from './dummy-provider.js';

const log = createDebug('shepherd:dummy');
const detail = createDebug('shepherd:dummy:detail');

/** The least time between two heartbeat summaries at the default log level. */
const SUMMARY_INTERVAL = 60_000;

/** Options of the {@link HeartbeatSimulator}. */
export interface HeartbeatSimulatorOptions {
  /** Milliseconds between heartbeat rounds. Default 10 s. */
  readonly interval?: number;
}

/**
 * Plays the dummy provider's agents: every interval, writes AgentHeartbeat
 * for each started agent that heartbeats (see
 * {@link DummyProvider.agentHeartbeats}). The silent ones are left for the
 * recoverer to find.
 */
export class HeartbeatSimulator {
  readonly #interval: number;

  constructor(
    private readonly provider: DummyProvider,
    options: HeartbeatSimulatorOptions = {},
  ) {
    this.#interval = options.interval ?? 10_000;
    if (!(this.#interval > 0)) throw new RangeError(`heartbeat interval must be > 0, got ${this.#interval}ms`);
  }

  /** The summary last logged, and when (performance.now()). */
  #summary = { line: '0 of 0', at: Number.NEGATIVE_INFINITY };

  /**
   * Sends heartbeat rounds, one every interval, until `signal` aborts (the
   * rules of `runRounds`). A failed round is logged and the next one tried.
   */
  async run(bmdb: BMDB, options: { signal: AbortSignal }): Promise<void> {
    await runRounds(
      {
        signal: options.signal,
        session: { bmdb, processor: 'dummy-heartbeats' },
        interval: this.#interval,
        onFailure: (error, during) =>
          log(during === 'close' ? 'closing session failed: %s' : 'heartbeat round failed: %s', describeError(error)),
      },
      (session) => this.beat(session),
    );
  }

  /** One round; returns how many agents heartbeated. */
  async beat(session: Session): Promise<number> {
    return session.transact(async (q) => {
      const started = await startedAgents(q, this.provider.type);
      const alive = started.filter((a) => this.provider.agentHeartbeats(a.machineId, a.startedAt));
      await setAgentHeartbeats(
        q,
        alive.map((a) => a.machineId),
      );
      this.#summarize(alive.length, started.length);
      return alive.length;
    });
  }

  /**
   * Says how many started agents heartbeat: at most once a minute, and only
   * when it changed; every round under `shepherd:dummy:detail`.
   */
  #summarize(alive: number, started: number): void {
    const line = `${alive} of ${started}`;
    detail('%s started agents heartbeated', line);
    const now = performance.now();
    if (line === this.#summary.line || now - this.#summary.at < SUMMARY_INTERVAL) return;
    this.#summary = { line, at: now };
    log('%s started agents heartbeated', line);
  }
}
