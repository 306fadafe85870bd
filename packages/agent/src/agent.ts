import { createHash, type KeyObject, randomBytes } from 'node:crypto';
import { AgentLogSchema } from '@bmaas/api/cloud/agent/api/agent_log_pb';
import {
  AgentHardwareReportSchema,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  type OSInstallationReport,
  OSInstallationReportSchema,
  type OSInstallationRequest,
} from '@bmaas/api/cloud/agent/api/agent_pb';
import { OSInstallationReportOutcome } from '@bmaas/api/cloud/agent/api/installation_report_outcome_pb';
import type { TakeoverInit } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { certificatePem, sleep } from '@bmaas/common';
import { create } from '@bufbuild/protobuf';
import { type AgentService, HeartbeatClient } from './callback/heartbeat-client.js';
import { hardwareNode, readHardware } from './hardware/inventory.js';
import { InstallationError } from './install/errors.js';
import { install } from './install/install.js';
import { wipeDisks } from './install/wipe.js';
import { type LogVersion, readLogTail } from './log-tail.js';
import { runRebootCommand } from './reboot.js';

/** What the agent runs with. */
export interface AgentOptions {
  /** The takeover's init: the machine, the server and its CA. */
  readonly init: TakeoverInit;
  /** The key whose public half the takeover returned. */
  readonly privateKey: KeyObject;
  /** Between two heartbeats, in milliseconds; 30 s unless given (upstream's pause). */
  readonly intervalMs?: number | undefined;
  readonly service?: AgentService | undefined;
  /** Where the machine's sysfs, procfs and /dev are (`/`). */
  readonly root?: string | undefined;
  /** efivarfs, for the boot entry after an installation (`/sys/firmware/efi/efivars`). */
  readonly efivars?: string | undefined;
  /** The bound of one installation, in milliseconds (15 minutes unless given). */
  readonly installTimeoutMs?: number | undefined;
  /**
   * Run with `sh -c` once a successful installation's report was accepted,
   * to boot the installed OS (`reboot -f`). Absent: the agent stops instead.
   */
  readonly rebootCommand?: string | undefined;
  /** Stops the agent, and any installation under way. */
  readonly signal?: AbortSignal | undefined;
  /** Where the agent says what it does, one line at a time. */
  readonly log?: ((line: string) => void) | undefined;
  /**
   * Set where the agent runs in place, on the machine's own OS (a takeover
   * where kexec could not run): why it does. Its installations and wipes are
   * then refused, as they would overwrite the disk of the running OS, and its
   * hardware report says so (the machine's page shows it).
   */
  readonly inPlace?: string | undefined;
  /**
   * The agent's log file, whose tail (at most 64 KiB, see `log-tail.ts`)
   * heartbeats carry to the server for the machine's page, each time it
   * changed since the last recorded heartbeat carrying it. Absent: none.
   */
  readonly logFile?: string | undefined;
}

/** Why the agent stopped. */
export type AgentEnd = 'stopped' | 'installed' | 'wiped';

/** An installation under way, or finished and not yet reported. */
interface Installation {
  readonly generation: bigint;
  /** A disk wipe (disk_wipe.proto), after which the agent stops rather than reboots. */
  readonly wipe: boolean;
  readonly stop: AbortController;
  report?: OSInstallationReport;
}

/**
 * Runs the agent: heartbeats to the server every interval, the first ones
 * with the hardware report until one is accepted, retrying with backoff
 * (0.5 s doubling up to the interval) while the server is down or refuses
 * it; installs what an answer asks for while it keeps heartbeating, and
 * reports the outcome with the request's generation. As the server does:
 * an answer no longer carrying the generation being installed (canceled, or
 * replaced by a newer one) stops that installation; a generation reported
 * and accepted is not installed again when its request comes back before
 * the report is stored. After a Success is accepted, it runs the reboot
 * command and resolves `installed`; a report the server ignored (its request
 * canceled or replaced meanwhile) is not acted on, and the newer request is
 * installed instead. On `signal`, `stopped`.
 */
export async function runAgent(options: AgentOptions): Promise<AgentEnd> {
  const { init, signal } = options;
  const interval = options.intervalMs ?? 30_000;
  const log = options.log ?? (() => {});
  const ca = init.caCertificate.length > 0 ? certificatePem(init.caCertificate) : undefined;
  const client = new HeartbeatClient({
    machineId: init.machineId,
    endpoint: init.bmaasEndpoint,
    privateKey: options.privateKey,
    ca,
    service: options.service,
  });
  let reportAccepted = false;
  let failures = 0;
  let installation: Installation | undefined;
  const reported = new Set<bigint>();
  // The version of the log the server last recorded: an unchanged log is not read or sent again.
  let logSent: LogVersion | undefined;
  log(`heartbeating to ${init.bmaasEndpoint} (${options.service ?? 'cloud.agent.api'}) every ${interval} ms`);
  try {
    while (!signal?.aborted) {
      const report = installation?.report;
      const wipe = installation?.wipe === true;
      const request = await heartbeatRequest(
        init.machineId,
        reportAccepted ? undefined : options.root,
        options.inPlace,
        report,
        log,
      );
      const tail = options.logFile === undefined ? undefined : await readLogTail(options.logFile, logSent);
      if (tail) request.agentLog = create(AgentLogSchema, { text: tail.text });
      try {
        const answer = await client.heartbeat(request, signal);
        if (tail) logSent = tail.version;
        if (!reportAccepted || failures > 0) {
          log(`heartbeat accepted${request.hardwareReport ? ' with a hardware report' : ''}`);
        }
        reportAccepted = true;
        failures = 0;
        if (report) {
          reported.add(report.generation);
          installation = undefined;
          // An older server answers without an outcome (UNSPECIFIED): every report it took was stored.
          if (answer.installationReportOutcome === OSInstallationReportOutcome.OS_INSTALLATION_REPORT_OUTCOME_IGNORED) {
            // Its request was canceled or replaced while it finished: the disk does not hold what
            // the BMDB asks for, so no reboot; the newer request comes with the next answers.
            log(`installation report of generation ${report.generation} ignored: its request is no longer current`);
          } else {
            log(`installation report of generation ${report.generation} accepted`);
            if (report.result.case === 'success' && wipe) {
              // Nothing is left to boot, and the machine leaves the fleet: no reboot.
              log('wiped; stopping');
              return 'wiped';
            }
            if (report.result.case === 'success') {
              await reboot(options.rebootCommand, log);
              return 'installed';
            }
          }
        }
        const asked = answer.installationRequest;
        if (installation && installation.generation !== asked?.generation) {
          log(`installation of generation ${installation.generation} no longer asked for: stopping it`);
          installation.stop.abort();
          installation = undefined;
        }
        if (asked && !installation && !reported.has(asked.generation)) {
          installation = start(asked, options, ca, log);
        }
        await sleep(interval, signal);
      } catch (error) {
        if (signal?.aborted) break;
        failures++;
        const delay = Math.min(interval, 500 * 2 ** Math.min(failures - 1, 16));
        log(`heartbeat failed (${(error as Error).message}); again in ${delay} ms`);
        // A stop cuts the pause short; the loop's condition then ends the loop.
        await sleep(delay, signal).catch(() => {});
      }
    }
  } finally {
    installation?.stop.abort();
    client.close();
  }
  log('stopped');
  return 'stopped';
}

async function heartbeatRequest(
  machineId: string,
  hardwareFrom: string | undefined,
  inPlace: string | undefined,
  installationReport: OSInstallationReport | undefined,
  log: (line: string) => void,
): Promise<HeartbeatRequest> {
  const request = create(HeartbeatRequestSchema, { machineId });
  if (installationReport) request.installationReport = installationReport;
  if (hardwareFrom !== undefined) {
    const inventory = await readHardware(hardwareFrom);
    for (const warning of inventory.warnings) log(`hardware report: ${warning}`);
    request.hardwareReport = create(AgentHardwareReportSchema, {
      report: hardwareNode(inventory),
      warning: [...(inPlace === undefined ? [] : [inPlaceWarning(inPlace)]), ...inventory.warnings],
    });
  }
  return request;
}

/** The hardware report's warning of an agent running in place: what the machine's page shows. */
export function inPlaceWarning(why: string): string {
  return `the agent runs in place on the machine's own OS (${why}): it refuses installations and wipes`;
}

/** Why an agent running in place writes no disk. */
function inPlaceRefusal(asked: OSInstallationRequest, why: string): InstallationError {
  const what = asked.type.case === 'diskWipe' ? 'disk wipe' : 'installation';
  return new InstallationError(
    'in-place',
    `${what} of generation ${asked.generation} refused: the agent runs in place on the machine's own OS (${why}), whose disk it would overwrite under it; boot the machine into the agent image (a takeover with kexec, or its BMC's agent boot) first`,
  );
}

/** Starts installing `asked`; its outcome becomes the installation's report, unless it was stopped. */
function start(
  asked: OSInstallationRequest,
  options: AgentOptions,
  ca: string | undefined,
  log: (line: string) => void,
): Installation {
  const wipe = asked.type.case === 'diskWipe';
  const installation: Installation = { generation: asked.generation, wipe, stop: new AbortController() };
  log(`${wipe ? 'wiping every disk for' : 'installing'} generation ${asked.generation}`);
  // The installation's first-boot secret: on the config drive, its hash in the Success report, never logged.
  const secret = randomBytes(32).toString('base64url');
  const { machineId, bmaasEndpoint } = options.init;
  const done =
    options.inPlace !== undefined
      ? Promise.reject(inPlaceRefusal(asked, options.inPlace))
      : wipe
        ? wipeDisks({ root: options.root, signal: installation.stop.signal }).then((disks) =>
            disks
              .map(
                (d) =>
                  `${d.device} (${d.sizeBytes} bytes, ${d.discarded ? 'discarded' : `not discarded: ${d.discardSkipped}`})`,
              )
              .join(', '),
          )
        : install(asked, {
            root: options.root,
            efivars: options.efivars,
            ca,
            signal: installation.stop.signal,
            timeoutMs: options.installTimeoutMs,
            firstBoot: {
              machineId,
              phoneHome: { url: `https://${bmaasEndpoint}${PHONE_HOME_PATH}${machineId}/${secret}`, caCertificate: ca },
            },
          }).then(
            (installed) =>
              `${installed.bytes} bytes onto ${installed.device}${
                installed.bootEntry === undefined ? '' : `, boot entry ${installed.bootEntry}`
              }`,
          );
  done.then(
    (what) => {
      log(`${wipe ? 'wiped' : 'installed'} generation ${asked.generation}: ${what}`);
      const bootSecretSha256 = wipe ? new Uint8Array() : createHash('sha256').update(secret, 'utf8').digest();
      installation.report = create(OSInstallationReportSchema, {
        generation: asked.generation,
        result: { case: 'success', value: { bootSecretSha256 } },
      });
    },
    (error: unknown) => {
      if (installation.stop.signal.aborted) return;
      const message = (error as Error).message;
      log(`${wipe ? 'disk wipe' : 'installation'} of generation ${asked.generation} failed: ${message}`);
      installation.report = create(OSInstallationReportSchema, {
        generation: asked.generation,
        result: { case: 'error', value: { error: message } },
      });
    },
  );
  return installation;
}

/** Where the BMaaS server takes an installed OS's first boot report (the server's `PHONE_HOME_PATH`). */
const PHONE_HOME_PATH = '/phone-home/';

async function reboot(command: string | undefined, log: (line: string) => void): Promise<void> {
  if (!command) {
    log('installed; no reboot command: stopping as if rebooted');
    return;
  }
  log(`installed; rebooting: ${command}`);
  await runRebootCommand(command, log);
}
