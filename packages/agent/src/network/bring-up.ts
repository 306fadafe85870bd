import { execFile } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import type { NicRecord } from '../hardware/nics.js';
import { isLoopback, type NetworkConfig, type NetworkInterface } from './config.js';

/** One step of bringing a network up: a command (busybox `ip`), or a write to sysfs or /etc. */
export type NetworkStep =
  | { readonly kind: 'run'; readonly argv: readonly string[] }
  | { readonly kind: 'write'; readonly file: string; readonly text: string };

/** What {@link networkSteps} planned. */
export interface NetworkPlan {
  readonly steps: readonly NetworkStep[];
  /** The interfaces (their names here) to ask DHCP on: those that had a lease before. */
  readonly dhcp: readonly string[];
  /** What could not be carried over: a NIC whose MAC is not on this machine, and what stood on it. */
  readonly warnings: readonly string[];
}

/**
 * The steps that set the handed-over network up again in the agent image,
 * whose kernel may name the NICs otherwise: each NIC is found by its MAC
 * among `nics` (the image's own), bonds (the bonding driver's sysfs: its
 * mode before its members) and VLANs (`ip link add ... type vlan`) keep the
 * names they had, and every interface gets its MTU, its addresses and then
 * its routes (after all addresses, as a gateway must be on a link first).
 * An interface whose NIC (or parent, or every member) is missing is left
 * out with a warning. `/etc/resolv.conf` gets the nameservers, but for
 * loopback ones (a stub resolver of the OS taken over, not running here),
 * each left out with a warning.
 */
export function networkSteps(config: NetworkConfig, nics: readonly Pick<NicRecord, 'name' | 'mac'>[]): NetworkPlan {
  const warnings: string[] = [];
  const nameOf = new Map<string, string>();
  const ip = (...argv: string[]): NetworkStep => ({ kind: 'run', argv: ['ip', ...argv] });
  const links: NetworkStep[] = [];
  const placed: NetworkInterface[] = [];
  // Devices first, then bonds over them, then VLANs over either; what is missing is left out.
  const order = [...config.interfaces].sort((a, b) => rank(a) - rank(b));
  for (const i of order) {
    if (i.kind === 'device') {
      const nic = nics.find((n) => n.mac === i.mac);
      if (nic === undefined) {
        warnings.push(`NIC ${i.name} (${i.mac}) is not on this machine: its configuration is left out`);
        continue;
      }
      nameOf.set(i.name, nic.name);
    } else if (i.kind === 'bond') {
      const members = i.members.filter((m) => nameOf.has(m));
      if (members.length === 0) {
        warnings.push(`bond ${i.name}: none of its members (${i.members.join(', ')}) is here: left out`);
        continue;
      }
      links.push(ip('link', 'add', 'name', i.name, 'type', 'bond'));
      links.push({ kind: 'write', file: `/sys/class/net/${i.name}/bonding/mode`, text: i.mode });
      for (const member of members) {
        const here = nameOf.get(member) as string;
        links.push(
          ip('link', 'set', here, 'down'),
          ip('link', 'set', here, 'master', i.name),
          ip('link', 'set', here, 'up'),
        );
      }
      nameOf.set(i.name, i.name);
    } else {
      const parent = nameOf.get(i.parent);
      if (parent === undefined) {
        warnings.push(`VLAN ${i.name}: its parent ${i.parent} is not here: left out`);
        continue;
      }
      const protocol = i.protocol === '802.1ad' ? ['protocol', '802.1ad'] : [];
      links.push(ip('link', 'add', 'link', parent, 'name', i.name, 'type', 'vlan', 'id', String(i.id), ...protocol));
      nameOf.set(i.name, i.name);
    }
    placed.push(i);
  }
  const steps: NetworkStep[] = [...links];
  for (const i of placed) {
    const here = nameOf.get(i.name) as string;
    if (i.mtu !== undefined) steps.push(ip('link', 'set', here, 'mtu', String(i.mtu)));
    steps.push(ip('link', 'set', here, 'up'));
    for (const address of i.addresses) steps.push(ip('addr', 'add', address, 'dev', here));
  }
  for (const i of placed) {
    const here = nameOf.get(i.name) as string;
    for (const route of i.routes) {
      steps.push(
        ip(
          ...(route.destination.includes(':') ? ['-6'] : []),
          'route',
          'add',
          route.destination,
          ...(route.gateway ? ['via', route.gateway] : []),
          'dev',
          here,
          ...(route.source ? ['src', route.source] : []),
          ...(route.metric !== undefined ? ['metric', String(route.metric)] : []),
        ),
      );
    }
  }
  const nameservers = config.nameservers.filter((server) => !isLoopback(server));
  for (const server of config.nameservers.filter(isLoopback)) {
    warnings.push(
      `nameserver ${server} is a resolver on the loopback of the OS taken over (a stub such as systemd-resolved's, or a cache), which this image does not run, and no upstream server of it was captured: left out (DNS from DHCP, if any)`,
    );
  }
  if (nameservers.length > 0) {
    steps.push({
      kind: 'write',
      file: '/etc/resolv.conf',
      text: nameservers.map((s) => `nameserver ${s}\n`).join(''),
    });
  }
  const dhcp = placed.filter((i) => i.dhcp).map((i) => nameOf.get(i.name) as string);
  return { steps, dhcp, warnings };
}

function rank(i: NetworkInterface): number {
  return i.kind === 'device' ? 0 : i.kind === 'bond' ? 1 : 2;
}

/**
 * Carries out {@link networkSteps}, each step once, in order; a step that
 * fails is reported in the returned lines and the rest still run (a route
 * that fails leaves the others).
 */
export async function bringUpNetwork(plan: NetworkPlan, log: (line: string) => void): Promise<void> {
  for (const warning of plan.warnings) log(`network: ${warning}`);
  for (const step of plan.steps) {
    try {
      if (step.kind === 'write') await writeFile(step.file, step.text);
      else await promisify(execFile)(step.argv[0] as string, step.argv.slice(1));
      log(`network: ${step.kind === 'write' ? `${step.file} <- ${step.text.trim()}` : step.argv.join(' ')}`);
    } catch (error) {
      log(
        `network: failed: ${step.kind === 'write' ? step.file : step.argv.join(' ')}: ${(error as Error).message.split('\n')[0]}`,
      );
    }
  }
}
