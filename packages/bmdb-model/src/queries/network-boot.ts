/**
 * Network boots in the BMDB (migration 0016): armed by the agent booter that
 * claimed the machine, answered by any shepherd process's boot files, whose
 * config, holding a token minted as it is served, is served once.
 */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import { isUuid } from '@bmaas/common';
import { type Kysely, sql } from 'kysely';
import { type Database, OperatorAction, Process } from '../schema.js';
import { deleteAgentHeartbeat } from './agent-tags.js';
import { type EnrollmentToken, issueEnrollmentToken } from './enrollment.js';
import { recordOperatorAction } from './operator-history.js';

/** A MAC address as the BMDB keeps it: lower case, colons. */
const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const CAPABILITY = /^[A-Za-z0-9_-]{43}$/;

/** One network boot of one machine, as {@link armNetworkBoot} takes it. */
export interface NetworkBootArming {
  readonly machineId: string;
  /** The boot's ID: the token minted for it carries it (`AgentEnrollmentState.bootId`). */
  readonly bootId: string;
  /** The path part of the boot's script and config URLs: 32 random bytes, base64url. */
  readonly capability: string;
  /** The machine's MACs its script is answered by: lower case, colons. */
  readonly macs: readonly string[];
  /** The serialized `cloud.agent.api.TakeoverInit` its config holds. */
  readonly takeoverInit: Uint8Array;
  /** The agent's flags its config holds. */
  readonly agentFlags: readonly string[];
  /** How long the token minted when the config is served is good for. */
  readonly tokenValidForSeconds: number;
}

/** A live network boot answered by a MAC. */
export interface LiveNetworkBoot {
  readonly machineId: string;
  readonly capability: string;
}

/** What serving a network boot's config gave. */
export type NetworkBootConfig =
  | {
      readonly served: true;
      readonly machineId: string;
      readonly takeoverInit: Uint8Array;
      readonly agentFlags: readonly string[];
      /** Minted now, for this boot; its plain text is here and in the config alone. */
      readonly token: EnrollmentToken;
    }
  | {
      readonly served: false;
      readonly machineId: string;
      /** `AlreadyServed`: fetched again while the boot waits; `NotLive`: its boot ended, or lost its claim. */
      readonly reason: 'AlreadyServed' | 'NotLive';
      /** To whom the config was served, if it was. */
      readonly servedTo: string | undefined;
      /** The agent this boot's token enrolled lost its AgentStarted: it may not be the machine's. */
      readonly distrusted: boolean;
    };

/** A network boot's config, as the agent booter waiting for it sees it. */
export interface NetworkBootState {
  readonly configServedAt: Date | undefined;
  readonly configServedTo: string | undefined;
  /** The first fetch of the config that was refused (fetched again, or after the boot). */
  readonly configRefusedAt: Date | undefined;
  readonly configRefusedTo: string | undefined;
}

/**
 * A boot is live while it has not ended and the agent booter's claim on its
 * machine is still held by the session it was armed under, alive: a booter
 * that crashed, or lost its claim, leaves no boot answered.
 */
const live = sql<boolean>`b.ended_at IS NULL AND EXISTS (
  SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
  WHERE w.machine_id = b.machine_id AND w.process = ${Process.ShepherdAgentBoot} AND w.session_id = b.session_id
    AND s.deadline > now())`;

/**
 * Arms a network boot of `boot.machineId` under the agent booter's claim on
 * it (process `ShepherdAgentBoot`), replacing the machine's last one: from
 * now until {@link endNetworkBoot}, or until the claim ends, any process's
 * boot files answer its script by its MACs and serve its config once.
 *
 * @throws {@link BMDBError} naming the machine: a MAC, capability or ID that is none, or no agent boot claim on it
 */
export async function armNetworkBoot(db: Kysely<Database>, boot: NetworkBootArming): Promise<void> {
  const { machineId } = boot;
  const what = `network boot of machine ${machineId}`;
  if (!isUuid(machineId) || !isUuid(boot.bootId)) throw new BMDBError(`${what}: machine or boot ID is no UUID`);
  const badMac = boot.macs.find((mac) => !MAC.test(mac));
  if (badMac !== undefined) throw new BMDBError(`${what}: MAC ${JSON.stringify(badMac)} is not aa:bb:cc:dd:ee:ff`);
  if (!CAPABILITY.test(boot.capability)) throw new BMDBError(`${what}: the capability is not 43 base64url characters`);
  if (!Number.isInteger(boot.tokenValidForSeconds) || boot.tokenValidForSeconds < 1) {
    throw new BMDBError(`${what}: tokenValidForSeconds must be a whole number of seconds ≥ 1`);
  }
  const { rows } = await sql<{ machine_id: string }>`
    INSERT INTO machine_network_boot AS b (machine_id, boot_id, session_id, capability, macs, takeover_init,
      agent_flags, token_valid_seconds, armed_at)
    SELECT w.machine_id, ${boot.bootId}, w.session_id, ${boot.capability}, ${[...boot.macs]}::text[],
      ${Buffer.from(boot.takeoverInit)}, ${[...boot.agentFlags]}::text[], ${boot.tokenValidForSeconds}, now()
    FROM work w WHERE w.machine_id = ${machineId} AND w.process = ${Process.ShepherdAgentBoot}
    ON CONFLICT (machine_id) DO UPDATE
    SET boot_id = excluded.boot_id, session_id = excluded.session_id, capability = excluded.capability,
        macs = excluded.macs, takeover_init = excluded.takeover_init, agent_flags = excluded.agent_flags,
        token_valid_seconds = excluded.token_valid_seconds, armed_at = excluded.armed_at, ended_at = NULL,
        config_served_at = NULL, config_served_to = NULL, config_refused_at = NULL, config_refused_to = NULL
    RETURNING machine_id`.execute(db);
  if (rows.length === 0) throw new BMDBError(`${what}: the machine has no ${Process.ShepherdAgentBoot} claim`);
}

/**
 * Ends boot `bootId` of `machineId`: its script and config are answered no
 * more. Another boot of the machine is left alone. Returns whether it ended
 * now (false: ended before, replaced, or never armed).
 */
export async function endNetworkBoot(db: Kysely<Database>, machineId: string, bootId: string): Promise<boolean> {
  if (!isUuid(machineId) || !isUuid(bootId)) return false;
  const { rows } = await sql<{ machine_id: string }>`
    UPDATE machine_network_boot SET ended_at = now()
    WHERE machine_id = ${machineId} AND boot_id = ${bootId} AND ended_at IS NULL
    RETURNING machine_id`.execute(db);
  return rows.length > 0;
}

/**
 * The live network boots answered by `mac` (lower case, colons): one, or
 * none, or several when the inventory gave two machines one MAC (at most
 * two are returned: enough to say so).
 */
export async function liveNetworkBootsByMac(db: Kysely<Database>, mac: string): Promise<LiveNetworkBoot[]> {
  if (!MAC.test(mac)) return [];
  const { rows } = await sql<{ machine_id: string; capability: string }>`
    SELECT b.machine_id, b.capability FROM machine_network_boot b
    WHERE b.macs @> ARRAY[${mac}]::text[] AND ${live}
    ORDER BY b.armed_at DESC LIMIT 2`.execute(db);
  return rows.map((row) => ({ machineId: row.machine_id, capability: row.capability }));
}

/** The machine of the live network boot of `capability`, if there is one. */
export async function liveNetworkBoot(db: Kysely<Database>, capability: string): Promise<string | undefined> {
  if (!CAPABILITY.test(capability)) return undefined;
  const { rows } = await sql<{ machine_id: string }>`
    SELECT b.machine_id FROM machine_network_boot b WHERE b.capability = ${capability} AND ${live}`.execute(db);
  return rows[0]?.machine_id;
}

/**
 * Serves the config of the network boot of `capability` to `fetchedBy` (an
 * address), once: one conditional UPDATE marks it served while its boot is
 * live, and in the same transaction the boot's enrollment token is minted
 * (replacing the machine's last one), so its plain text never sits in the
 * database and two processes never serve one config. A fetch that finds it
 * served, or its boot not live, is refused: the first such is kept on the
 * boot (the agent booter waiting for it fails it) and each is recorded in
 * the machine's operator history (`ServeBootConfig`, `Refused`), as a first
 * serve is (`Succeeded`). A config fetched again after it was served means
 * that whoever fetched it first had the token: an agent the token enrolled
 * loses its AgentStarted (and heartbeat) in the same transaction, so neither
 * fetcher's agent is trusted and the machine needs a boot again. Undefined
 * for a capability no boot has.
 */
export async function serveNetworkBootConfig(
  db: Kysely<Database>,
  capability: string,
  fetchedBy: string,
): Promise<NetworkBootConfig | undefined> {
  if (!CAPABILITY.test(capability)) return undefined;
  return db
    .transaction()
    .setIsolationLevel('read committed')
    .execute(async (trx) => {
      // READ COMMITTED: a concurrent serve holds the row; this UPDATE waits, re-reads it and matches nothing.
      const { rows } = await sql<{
        machine_id: string;
        boot_id: string;
        takeover_init: Buffer;
        agent_flags: string[];
        token_valid_seconds: number;
      }>`
        UPDATE machine_network_boot b SET config_served_at = now(), config_served_to = ${fetchedBy}
        WHERE b.capability = ${capability} AND b.config_served_at IS NULL AND ${live}
        RETURNING b.machine_id, b.boot_id, b.takeover_init, b.agent_flags, b.token_valid_seconds`.execute(trx);
      const [boot] = rows;
      if (boot !== undefined) {
        const token = await issueEnrollmentToken(trx, boot.machine_id, {
          validForSeconds: boot.token_valid_seconds,
          bootId: boot.boot_id,
        });
        await recordOperatorAction(trx, {
          machineId: boot.machine_id,
          action: OperatorAction.ServeBootConfig,
          outcome: 'Succeeded',
          actor: fetchedBy,
          detail: { bootId: boot.boot_id, servedTo: fetchedBy },
        });
        return {
          served: true,
          machineId: boot.machine_id,
          takeoverInit: boot.takeover_init,
          agentFlags: boot.agent_flags,
          token,
        };
      }
      const refused = await sql<{
        machine_id: string;
        boot_id: string;
        served_to: string | null;
        served_at: Date | null;
      }>`
        UPDATE machine_network_boot b
        SET config_refused_at = coalesce(b.config_refused_at, now()),
            config_refused_to = coalesce(b.config_refused_to, ${fetchedBy})
        WHERE b.capability = ${capability}
        RETURNING b.machine_id, b.boot_id, b.config_served_to AS served_to, b.config_served_at AS served_at`.execute(
        trx,
      );
      const [row] = refused.rows;
      if (row === undefined) return undefined;
      const reason = row.served_at === null ? 'NotLive' : 'AlreadyServed';
      const servedTo = row.served_to ?? undefined;
      // Served before: whoever fetched it first had the token. An agent that token enrolled, whoever's it is, is
      // trusted no more: its AgentStarted goes (its heartbeats are refused), and the machine needs a boot again.
      const distrusted =
        reason === 'AlreadyServed' &&
        (
          await sql<{ machine_id: string }>`
            DELETE FROM machine_agent_started s USING machine_agent_enrollment e
            WHERE s.machine_id = ${row.machine_id} AND e.machine_id = s.machine_id AND e.boot_id = ${row.boot_id}
              AND e.enrolled_at IS NOT NULL AND s.agent_started_at >= e.enrolled_at
            RETURNING s.machine_id`.execute(trx)
        ).rows.length > 0;
      if (distrusted) await deleteAgentHeartbeat(trx, row.machine_id);
      await recordOperatorAction(trx, {
        machineId: row.machine_id,
        action: OperatorAction.ServeBootConfig,
        outcome: 'Refused',
        actor: fetchedBy,
        cause:
          reason === 'AlreadyServed'
            ? `machine ${row.machine_id}: its network boot's config was fetched again, by ${fetchedBy}, after it was served to ${servedTo}: the boot fails; ${distrusted ? 'the agent its token enrolled is trusted no more (AgentStarted removed), so the machine is booted again' : 'its token had enrolled no agent'}`
            : `machine ${row.machine_id}: its network boot's config was fetched by ${fetchedBy} while no boot waits for it`,
        detail: { bootId: row.boot_id, reason, fetchedBy, distrusted, ...(servedTo === undefined ? {} : { servedTo }) },
      });
      return { served: false, machineId: row.machine_id, reason, servedTo, distrusted };
    });
}

/** The config of boot `bootId` of `machineId`: served, refused, to whom; undefined when the machine's last network boot is another. */
export async function networkBootState(
  db: Kysely<Database>,
  machineId: string,
  bootId: string,
): Promise<NetworkBootState | undefined> {
  if (!isUuid(machineId) || !isUuid(bootId)) return undefined;
  const row = await db
    .selectFrom('machine_network_boot')
    .select(['config_served_at', 'config_served_to', 'config_refused_at', 'config_refused_to'])
    .where('machine_id', '=', machineId)
    .where('boot_id', '=', bootId)
    .executeTakeFirst();
  return (
    row && {
      configServedAt: row.config_served_at ?? undefined,
      configServedTo: row.config_served_to ?? undefined,
      configRefusedAt: row.config_refused_at ?? undefined,
      configRefusedTo: row.config_refused_to ?? undefined,
    }
  );
}
