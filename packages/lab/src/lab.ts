import { access, chmod, mkdir, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { hostname, loadavg } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type AgentImage, AgentImageError, buildAgentImage } from '@bmaas/agent';
import { describeError } from '@bmaas/common';
import { FakeRedfishServer, IpmiSimulator, selfSignedCertificate } from '@bmaas/provider-static/testing';
import { selfSignedServerTls } from '@bmaas/server';
import { SshKey } from '@bmaas/shepherd-manager';
import { LabSetupError } from './errors.js';
import { prepareGuestShare } from './guest-share.js';
import { buildInitramfs } from './initramfs.js';
import { findKernel } from './kernel.js';
import { log } from './log.js';
import { LabProcess } from './processes.js';
import { QemuRedfishPower } from './redfish-power.js';
import { VirtualMachine, type VmDiskController, type VmFirmware } from './vm.js';

/** How a lab machine's BMC is spoken to. */
export type LabBmcProtocol = 'ipmi' | 'redfish';

/**
 * How a blank lab machine's agent arrives, booted by its BMC (the
 * inventory's `agentBoot`): from virtual media (a Redfish BMC's CD) or over
 * the network (iPXE, any BMC).
 */
export type LabAgentBoot = 'virtual-media' | 'network';

/** Options of {@link Lab.start}. */
export interface LabOptions {
  /** Virtual machines. Default 3. */
  readonly vms?: number;
  /** The lab's own directory (VMs, BMCs, BMDB, logs); made, and removed by `stop` unless `keep`. */
  readonly dir: string;
  readonly keep?: boolean;
  /** Where the initramfs and the guest share are cached between starts. */
  readonly cacheDir: string;
  /** The `shepherd` CLI script (`packages/cli/bin/shepherd.js`). */
  readonly shepherd: string;
  /** The BMDB: a PostgreSQL URL; default an embedded PostgreSQL in the lab's directory. */
  readonly bmdbUrl?: string;
  /** The fleet page's address. Default 127.0.0.1:8080. */
  readonly webListen?: string;
  /** Which protocol VM `index` (from 0) gets. Default: IPMI for even indexes, Redfish for odd. */
  readonly protocol?: (index: number) => LabBmcProtocol;
  /**
   * Which firmware VM `index` (from 0) boots with. Default: OVMF (`uefi`) for the third VM,
   * `lab-vm3`, SeaBIOS for the others: the lab has both kinds from three VMs on.
   */
  readonly firmware?: (index: number) => VmFirmware;
  /** What VM `index`'s disk sits behind (`megasas`, `nvme`). Default `virtio` for every VM. */
  readonly diskController?: (index: number) => VmDiskController;
  /** The guest address VM `index`'s SSH forward goes to, for an OS given a static one. Default QEMU's DHCP address, 10.0.2.15. */
  readonly sshGuestAddress?: (index: number) => string | undefined;
  /**
   * Which VMs (by index, from 0) are blank: an empty disk and no OS, their
   * agent booted by their BMC as this says (`undefined`: the VM boots the
   * lab's "installed OS" and is taken over over SSH, the default for all).
   * A `virtual-media` VM needs a Redfish BMC (see `protocol`).
   */
  readonly agentBoot?: (index: number) => LabAgentBoot | undefined;
  /** The agent's heartbeat interval. Default 2s. */
  readonly heartbeatInterval?: string;
  /** The bundled agent the agent image runs. Default `packages/agent/dist/agent.cjs` (`npm run bundle -w @bmaas/agent`). */
  readonly agentBundle?: string;
  /** `shepherd run static` flags over the lab's (`recoverer-heartbeat-timeout`, …). */
  readonly runFlags?: Readonly<Record<string, string>>;
  /** Progress lines for a person. */
  readonly report?: (line: string) => void;
  /** Aborting it (Ctrl-C) ends the start: what was started is stopped, and `start` rejects. */
  readonly signal?: AbortSignal;
}

/** One VM of the lab with its BMC. */
export interface LabMachine {
  /** Its inventory `id` and host name: `lab-vm1`, … */
  readonly id: string;
  /** The loopback address its sshd is forwarded to. */
  readonly address: string;
  /** Its virtual disk's serial number and its NIC's MAC address, as QEMU was given them. */
  readonly diskSerial: string;
  readonly mac: string;
  readonly vm: VirtualMachine;
  readonly protocol: LabBmcProtocol;
  /** A blank VM's way its agent arrives through its BMC; `undefined`: over SSH, into its installed OS. */
  readonly agentBoot: LabAgentBoot | undefined;
  /** The inventory's `bmc` entry for it. */
  readonly bmc: Record<string, unknown>;
  /** Its `ipmi_sim`, for an IPMI VM. */
  readonly ipmiSimulator?: IpmiSimulator;
  /** How a person reaches its BMC by hand. */
  readonly bmcCommand: string;
}

/** The port every VM's sshd is forwarded to, each on its own address. */
export const LAB_SSH_PORT = 2222;
/** VM n (from 1) is at 127.0.1.(10 + n). */
const addressOf = (n: number) => `127.0.1.${10 + n}`;
/** VM n's disk serial and MAC, which its hardware report must show. */
const diskSerialOf = (n: number) => `lab-vm${n}-disk`;
const macOf = (n: number) => `52:54:00:00:01:${(0x10 + n).toString(16)}`;
const IPMI_PASSWORD = 'lab-ipmi-pw';
const REDFISH_PASSWORD = 'lab-redfish-pw';

/**
 * The lab: QEMU virtual machines booting Debian's kernel, each with a BMC
 * that drives it over QMP (OpenIPMI's ipmi_sim for some, the fake Redfish
 * BMC for the others), and the shepherd around them: `shepherd run static`
 * over an inventory of the VMs, `shepherd server` the agents heartbeat to,
 * and the fleet page. {@link Lab.stop} ends all of it and removes its files.
 */
export class Lab {
  readonly machines: LabMachine[] = [];
  readonly #closers: Array<() => Promise<void>> = [];
  run: LabProcess | undefined;
  server: LabProcess | undefined;
  /** The one fake Redfish BMC serving every Redfish VM's ComputerSystem (HTTPS). */
  redfish: FakeRedfishServer | undefined;
  #redfishCa: string | undefined;
  serverPort = 0;
  /** The port of the shepherd's agent boot files (`0`: no blank VM, none served). */
  bootFilesPort = 0;
  /** The agent image the VMs are taken over into; its `takeover` payload is what the initializer uploads. */
  agentImage: AgentImage | undefined;
  readonly dataDir: string;
  readonly sshKeyPath: string;
  readonly inventoryPath: string;
  readonly webUrl: string;

  private constructor(readonly options: LabOptions) {
    this.dataDir = path.join(options.dir, 'shepherd');
    this.sshKeyPath = path.join(options.dir, 'ssh_key');
    this.inventoryPath = path.join(options.dir, 'inventory.json');
    this.webUrl = `http://${options.webListen ?? '127.0.0.1:8080'}/`;
  }

  /** Starts everything; on a failure stops what was started and rethrows. */
  static async start(options: LabOptions): Promise<Lab> {
    const lab = new Lab(options);
    try {
      await lab.#start();
      return lab;
    } catch (error) {
      await lab.stop();
      throw error;
    }
  }

  #report(line: string): void {
    log(line);
    this.options.report?.(line);
  }

  async #start(): Promise<void> {
    const { dir, cacheDir } = this.options;
    const count = this.options.vms ?? 3;
    const protocol = this.options.protocol ?? ((index: number) => (index % 2 === 0 ? 'ipmi' : 'redfish'));
    const firmware = this.options.firmware ?? ((index: number) => (index === 2 ? 'uefi' : 'bios'));
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    this.#closers.push(async () => {
      if (!this.options.keep) await rm(dir, { recursive: true, force: true });
    });

    let started = Date.now();
    const kernel = findKernel();
    const initramfs = await buildInitramfs(cacheDir, kernel, process.execPath);
    const share = await prepareGuestShare(cacheDir);
    this.#report(
      `initramfs ${initramfs.cached ? 'from the cache' : 'built'} in ${seconds(started)} (${(initramfs.bytes / 2 ** 20).toFixed(0)} MiB; kernel ${kernel.release})`,
    );
    const key = await SshKey.loadOrGenerate(this.sshKeyPath, { comment: 'shepherd-lab' });

    started = Date.now();
    const agentBundle =
      this.options.agentBundle ?? fileURLToPath(new URL('../../agent/dist/agent.cjs', import.meta.url));
    await access(agentBundle).catch(() => {
      throw new LabSetupError(`${agentBundle} is missing: bundle the agent first (npm run bundle -w @bmaas/agent)`);
    });
    const image = await buildAgentImage({
      out: path.join(dir, 'agent-image'),
      cacheDir: path.join(cacheDir, 'agent-image'),
      agentBundle,
      takeoverFlags: [`--interval=${this.options.heartbeatInterval ?? '2s'}`],
    }).catch((error: unknown) => {
      throw error instanceof AgentImageError ? new LabSetupError(error.message, { cause: error }) : error;
    });
    this.agentImage = image;
    this.#report(
      `agent image ${image.cached.initramfs ? 'from the cache' : 'built'} in ${seconds(started)}: takeover payload ${(image.takeoverBytes / 2 ** 20).toFixed(1)} MiB`,
    );

    const agentBoot = this.options.agentBoot ?? (() => undefined);
    const blank = Array.from({ length: count }, (_, index) => agentBoot(index)).some((way) => way !== undefined);
    if (blank) this.bootFilesPort = await freePort();
    started = Date.now();
    const vms = await Promise.all(
      Array.from({ length: count }, (_, index) =>
        VirtualMachine.start({
          blank: agentBoot(index) !== undefined,
          // QEMU's DHCP hands the NIC's iPXE the shepherd's script for this MAC (QEMU expands no
          // ${net0/mac} of iPXE's): the iPXE script then loads this boot's kernel and initramfs.
          netBootFile:
            agentBoot(index) === 'network'
              ? `http://10.0.2.2:${this.bootFilesPort}/agent-boot/ipxe?mac=${macOf(index + 1)}`
              : undefined,
          name: `lab-vm${index + 1}`,
          dir: path.join(dir, `vm${index + 1}`),
          kernel,
          initramfs: initramfs.path,
          guestDir: share.dir,
          address: addressOf(index + 1),
          sshPort: LAB_SSH_PORT,
          authorizedKeys: [key.authorizedKey],
          // The takeover unpacks node and the agent image beside its upload, and loads the image for
          // the kexec: more than the installed OS alone needs.
          memory: 1024,
          diskSerial: diskSerialOf(index + 1),
          mac: macOf(index + 1),
          firmware: firmware(index),
          diskController: this.options.diskController?.(index),
          sshGuestAddress: this.options.sshGuestAddress?.(index),
        }),
      ),
    );
    this.#closers.push(() => Promise.all(vms.map((vm) => vm.stop())).then(() => undefined));
    for (const [index, vm] of vms.entries()) {
      this.machines.push(await this.#bmcFor(vm, protocol(index), agentBoot(index)));
    }
    const signal = this.options.signal;
    signal?.throwIfAborted();
    await Promise.all(
      vms.map(async (vm) => {
        // A blank VM has nothing to answer SSH: its BMC boots its agent once the shepherd runs.
        if (vm.options.blank) return;
        await vm.waitForSsh(300_000, signal);
        this.#report(
          `${vm.name} (${vm.firmware === 'uefi' ? 'UEFI' : 'BIOS'}): sshd answering ${seconds(vm.startedAt)} after its start`,
        );
      }),
    );
    this.#report(`${count} VM(s) booted to sshd in ${seconds(started)} (load ${loadavg()[0]?.toFixed(2)})`);

    await writeFile(
      this.inventoryPath,
      `${JSON.stringify(
        this.machines.map((m) =>
          m.agentBoot === undefined
            ? { id: m.id, address: m.address, location: 'lab', bmc: m.bmc }
            : {
                id: m.id,
                agentBoot: m.agentBoot,
                ...(m.agentBoot === 'network' ? { macs: [m.mac] } : {}),
                bootMode: m.vm.firmware === 'uefi' ? 'uefi' : 'legacy',
                location: 'lab',
                bmc: m.bmc,
              },
        ),
        null,
        2,
      )}\n`,
      { mode: 0o600 },
    );
    // The agents dial the server at slirp's 10.0.2.2: its certificate must name that address.
    const tls = await selfSignedServerTls(path.join(dir, 'server-tls'), {
      altNames: [hostname(), 'localhost', '127.0.0.1', '10.0.2.2'],
    });
    this.serverPort = await freePort();

    const flags = (record: Record<string, string>) => Object.entries(record).flatMap(([k, v]) => [`--${k}`, v]);
    const shepherd = this.options.shepherd;
    this.run = LabProcess.start(
      'shepherd run static',
      shepherd,
      [
        'run',
        'static',
        ...flags({
          ...this.#database(),
          inventory: this.inventoryPath,
          'ssh-key-path': this.sshKeyPath,
          'agent-executable-path': image.takeover,
          'agent-target-path': '/root/agent',
          'agent-endpoint': `10.0.2.2:${this.serverPort}`,
          'agent-endpoint-ca-certificate-path': tls.certPath,
          'agent-ssh-port': String(LAB_SSH_PORT),
          // A VM reset by the recoverer is dialed at once; under load it may take minutes to its sshd,
          // and a dial given up on backs the machine off for five.
          'agent-ssh-connect-timeout': '300s',
          // The payload's upload over QEMU's user network, its unpacking and kexec -l under TCG.
          'agent-ssh-exec-timeout': '300s',
          'web-listen': this.options.webListen ?? '127.0.0.1:8080',
          'static-reboot-wait': '1s',
          // A takeover under way (the 51 MiB payload's upload, kexec -l) takes minutes under TCG: a stop
          // cancels it, well within the grace the lab gives `shepherd run` before killing it.
          'stop-grace-period': '5s',
          'initializer-loop-parallelism': String(Math.min(count, 4)),
          'recoverer-first-heartbeat-timeout': '120s',
          // An agent its BMC booted is told to heartbeat every 10 s, a third of this (the agent
          // booter's `--interval` in the boot's configuration).
          'recoverer-heartbeat-timeout': '30s',
          ...this.#redfishRunFlags(),
          ...this.#agentBootFlags(path.dirname(image.iso)),
          ...this.options.runFlags,
        }),
      ],
      path.join(dir, 'shepherd-run.log'),
    );
    this.#closers.push(() => this.run?.stop() ?? Promise.resolve());
    signal?.throwIfAborted();
    await this.run.printed(/serving the fleet page/, 120_000, signal);
    this.server = LabProcess.start(
      'shepherd server',
      shepherd,
      [
        'server',
        ...flags({
          ...this.#database(),
          listen: `127.0.0.1:${this.serverPort}`,
          'tls-cert': tls.certPath,
          'tls-key': path.join(dir, 'server-tls', 'server.key'),
        }),
      ],
      path.join(dir, 'shepherd-server.log'),
    );
    this.#closers.push(() => this.server?.stop() ?? Promise.resolve());
    await this.server.printed(/BMaaS server listening/, 120_000, signal);
  }

  /** The BMC of `vm` over `protocol`, started. */
  async #bmcFor(
    vm: VirtualMachine,
    protocol: LabBmcProtocol,
    agentBoot: LabAgentBoot | undefined,
  ): Promise<LabMachine> {
    if (agentBoot === 'virtual-media' && protocol !== 'redfish') {
      throw new LabSetupError(`${vm.name}: virtual media needs a Redfish BMC, and its BMC is ${protocol}`);
    }
    const passwordFile = path.join(vm.options.dir, 'bmc-password');
    if (protocol === 'ipmi') {
      // The built program (`../dist` from the sources and from the build alike): ipmi_sim runs it with node.
      const chassisControl = fileURLToPath(new URL('../dist/chassis-control.js', import.meta.url));
      await access(chassisControl).catch(() => {
        throw new LabSetupError(`${chassisControl} is missing: build the packages first (npm run build)`);
      });
      const sim = await IpmiSimulator.start({
        host: vm.options.address,
        password: IPMI_PASSWORD,
        dir: path.join(vm.options.dir, 'ipmi'),
        chassisControl: [process.execPath, chassisControl, vm.bmcQmpSocket, path.join(vm.options.dir, 'boot-device')]
          .map((word) => `'${word}'`)
          .join(' '),
      });
      this.#closers.push(() => sim.close());
      await writeFile(passwordFile, `${IPMI_PASSWORD}\n`, { mode: 0o600 });
      return {
        id: vm.name,
        address: vm.options.address,
        diskSerial: vm.options.diskSerial ?? '',
        mac: vm.options.mac ?? '',
        vm,
        protocol,
        agentBoot,
        bmc: { protocol: 'ipmi', host: sim.host, port: sim.port, username: sim.username, passwordFile, cipherSuite: 3 },
        ipmiSimulator: sim,
        bmcCommand: `IPMI_PASSWORD=$(cat ${passwordFile}) ipmitool -I lanplus -C 3 -H ${sim.host} -p ${sim.port} -U ${sim.username} -E chassis power status`,
      };
    }
    if (this.redfish === undefined) {
      const certificate = await selfSignedCertificate();
      this.redfish = await FakeRedfishServer.start({ tls: certificate, password: REDFISH_PASSWORD });
      const fake = this.redfish;
      this.#closers.push(() => fake.close());
      this.#redfishCa = path.join(this.options.dir, 'redfish-ca.pem');
      await writeFile(this.#redfishCa, certificate.cert);
    }
    const url = this.redfish.addSystem(vm.name, { power: new QemuRedfishPower(vm) });
    await writeFile(passwordFile, `${REDFISH_PASSWORD}\n`, { mode: 0o600 });
    return {
      id: vm.name,
      address: vm.options.address,
      diskSerial: vm.options.diskSerial ?? '',
      mac: vm.options.mac ?? '',
      vm,
      protocol,
      agentBoot,
      bmc: { url, username: this.redfish.username, passwordFile },
      bmcCommand: `curl --cacert ${this.#redfishCa} -u ${this.redfish.username}:$(cat ${passwordFile}) ${url}`,
    };
  }

  /** Where both shepherd processes find the BMDB: the embedded one `shepherd run` starts, which the server attaches to. */
  #database(): Record<string, string> {
    return this.options.bmdbUrl === undefined ? { 'data-dir': this.dataDir } : { 'bmdb-url': this.options.bmdbUrl };
  }

  #redfishRunFlags(): Record<string, string> {
    return this.#redfishCa === undefined ? {} : { 'redfish-ca-file': this.#redfishCa };
  }

  /**
   * The agent booter's flags, when a VM is blank: the agent image's
   * directory, its boot files served over plain HTTP to the VMs at
   * `10.0.2.2` (the iPXE ROM QEMU runs checks HTTPS certificates against
   * roots of its own, which a self-signed one is not).
   */
  #agentBootFlags(imageDir: string): Record<string, string> {
    if (this.bootFilesPort === 0) return {};
    return {
      'agent-boot-image-dir': imageDir,
      'agent-boot-listen': `127.0.0.1:${this.bootFilesPort}`,
      'agent-boot-url': `http://10.0.2.2:${this.bootFilesPort}`,
    };
  }

  /** Where to look, for a person. */
  describe(): string {
    const lines = [
      `fleet page:   ${this.webUrl}`,
      `status:       npx shepherd status ${this.options.bmdbUrl === undefined ? `--data-dir ${this.dataDir}` : '--bmdb-url …'}`,
      `inventory:    ${this.inventoryPath}`,
      `logs:         ${path.join(this.options.dir, 'shepherd-run.log')}, ${path.join(this.options.dir, 'shepherd-server.log')}`,
      '',
      ...this.machines.flatMap((m) => [
        `${m.id} (${m.protocol.toUpperCase()} BMC, ${m.vm.firmware === 'uefi' ? 'UEFI' : 'BIOS'})`,
        `  ssh:     ssh -i ${this.sshKeyPath} -p ${LAB_SSH_PORT} -o StrictHostKeyChecking=no root@${m.address}`,
        `  BMC:     ${m.bmcCommand}`,
        `  console: ${m.vm.consoleLog}`,
      ]),
    ];
    return lines.join('\n');
  }

  /**
   * Stops the shepherd, the server, the BMCs and the VMs, and removes the
   * lab's files (unless `keep`). What did not stop cleanly is reported, and
   * the rest is stopped all the same.
   */
  async stop(): Promise<void> {
    for (const close of this.#closers.splice(0).reverse()) {
      await close().catch((error: unknown) => this.#report(`stopping: ${describeError(error)}`));
    }
  }
}

function seconds(since: number): string {
  return `${((Date.now() - since) / 1000).toFixed(1)} s`;
}

/** A TCP port of 127.0.0.1 nothing listens on right now. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}
