import type { BMDB, Session } from '@bmaas/bmdb-controlloop';
import { addProvided, holdMachine, newMachine, recordOperatorAction, recordPowerState } from '@bmaas/bmdb-model';
import type { TestDatabase } from './database.js';

/** A failure cause that must show as text, never run. */
export const HOSTILE_CAUSE = '<script>alert("pwned")</script> & "quotes" \'too\'';

/** A hold's reason from an operator, that must show as text too. */
export const HOSTILE_REASON = 'swap <b>PSU</b> & fans';

/** Machines of {@link seedFleet}, one per lifecycle stage and then some, by role. */
export interface SeededFleet {
  readonly session: Session;
  /** Equinix, agent started and heartbeating; a long history. */
  readonly heartbeating: string;
  /** Dummy, provided, nothing started. */
  readonly provided: string;
  /** Dummy, an agent start held by the live session. */
  readonly agentStarting: string;
  /** Agent started a minute ago, no heartbeat yet. */
  readonly agentStarted: string;
  /** Last heartbeat 20 minutes ago: awaiting recovery. */
  readonly awaitingRecovery: string;
  /** No Provided tag. */
  readonly unprovided: string;
  /** Dummy, its OS installation (generation 2) succeeded: installed, no agent. */
  readonly installed: string;
  /** Dummy, provided, backing off from agent starts with {@link HOSTILE_CAUSE} (and an expired backoff). */
  readonly backedOff: string;
  /**
   * Held by `tech@rack3` with {@link HOSTILE_REASON} an hour ago (the awaiting-recovery machine), and
   * powered off by them; power states read: heartbeating On, held Off, agent started PoweringOn,
   * backed off a failed read; the others never read.
   */
  readonly held: string;
  /** The agent-started machine's OS installation failed (generation 1) with {@link HOSTILE_CAUSE} as the agent's error. */
  readonly installationFailed: string;
  /** Every machine's ID, by role. */
  readonly all: Readonly<Record<string, string>>;
}

/**
 * Fills a migrated BMDB with one machine per stage, a live session holding
 * work, history with failures and backoffs whose cause is hostile HTML.
 * Times are moved into the past in the database, never waited for.
 */
export async function seedFleet(db: TestDatabase, bmdb: BMDB): Promise<SeededFleet> {
  const session = await bmdb.startSession({ processor: 'shepherd-initializer' });
  const provide = (provider: string, providerId: string, extra: { ip?: string; location?: string } = {}) =>
    session.transact(async (q) => {
      const id = await newMachine(q);
      await addProvided(q, id, {
        provider,
        providerId,
        providerIpAddress: extra.ip ?? null,
        providerLocation: extra.location ?? null,
        providerStatus: 'Running',
      });
      return id;
    });
  const heartbeating = await provide('Equinix', 'e1a2b3c4-0000-4000-8000-000000000001', {
    ip: '147.75.1.2',
    location: 'da11',
  });
  const provided = await provide('Dummy', 'dummy-provided');
  const agentStarting = await provide('Dummy', 'dummy-starting');
  const agentStarted = await provide('Dummy', 'dummy-started');
  const awaitingRecovery = await provide('Dummy', 'dummy-silent');
  const backedOff = await provide('Dummy', 'dummy-backoff');
  const unprovided = await session.transact((q) => newMachine(q));
  const installed = await provide('Dummy', 'dummy-installed');
  await db.admin(
    `INSERT INTO machine_os_installation_request (machine_id, generation, image_url, image_sha256, root_device,
       compression, requested_by, installation_state, delivered_at, installation_ended_at, installation_error)
     VALUES ($1, 2, 'https://images.example.com/debian-12.img.gz', repeat('ab', 32), '/dev/sda', 'gzip', 'alice@ops',
       'Succeeded', now() - interval '30 minutes', now() - interval '20 minutes', NULL),
            ($2, 1, 'http://images.example.com/broken.img', repeat('cd', 32), '/dev/vda', 'none', 'alice@ops',
       'Failed', now() - interval '10 minutes', now() - interval '5 minutes', $3)`,
    [installed, agentStarted, HOSTILE_CAUSE],
  );

  const key = new Uint8Array(32).fill(7);
  await db.admin(
    `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) VALUES
       ($1, now() - interval '2 hours', $4), ($2, now() - interval '1 minute', $4), ($3, now() - interval '3 hours', $4)`,
    [heartbeating, agentStarted, awaitingRecovery, Buffer.from(key)],
  );
  await db.admin(
    `INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) VALUES
       ($1, now() - interval '5 seconds'), ($2, now() - interval '20 minutes')`,
    [heartbeating, awaitingRecovery],
  );
  await session.work('ShepherdAgentStart', async () => [agentStarting]);
  await db.admin(
    `INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause) VALUES
       ($1, 'ShepherdAgentStart', 'Started', now() - interval '2 hours 1 minute', NULL),
       ($1, 'ShepherdAgentStart', 'Failed', now() - interval '2 hours 30 seconds', 'ssh: connection refused'),
       ($1, 'ShepherdAgentStart', 'Started', now() - interval '2 hours 10 seconds', NULL),
       ($1, 'ShepherdAgentStart', 'Finished', now() - interval '2 hours', NULL),
       ($2, 'ShepherdAgentStart', 'Started', now() - interval '10 minutes', NULL),
       ($2, 'ShepherdAgentStart', 'Failed', now() - interval '9 minutes', $3),
       ($2, 'ShepherdAgentStart', 'Started', now() - interval '3 minutes', NULL),
       ($2, 'ShepherdAgentStart', 'Failed', now() - interval '2 minutes', $3)`,
    [heartbeating, backedOff, HOSTILE_CAUSE],
  );
  await db.admin(
    `INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds) VALUES
       ($1, 'ShepherdAgentStart', now() + interval '5 minutes', $2, 300),
       ($1, 'ShepherdRecovery', now() - interval '1 hour', 'reboot failed: 503', 60)`,
    [backedOff, HOSTILE_CAUSE],
  );
  const held = awaitingRecovery;
  await session.transact(async (q) => {
    await holdMachine(q, held, { reason: HOSTILE_REASON, actor: 'tech@rack3' });
    await recordOperatorAction(q, {
      machineId: held,
      action: 'PowerOff',
      outcome: 'Succeeded',
      reason: HOSTILE_REASON,
      actor: 'tech@rack3',
      detail: { graceful: false, command: 'ForceOff' },
    });
    await recordPowerState(q, heartbeating, { state: 'On' });
    await recordPowerState(q, held, { state: 'Off' });
    await recordPowerState(q, agentStarted, { state: 'PoweringOn' });
    await recordPowerState(q, backedOff, { failure: 'BMC https://10.1.0.9 unreachable' });
  });
  await db.admin(`UPDATE machine_hold SET held_at = now() - interval '1 hour' WHERE machine_id = $1`, [held]);
  await db.admin(
    `UPDATE operator_history SET "timestamp" = now() - interval '1 hour' + make_interval(secs => CASE action WHEN 'Hold' THEN 0 ELSE 1 END)
     WHERE machine_id = $1`,
    [held],
  );
  return {
    session,
    heartbeating,
    provided,
    agentStarting,
    agentStarted,
    awaitingRecovery,
    unprovided,
    backedOff,
    held,
    installed,
    installationFailed: agentStarted,
    all: { heartbeating, provided, agentStarting, agentStarted, awaitingRecovery, unprovided, backedOff, installed },
  };
}
