import type { KeyObject } from 'node:crypto';
import { isIP } from 'node:net';
import { type TakeoverInit, TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import type { Secret } from '@bmaas/common';
import { toBinary } from '@bufbuild/protobuf';
import type { NetworkConfig } from '../network/config.js';
import { cpioArchive } from './cpio.js';
import { AgentImageError } from './errors.js';
import { CONFIG_DIR, ENROLLMENT_JSON, NETWORK_JSON } from './init-script.js';

/** The machine's network as the agent environment sets it up instead of DHCP. */
export interface AgentNetwork {
  /** The NIC: its name (`eth0`) or MAC address; default the first NIC. */
  readonly interface?: string;
  /** IPv4 or IPv6 address with its prefix length (`192.0.2.10/24`). */
  readonly address: string;
  readonly gateway?: string;
  readonly dns?: readonly string[];
}

/** What one machine's agent environment starts with. */
export interface AgentBootConfig {
  /** The takeover's settings: machine ID, BMaaS endpoint, its CA. */
  readonly init: TakeoverInit;
  /** The agent's ed25519 key (its public half is the one the BMDB holds). */
  readonly privateKey: KeyObject;
  /** The agent's flags (`--interval=30s`), one word each. */
  readonly flags?: readonly string[];
  /** Absent (and no `capturedNetwork`): DHCP on every NIC with link. */
  readonly network?: AgentNetwork;
  /**
   * The running OS's network, as the takeover captured it (`/etc/bmaas/network.json`):
   * the image sets it up again by MAC (`bmaas-agent network-up`), and asks DHCP where it had a lease.
   */
  readonly capturedNetwork?: NetworkConfig;
}

/**
 * The JSON `bmaas-agent run` reads on standard input: the init (protobuf, in
 * base64) and the key (PKCS#8 PEM). `takeover` hands it over a pipe; the
 * agent environment reads it from `/etc/bmaas/handover.json`.
 */
export function handOverText(init: TakeoverInit, privateKey: KeyObject): string {
  return JSON.stringify({
    init: Buffer.from(toBinary(TakeoverInitSchema, init)).toString('base64'),
    privateKey: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  });
}

/**
 * An initramfs (uncompressed cpio) holding one machine's {@link AgentBootConfig}
 * under /etc/bmaas, to load after the agent image's own: appended to it for
 * kexec, or as the ISO's `/boot/config.cpio` ({@link configureAgentIso}).
 *
 * @throws {@link AgentImageError} naming the field of a network setting that is not an address or a NIC
 */
export function agentConfigArchive(config: AgentBootConfig): Buffer {
  const files: { path: string; text: string; mode: number }[] = [
    { path: `${CONFIG_DIR}/handover.json`, text: handOverText(config.init, config.privateKey), mode: 0o600 },
  ];
  if (config.flags?.length) files.push(agentFlagsFile(config.flags));
  if (config.network) files.push({ path: `${CONFIG_DIR}/network`, text: networkText(config.network), mode: 0o644 });
  if (config.capturedNetwork) {
    files.push({ path: NETWORK_JSON, text: `${JSON.stringify(config.capturedNetwork)}\n`, mode: 0o644 });
  }
  return cpioArchive([
    { kind: 'dir', path: '/etc' },
    { kind: 'dir', path: CONFIG_DIR },
    ...files.map((file) => ({ kind: 'file' as const, path: file.path, data: Buffer.from(file.text), mode: file.mode })),
  ]);
}

/** What a BMC-booted agent enrolls with (see {@link agentEnrollmentArchive}). */
export interface AgentEnrollmentConfig {
  /** The machine, the BMaaS endpoint and its CA, as a takeover's init. */
  readonly init: TakeoverInit;
  /** The machine's one-time enrollment token (the BMDB's `issueEnrollmentToken`). */
  readonly token: Secret;
  /** The agent's flags (`--interval=10s`), one word each, as a takeover's {@link AgentBootConfig.flags}. */
  readonly flags?: readonly string[];
}

/**
 * An initramfs (uncompressed cpio) holding `/etc/bmaas/enrollment.json`
 * (mode 0600): the init (protobuf, in base64) and the token, which the
 * image's /init hands to `bmaas-agent enroll` when no handover.json is
 * there. Loaded after the agent image's own: the ISO's `/boot/config.cpio`
 * ({@link configureAgentIso}), or iPXE's second `initrd`. Whoever can read
 * it can enroll as the machine until the token is used or expires: serve it
 * only to that machine's boot, over TLS where the firmware allows.
 *
 * @throws {@link AgentImageError} for an init without a machine ID or endpoint, or an empty token
 */
export function agentEnrollmentArchive(config: AgentEnrollmentConfig): Buffer {
  const { init } = config;
  if (init.machineId === '') throw new AgentImageError('enrollment archive: the init has no machine_id');
  if (init.bmaasEndpoint === '') {
    throw new AgentImageError(`enrollment archive of machine ${init.machineId}: the init has no bmaas_endpoint`);
  }
  const token = config.token.reveal();
  if (token === '') throw new AgentImageError(`enrollment archive of machine ${init.machineId}: the token is empty`);
  const text = JSON.stringify({ init: Buffer.from(toBinary(TakeoverInitSchema, init)).toString('base64'), token });
  const files = [{ path: ENROLLMENT_JSON, text, mode: 0o600 }];
  if (config.flags?.length) files.push(agentFlagsFile(config.flags));
  return cpioArchive([
    { kind: 'dir', path: '/etc' },
    { kind: 'dir', path: CONFIG_DIR },
    ...files.map((file) => ({ kind: 'file' as const, path: file.path, data: Buffer.from(file.text), mode: file.mode })),
  ]);
}

/** `/etc/bmaas/agent-flags`, which /init passes to the agent (`run` or `enroll`), one flag a line. */
function agentFlagsFile(flags: readonly string[]): { path: string; text: string; mode: number } {
  for (const flag of flags) {
    if (/[\n\0]/.test(flag)) throw new AgentImageError(`agent flag ${JSON.stringify(flag)}: one line each`);
  }
  return { path: `${CONFIG_DIR}/agent-flags`, text: `${flags.join('\n')}\n`, mode: 0o644 };
}

/** Shell assignments /init sources: every value checked here, so none can carry shell syntax. */
function networkText(network: AgentNetwork): string {
  const [address, prefix, ...rest] = network.address.split('/');
  if (!address || isIP(address) === 0 || !prefix || !/^\d{1,3}$/.test(prefix) || rest.length > 0) {
    throw new AgentImageError(
      `network.address ${JSON.stringify(network.address)}: want an IP address and prefix length (192.0.2.10/24)`,
    );
  }
  if (network.gateway !== undefined && isIP(network.gateway) === 0) {
    throw new AgentImageError(`network.gateway ${JSON.stringify(network.gateway)}: want an IP address`);
  }
  for (const server of network.dns ?? []) {
    if (isIP(server) === 0) throw new AgentImageError(`network.dns ${JSON.stringify(server)}: want an IP address`);
  }
  const nic = network.interface;
  if (nic !== undefined && !/^([0-9a-f]{2}(:[0-9a-f]{2}){5}|[A-Za-z0-9_.-]{1,15})$/.test(nic)) {
    throw new AgentImageError(
      `network.interface ${JSON.stringify(nic)}: want a NIC name (eth0) or a lower-case MAC address`,
    );
  }
  return [
    `BMAAS_INTERFACE=${nic ?? ''}`,
    `BMAAS_ADDRESS=${network.address}`,
    `BMAAS_GATEWAY=${network.gateway ?? ''}`,
    `BMAAS_DNS="${(network.dns ?? []).join(' ')}"`,
    '',
  ].join('\n');
}
