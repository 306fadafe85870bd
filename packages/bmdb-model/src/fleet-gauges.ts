/**
 * The fleet's gauges: what the BMDB says about the whole fleet, as
 * Prometheus gauges (after upstream's scruffy). One process of those serving
 * metrics reads them at a time (see `fleet-metrics.ts`); this module says
 * what is read and how it is named.
 *
 * Adding a gauge is one entry in {@link FLEET_GAUGES}:
 *
 * 1. Write its query as a function in a module of `queries/`,
 *    served by an index at 100,000 machines, and add it to the `fleet`
 *    section of `npm run bench` (bench/src/fleet-metrics.ts) with its plan.
 * 2. Add an entry below: a name in Prometheus' conventions (`bmdb_fleet_`,
 *    base units, no `_total` on a gauge), its help, its labels, and `read`,
 *    which turns the query's answer into samples. Label sets that must
 *    exist even at 0 (a fixed set of states) are given by `read` with value
 *    0. Queries several gauges share go through `reading.once`, so each runs
 *    once per reading.
 * 3. Add a row to the metrics table of the root README; the deploy tests
 *    check that every metric the alert rules and the dashboard name is
 *    exported.
 */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import type { Kysely } from 'kysely';
import { Gauge, type Registry } from 'prom-client';
import {
  backoffsByProcess,
  controlByLocation,
  fleetStagesByLocation,
  hardwareByLocation,
  newestAgentHeartbeatAge,
  sessionsByProcessor,
} from './queries/fleet-metrics.js';
import { liveWorkByProcess, MACHINE_STAGES } from './queries/fleet-stats.js';
import { osInstallationCounts } from './queries/os-installation.js';
import type { RecoveryThresholds } from './queries/recovery-thresholds.js';
import type { Database } from './schema.js';
import { SHEPHERD_PROCESSES } from './schema.js';

/** One sample of a gauge: its labels (every label name, `''` for none) and value. */
export interface FleetSample<L extends string> {
  readonly labels: Readonly<Record<L, string>>;
  readonly value: number;
}

/** What a gauge reads with: the reading's queries (one snapshot), the settings, and shared answers. */
export interface FleetReading {
  /** The reading's transaction (REPEATABLE READ, READ ONLY), for its queries. */
  readonly q: Kysely<Database>;
  /** When a started agent counts as lost: the recoverer's, as configured. */
  readonly thresholds: RecoveryThresholds;
  /** `read()`'s answer, read once per reading under `key` however many gauges ask. */
  once<T>(key: string, read: () => Promise<T>): Promise<T>;
}

/** A gauge of the fleet: a name, its labels, and how its samples are read from the BMDB. */
export interface FleetGauge<L extends string = string> {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly L[];
  read(reading: FleetReading): Promise<readonly FleetSample<L>[]>;
}

/** Infers a gauge's label names from its entry. */
function fleetGauge<L extends string>(gauge: FleetGauge<L>): FleetGauge {
  return gauge as unknown as FleetGauge;
}

/** Holds and power states, read once per reading for the three gauges that show them. */
const control = (reading: FleetReading) => reading.once('control', () => controlByLocation(reading.q));

/** Hardware totals, read once per reading for the five gauges that show them. */
const hardware = (reading: FleetReading) => reading.once('hardware', () => hardwareByLocation(reading.q));

/** Labels of a provider and location; a machine without either has `''` (Prometheus: no label). */
const where = (place: { provider: string; location: string }) => ({
  provider: place.provider,
  location: place.location,
});

/** The fleet's gauges, in the order `/metrics` shows them. */
export const FLEET_GAUGES: readonly FleetGauge[] = [
  fleetGauge({
    name: 'bmdb_fleet_machines',
    help: 'Machines per lifecycle stage (unprovided, provided, agentStarting, agentStarted, heartbeating, awaitingRecovery, installed), provider and location.',
    labelNames: ['stage', 'provider', 'location'],
    async read({ q, thresholds }) {
      const { unprovided, locations } = await fleetStagesByLocation(q, thresholds);
      const samples: FleetSample<'stage' | 'provider' | 'location'>[] = [
        { labels: { stage: 'unprovided', provider: '', location: '' }, value: unprovided },
      ];
      for (const place of locations) {
        for (const stage of MACHINE_STAGES) {
          if (stage !== 'unprovided') samples.push({ labels: { stage, ...where(place) }, value: place.stages[stage] });
        }
      }
      return samples;
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_os_installations',
    help: 'Machines per OS installation state (Requested, Delivered: its agent installing, Succeeded, Failed: with the agent’s error, Canceled); every state is present.',
    labelNames: ['state'],
    async read({ q }) {
      return Object.entries(await osInstallationCounts(q)).map(([state, value]) => ({ labels: { state }, value }));
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_holds',
    help: 'Machines an operator holds (no loop claims them), per provider and location.',
    labelNames: ['provider', 'location'],
    async read(reading) {
      return (await control(reading)).map((place) => ({ labels: where(place), value: place.held }));
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_power_states',
    help: 'Provided machines per power state as last read (On, Off, PoweringOn, PoweringOff, Unknown; Unread: never read), provider and location.',
    labelNames: ['state', 'provider', 'location'],
    async read(reading) {
      return (await control(reading)).flatMap((place) =>
        Object.entries(place.powerStates).map(([state, value]) => ({ labels: { state, ...where(place) }, value })),
      );
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_power_read_failures',
    help: 'Provided machines whose last power state read failed (their BMC or provider did not answer), per provider and location.',
    labelNames: ['provider', 'location'],
    async read(reading) {
      return (await control(reading)).map((place) => ({ labels: where(place), value: place.powerReadFailed }));
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_backoffs',
    help: 'Machines backing off (a running backoff) per process; every shepherd process is present.',
    labelNames: ['process'],
    async read({ q }) {
      return Object.entries(await backoffsByProcess(q)).map(([process, value]) => ({ labels: { process }, value }));
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_work',
    help: 'Work items held by live sessions (machines being worked on) per process; every shepherd process is present.',
    labelNames: ['process'],
    async read({ q }) {
      const work = await liveWorkByProcess(q);
      const processes = new Set([...SHEPHERD_PROCESSES, ...Object.keys(work)]);
      return [...processes].map((process) => ({ labels: { process }, value: work[process] ?? 0 }));
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_sessions',
    help: 'Live BMDB sessions per component and processor (processor empty for sessions from before migration 0004).',
    labelNames: ['component', 'processor'],
    async read({ q }) {
      return (await sessionsByProcessor(q)).map((row) => ({
        labels: { component: row.componentName, processor: row.processor ?? '' },
        value: row.sessions,
      }));
    },
  }),
  fleetGauge({
    name: 'bmdb_fleet_newest_agent_heartbeat_age_seconds',
    help: 'Seconds since the newest agent heartbeat recorded in the BMDB, by the database clock; absent while no agent has heartbeated.',
    labelNames: [],
    async read({ q }) {
      const age = await newestAgentHeartbeatAge(q);
      return age === undefined ? [] : [{ labels: {}, value: age }];
    },
  }),
  ...(
    [
      ['bmdb_fleet_hardware_machines', 'Machines whose last hardware report was read', 'machines'],
      ['bmdb_fleet_hardware_cpu_threads', 'CPU hardware threads of those machines', 'cpuThreads'],
      ['bmdb_fleet_hardware_memory_bytes', 'Memory installed in those machines', 'memoryBytes'],
      ['bmdb_fleet_hardware_disks', 'Block devices of those machines', 'disks'],
      ['bmdb_fleet_hardware_disk_bytes', 'Capacity of those block devices', 'diskBytes'],
    ] as const
  ).map(([name, help, total]) =>
    fleetGauge({
      name,
      help: `${help}, per provider and location.`,
      labelNames: ['provider', 'location'],
      async read(reading) {
        return (await hardware(reading)).map((place) => ({ labels: where(place), value: place[total] }));
      },
    }),
  ),
];

/** The gauges of {@link FLEET_GAUGES} on one registry, set from a whole reading at once. */
export class FleetGaugeSet {
  readonly #gauges: ReadonlyMap<FleetGauge, Gauge<string>>;

  constructor(registry: Registry, gauges: readonly FleetGauge[] = FLEET_GAUGES) {
    const registered = new Map<FleetGauge, Gauge<string>>();
    for (const gauge of gauges) {
      if (registry.getSingleMetric(gauge.name)) {
        throw new BMDBError(`fleet metrics: ${gauge.name} is already registered on this registry`);
      }
      registered.set(
        gauge,
        new Gauge({ name: gauge.name, help: gauge.help, labelNames: [...gauge.labelNames], registers: [registry] }),
      );
    }
    this.#gauges = registered;
  }

  /** Reads every gauge's samples; nothing is set until all are read. */
  async read(reading: FleetReading): Promise<Map<FleetGauge, readonly FleetSample<string>[]>> {
    const samples = new Map<FleetGauge, readonly FleetSample<string>[]>();
    for (const gauge of this.#gauges.keys()) samples.set(gauge, await gauge.read(reading));
    return samples;
  }

  /** Replaces every gauge's series with a reading's samples, in one synchronous step (no scrape sees half). */
  set(samples: ReadonlyMap<FleetGauge, readonly FleetSample<string>[]>): void {
    for (const [gauge, metric] of this.#gauges) {
      metric.reset();
      for (const sample of samples.get(gauge) ?? []) metric.set(sample.labels, sample.value);
    }
  }

  /** Removes every series: this process no longer reads the fleet. */
  clear(): void {
    for (const metric of this.#gauges.values()) metric.reset();
  }
}
