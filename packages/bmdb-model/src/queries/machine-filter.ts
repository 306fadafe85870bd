/** Which machines a fleet page lists: the filter, and the index-served subquery its IDs come from. */

import { hasLiveWork } from '@bmaas/bmdb-controlloop';
import { type RawBuilder, sql } from 'kysely';
import { AGENT_STARTING_PROCESSES, type OSInstallationState, type PowerState } from '../schema.js';
import type { MachineStage } from './fleet-stats.js';
import { type RecoveryThresholds, thresholdSeconds } from './recovery-thresholds.js';

/** What {@link machinePage} lists. Every field given must hold. */
export interface MachineFilter {
  readonly stage?: MachineStage;
  readonly provider?: string;
  /** Machines with live work of this process. */
  readonly liveWork?: string;
  /** Machines with a running backoff: of any process (`true`) or of this one. */
  readonly inBackoff?: true | string;
  /** Machines an operator holds (`true`) or does not (`false`). */
  readonly held?: boolean;
  /** Machines whose last power state read says this; `Unread`: never read. */
  readonly powerState?: PowerState | 'Unread';
  /** Machines whose OS installation request stands so. */
  readonly installation?: OSInstallationState;
  /** A machine ID or provider ID, or the start of one. */
  readonly search?: string;
  /** Machines after this machine ID (the previous page's `next`). */
  readonly after?: string;
  /** Machines per page, 1 to 1000. Default 50. */
  readonly limit?: number;
}

/** A search term as a machine ID range (when it can start one) and a provider ID prefix. */
export function searchTerms(search: string): { idRange: [string, string] | undefined; providerIdPattern: string } {
  const hex = search.toLowerCase().replaceAll('-', '');
  const idRange =
    /^[0-9a-f]{1,32}$/.test(hex) && /^[0-9a-f-]+$/i.test(search)
      ? ([asUuid(hex.padEnd(32, '0')), asUuid(hex.padEnd(32, 'f'))] as [string, string])
      : undefined;
  return { idRange, providerIdPattern: `${search.replace(/[\\%_]/g, (c) => `\\${c}`)}%` };
}

function asUuid(hex: string): string {
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export function searchCondition(search: string): RawBuilder<boolean> {
  const { idRange, providerIdPattern } = searchTerms(search);
  const byProviderId = sql<boolean>`EXISTS (SELECT 1 FROM machine_provided sp
    WHERE sp.machine_id = ids.machine_id AND sp.provider_id LIKE ${providerIdPattern})`;
  if (idRange === undefined) return byProviderId;
  return sql<boolean>`(ids.machine_id BETWEEN ${idRange[0]}::uuid AND ${idRange[1]}::uuid OR ${byProviderId})`;
}

/**
 * The machine IDs a page is read from (a subquery with column `machine_id`):
 * exactly the machines of the filter's stage, from the rows that hold them;
 * else the matches of the search; else the rows of the index serving the most
 * selective other filter. machinePage checks the other filters on them.
 */
export function drivingIds(
  filter: MachineFilter,
  search: string | undefined,
  thresholds: RecoveryThresholds,
): RawBuilder<unknown> {
  const { firstWithin, within } = thresholdSeconds(thresholds);
  const provided = (id: string) =>
    sql<boolean>`EXISTS (SELECT 1 FROM machine_provided dp WHERE dp.machine_id = ${sql.ref(id)})`;
  const liveWorkOf = (process: string) => sql`(SELECT w.machine_id FROM work w
    JOIN sessions s ON s.session_id = w.session_id
    WHERE w.process = ${process} AND s.deadline > now())`;
  // The stages' definitions, as stageOf() and fleetStages() have them.
  switch (filter.stage) {
    case 'unprovided':
      return sql`(SELECT x.machine_id FROM machine_unprovided x)`;
    case 'provided':
      return sql`(SELECT x.machine_id FROM machine_agent_pending x
        WHERE NOT ${hasLiveWork('x.machine_id', AGENT_STARTING_PROCESSES)})`;
    case 'agentStarting':
      return sql`(SELECT w.machine_id FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.process IN (${sql.join(AGENT_STARTING_PROCESSES)}) AND s.deadline > now()
          AND EXISTS (SELECT 1 FROM machine_agent_pending p WHERE p.machine_id = w.machine_id))`;
    case 'agentStarted':
      return sql`(SELECT x.machine_id FROM machine_agent_started x
        WHERE NOT x.has_heartbeat AND x.agent_started_at >= now() - make_interval(secs => ${firstWithin})
          AND ${provided('x.machine_id')})`;
    case 'heartbeating':
      return sql`(SELECT x.machine_id FROM machine_agent_heartbeat x
        WHERE x.agent_heartbeat_at >= now() - make_interval(secs => ${within})
          AND EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = x.machine_id)
          AND ${provided('x.machine_id')})`;
    case 'awaitingRecovery':
      return sql`(SELECT x.machine_id FROM machine_agent_heartbeat x
          WHERE x.agent_heartbeat_at < now() - make_interval(secs => ${within})
            AND EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = x.machine_id)
            AND ${provided('x.machine_id')}
        UNION ALL
        SELECT x.machine_id FROM machine_agent_started x
          WHERE NOT x.has_heartbeat AND x.agent_started_at < now() - make_interval(secs => ${firstWithin})
            AND ${provided('x.machine_id')})`;
    case 'installed':
      return sql`(SELECT x.machine_id FROM machine_os_installation_request x
        WHERE x.installation_state = 'Succeeded'
          AND NOT EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = x.machine_id)
          AND ${provided('x.machine_id')})`;
    case undefined:
      break;
  }
  if (search !== undefined) {
    const { idRange, providerIdPattern } = searchTerms(search);
    const byProviderId = sql`SELECT x.machine_id FROM machine_provided x WHERE x.provider_id LIKE ${providerIdPattern}`;
    if (idRange === undefined) return sql`(${byProviderId})`;
    return sql`(SELECT x.machine_id FROM machines x
      WHERE x.machine_id BETWEEN ${idRange[0]}::uuid AND ${idRange[1]}::uuid
      UNION ALL ${byProviderId})`;
  }
  if (filter.liveWork !== undefined) return liveWorkOf(filter.liveWork);
  if (filter.inBackoff === true) return sql`(SELECT DISTINCT x.machine_id FROM work_backoff x WHERE x.until > now())`;
  if (filter.inBackoff !== undefined)
    return sql`(SELECT x.machine_id FROM work_backoff x WHERE x.process = ${filter.inBackoff} AND x.until > now())`;
  if (filter.held === true) return sql`(SELECT x.machine_id FROM machine_hold x)`;
  if (filter.installation !== undefined)
    return sql`(SELECT x.machine_id FROM machine_os_installation_request x
      WHERE x.installation_state = ${filter.installation})`;
  if (filter.powerState !== undefined)
    return sql`(SELECT x.machine_id FROM machine_power_state x WHERE ${powerStateIs('x', filter.powerState)})`;
  if (filter.provider !== undefined)
    return sql`(SELECT x.machine_id FROM machine_provided x WHERE x.provider = ${filter.provider})`;
  return sql`(SELECT x.machine_id FROM machines x)`;
}

/** The power state condition over a `machine_power_state` alias: `machine_power_state_state_idx` serves both forms. */
export function powerStateIs(alias: string, state: PowerState | 'Unread'): RawBuilder<boolean> {
  const column = sql.ref(`${alias}.power_state`);
  return state === 'Unread' ? sql<boolean>`${column} IS NULL` : sql<boolean>`${column} = ${state}`;
}
