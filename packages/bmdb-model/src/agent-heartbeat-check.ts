import { BMDBError } from '@bmaas/bmdb-controlloop';
import { isUuid } from '@bmaas/common';
import type { NetworkConfig } from './first-boot.js';
import type { RootDeviceHints } from './root-device-hints.js';
import type { OSImageCompression, OSInstallationResult, OSRequestKind } from './schema.js';

/**
 * What an agent is handed in a heartbeat's answer: the machine's pending
 * request. A disk wipe (`kind` `DiskWipe`) has no image: its `imageUrl` and
 * `imageSha256` are empty, its root device and hints undefined.
 */
export interface PendingOSInstallation {
  readonly generation: bigint;
  /** A disk image to write (`DiskImage`), or every disk to wipe (`DiskWipe`). */
  readonly kind: OSRequestKind;
  readonly imageUrl: string;
  readonly imageSha256: string;
  readonly rootDevice: string | undefined;
  readonly rootDeviceHints: RootDeviceHints | undefined;
  readonly compression: OSImageCompression;
  readonly userData: Uint8Array | undefined;
  /** The installed OS's hostname; empty for a disk wipe. */
  readonly hostname: string;
  /** OpenSSH public keys for the installed OS. */
  readonly sshPublicKeys: readonly string[];
  /** The installed OS's network; undefined: DHCP on each NIC. */
  readonly network: NetworkConfig | undefined;
}

/**
 * A heartbeat an agent sent, with the public key it proved it holds (the
 * key of the TLS client certificate it connected with). Recorded by
 * `AgentHeartbeats.record` only if the key is the one of the machine's
 * AgentStarted tag.
 */
export interface AgentHeartbeat {
  /** The machine the agent says it runs on (a UUID). */
  readonly machineId: string;
  /** The agent's public key, as proven by its connection (ed25519: 32 bytes). */
  readonly publicKey: Uint8Array;
  /** A serialized `cloud.bmaas.server.api.AgentHardwareReport`, when the agent sent one. */
  readonly hardwareReport?: Uint8Array;
  /** An OS installation report, when the agent sent one. */
  readonly installationReport?: OSInstallationReport;
  /**
   * The tail of the agent's log, when the agent sent one (it does when the
   * log changed): at most {@link AGENT_LOG_MAX_BYTES} bytes of UTF-8,
   * stored in place of the machine's last.
   */
  readonly agentLog?: string;
}

/** The most an agent's log may hold, in bytes of UTF-8 (migration 0013 checks it too). */
export const AGENT_LOG_MAX_BYTES = 64 * 1024;

/** An agent's report on an OS installation it was asked for. */
export interface OSInstallationReport {
  /** The generation of the installation request it answers. */
  readonly generation: bigint;
  readonly result: OSInstallationResult;
  /** The report as sent: a serialized `cloud.bmaas.server.api.OSInstallationReport`. */
  readonly raw: Uint8Array;
  /** The agent's error message, for `Error`: shown with the installation. */
  readonly error?: string | undefined;
  /**
   * For `Success`: the sha256 (32 bytes) of the secret the agent put on the
   * installed OS's config drive, which the OS presents when it reports its
   * first boot (`recordFirstBoot`).
   */
  readonly bootSecretSha256?: Uint8Array | undefined;
}

/**
 * What became of a heartbeat: `recorded` (AgentHeartbeat set to the
 * database's now, reports stored; or a `Success` report repeated by the
 * agent that sent it, see {@link OSInstallationReportOutcome}), or
 * `unauthenticated` (no such machine, no AgentStarted tag, or another key:
 * nothing written).
 */
export type AgentHeartbeatResult = 'recorded' | 'unauthenticated';

/**
 * What became of a heartbeat's OS installation report:
 * - `stored`: it was of the machine's current request, and settled it
 *   (`Succeeded` or `Failed`).
 * - `repeated`: the `Success` report stored before, sent again by the agent
 *   that sent it (it never got the answer): answered as then, nothing
 *   written. Its agent may reboot.
 * - `ignored`: of no request the machine waits on (an older generation, one
 *   canceled or replaced meanwhile): nothing settled. Its agent must not act
 *   on it as if it were accepted (reboot into the image it reported).
 */
export type OSInstallationReportOutcome = 'stored' | 'repeated' | 'ignored';

/**
 * What became of a heartbeat, with what the server answers the agent: the
 * machine's pending OS installation request (one without a report of its
 * generation yet), if any, whenever the heartbeat was recorded; and what
 * became of the installation report it carried, if any. A `repeated` report
 * is `recorded` too (answered as the first was), though it writes nothing:
 * the machine runs its OS, and sets no AgentHeartbeat.
 */
export type AgentHeartbeatAnswer =
  | { readonly result: 'unauthenticated' }
  | {
      readonly result: 'recorded';
      readonly installationRequest: PendingOSInstallation | undefined;
      readonly report: OSInstallationReportOutcome | undefined;
    };

/** A machine's last hardware report. */
export interface HardwareReportEntry {
  readonly machineId: string;
  /** A serialized `cloud.bmaas.server.api.AgentHardwareReport`. */
  readonly raw: Uint8Array;
  readonly reportedAt: Date;
}

/** A machine's last OS installation report. */
export interface OSInstallationReportEntry extends OSInstallationReport {
  readonly machineId: string;
  readonly reportedAt: Date;
}

/** Refuses a heartbeat no statement could take, naming the bad value. */
export function checkAgentHeartbeat(heartbeat: AgentHeartbeat): void {
  if (!isUuid(heartbeat.machineId)) {
    throw new BMDBError(`agent heartbeat: machine ID ${JSON.stringify(heartbeat.machineId)} is not a UUID`);
  }
  if (!(heartbeat.publicKey instanceof Uint8Array) || heartbeat.publicKey.length === 0) {
    throw new BMDBError(`agent heartbeat of machine ${heartbeat.machineId}: publicKey must be non-empty bytes`);
  }
  const agentLog = heartbeat.agentLog;
  if (agentLog !== undefined) {
    if (typeof agentLog !== 'string') {
      throw new BMDBError(`agent heartbeat of machine ${heartbeat.machineId}: agentLog must be text`);
    }
    const bytes = Buffer.byteLength(agentLog, 'utf8');
    if (bytes > AGENT_LOG_MAX_BYTES) {
      throw new BMDBError(
        `agent heartbeat of machine ${heartbeat.machineId}: its log of ${bytes} bytes is longer than ${AGENT_LOG_MAX_BYTES}`,
      );
    }
    // PostgreSQL's text cannot hold NUL; such a log would fail the whole batch.
    if (agentLog.includes('\0')) {
      throw new BMDBError(`agent heartbeat of machine ${heartbeat.machineId}: its log contains a NUL character`);
    }
  }
  const report = heartbeat.installationReport;
  if (report !== undefined) {
    if (report.result !== 'Success' && report.result !== 'Error') {
      throw new BMDBError(
        `agent heartbeat of machine ${heartbeat.machineId}: installation result ${JSON.stringify(report.result)} is neither Success nor Error`,
      );
    }
    if (typeof report.generation !== 'bigint' || report.generation < -(2n ** 63n) || report.generation >= 2n ** 63n) {
      throw new BMDBError(
        `agent heartbeat of machine ${heartbeat.machineId}: installation generation ${String(report.generation)} is not a 64-bit integer`,
      );
    }
    const secret = report.bootSecretSha256;
    if (secret !== undefined && (!(secret instanceof Uint8Array) || secret.length !== 32)) {
      throw new BMDBError(`agent heartbeat of machine ${heartbeat.machineId}: boot secret sha256 must be 32 bytes`);
    }
    if (report.error !== undefined && typeof report.error !== 'string') {
      throw new BMDBError(`agent heartbeat of machine ${heartbeat.machineId}: installation error must be text`);
    }
  }
}
