import { type ChildProcess, spawn } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { access, chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { log } from '../internal/log.js';

/** Options of {@link IpmiSimulator.start}. */
export interface IpmiSimulatorOptions {
  /** The admin user. Default `admin`. */
  readonly username?: string;
  /** Its password (at most 20 characters). Default `secret`. */
  readonly password?: string;
  /** Address to listen on. Default 127.0.0.1. */
  readonly host?: string;
  /** UDP port. Default: a free one. */
  readonly port?: number;
  /**
   * The command ipmi_sim runs for chassis control (`chassis_control` of its
   * lan.conf), through `sh -c`, with `get power` / `set power 1` /
   * `set reset 1` / `set shutdown 1` / `set boot pxe` appended; a `get`
   * prints `power:1`. Default: a shell script keeping the power in a file of
   * the simulator's directory and recording every call.
   */
  readonly chassisControl?: string;
  /** `false`: the BMC has no chassis device, so chassis commands are "Invalid command". Default true. */
  readonly chassisDevice?: boolean;
  /** The simulated machine's power at start, for the default chassis control. Default on. */
  readonly powerOn?: boolean;
  /**
   * Boot device sets (`chassis bootdev`) the default chassis control drops
   * before it keeps one, as a BMC that ignores a boot override. Default 0;
   * {@link IpmiSimulator.ignoreBootDeviceSets} changes it later.
   */
  readonly ignoreBootDeviceSets?: number;
  /** Where ipmi_sim's files go. Default a new temporary directory, removed by `close`. */
  readonly dir?: string;
}

/** The program, for messages and skips. */
export const IPMI_SIM = 'ipmi_sim';

/** The default chassis control: power in `power`, every call appended to `calls`. */
const CHASSIS_SCRIPT = `#!/bin/sh
# chassis_control of ipmi_sim: "get power ..." prints "power:<0|1>"; "set power 1 reset 1 ..." acts.
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
op=$1
shift
case $op in
  get)
    for parm in "$@"; do
      case $parm in
        power) echo "power:$(cat "$dir/power")" ;;
        boot) echo "boot:$(cat "$dir/boot" 2>/dev/null || echo default)" ;;
        *) echo "unknown parameter $parm"; exit 1 ;;
      esac
    done ;;
  set)
    while [ $# -ge 2 ]; do
      case $1 in
        power) echo "$2" > "$dir/power" ;;
        shutdown) echo 0 > "$dir/power" ;;
        boot)
          # A BMC that drops the boot device now and then: the first "ignore-boot" sets are not kept.
          left=$(cat "$dir/ignore-boot" 2>/dev/null || echo 0)
          if [ "$left" -gt 0 ]; then echo $((left - 1)) > "$dir/ignore-boot"; echo "ignored boot $2" >> "$dir/calls"
          else echo "$2" > "$dir/boot"; fi ;;
      esac
      shift 2
    done ;;
  *) echo "unknown operation $op"; exit 1 ;;
esac
`;

/**
 * OpenIPMI's `ipmi_sim` (Debian's `openipmi`), the reference IPMI BMC
 * simulator, on a UDP port of 127.0.0.1: IPMI 2.0 RMCP+ with cipher suite 3
 * (not 17), one admin user, a BMC with a chassis device whose power is
 * driven by a chassis-control program. Its files (lan.conf, the emulation
 * commands, state) live in a directory of their own.
 *
 * @example
 * ```ts
 * const bmc = await IpmiSimulator.start({ password: 'pw' });
 * // ipmitool -I lanplus -C 3 -H 127.0.0.1 -p ${bmc.port} -U admin -E chassis power status
 * console.log(await bmc.calls()); // ['get power']
 * await bmc.close();
 * ```
 */
export class IpmiSimulator {
  readonly #child: ChildProcess;
  readonly #exited: Promise<void>;
  readonly #ownDir: boolean;
  #output = '';

  private constructor(
    readonly dir: string,
    readonly host: string,
    readonly port: number,
    readonly username: string,
    readonly password: string,
    child: ChildProcess,
    ownDir: boolean,
  ) {
    this.#child = child;
    this.#ownDir = ownDir;
    this.#exited = new Promise((resolve) => child.once('exit', () => resolve()));
    child.stdout?.on('data', (chunk: Buffer) => {
      this.#output = (this.#output + chunk.toString('utf8')).slice(-4000);
    });
    child.stderr?.on('data', (chunk: Buffer) => {
      this.#output = (this.#output + chunk.toString('utf8')).slice(-4000);
    });
  }

  /** Whether `ipmi_sim` can be run here; tests skip, saying so, when not. */
  static async available(): Promise<boolean> {
    return onPath(IPMI_SIM);
  }

  /** Writes the configuration, starts `ipmi_sim` and waits until it answers an RMCP ping. */
  static async start(options: IpmiSimulatorOptions = {}): Promise<IpmiSimulator> {
    const username = options.username ?? 'admin';
    const password = options.password ?? 'secret';
    const host = options.host ?? '127.0.0.1';
    const port = options.port ?? (await freeUdpPort(host));
    const ownDir = options.dir === undefined;
    const dir = options.dir ?? (await mkdtemp(path.join(tmpdir(), 'ipmi-sim-')));
    await mkdir(path.join(dir, 'state'), { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    let chassisControl = options.chassisControl;
    if (chassisControl === undefined) {
      const script = path.join(dir, 'chassis-control');
      await writeFile(script, CHASSIS_SCRIPT, { mode: 0o755 });
      await writeFile(path.join(dir, 'power'), options.powerOn === false ? '0\n' : '1\n');
      await writeFile(path.join(dir, 'ignore-boot'), `${options.ignoreBootDeviceSets ?? 0}\n`);
      chassisControl = script;
    }
    if (chassisControl.includes('"')) {
      throw new RangeError('IpmiSimulator: chassisControl must not hold double quotes (quote for sh with single ones)');
    }
    const quote = (value: string) => {
      if (/["\s\\]/.test(value))
        throw new RangeError(`IpmiSimulator: ${JSON.stringify(value)} must not hold spaces or quotes`);
      return value;
    };
    await writeFile(
      path.join(dir, 'lan.conf'),
      [
        'name "bmc"',
        'set_working_mc 0x20',
        '  startlan 1',
        `    addr ${host} ${port}`,
        '    priv_limit admin',
        '    allowed_auths_callback none md2 md5 straight',
        '    allowed_auths_user none md2 md5 straight',
        '    allowed_auths_operator none md2 md5 straight',
        '    allowed_auths_admin none md2 md5 straight',
        '    guid a123456789abcdefa123456789abcdef',
        '  endlan',
        `  chassis_control "${chassisControl}"`,
        `  user 2 true "${quote(username)}" "${quote(password)}" admin 10 none md2 md5 straight`,
        '',
      ].join('\n'),
      { mode: 0o600 },
    );
    // Device support 0x9f has the chassis device bit (0x80); without it chassis commands are unknown.
    const support = options.chassisDevice === false ? '0x1f' : '0x9f';
    await writeFile(
      path.join(dir, 'bmc.emu'),
      `mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 ${support} 0x1291 0xf02\nmc_enable 0x20\n`,
    );
    const child = spawn(
      IPMI_SIM,
      ['-c', path.join(dir, 'lan.conf'), '-f', path.join(dir, 'bmc.emu'), '-s', path.join(dir, 'state'), '-n'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const started = new IpmiSimulator(dir, host, port, username, password, child, ownDir);
    const spawned = new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    await spawned;
    try {
      await started.#waitForPong();
    } catch (error) {
      await started.close();
      throw error;
    }
    log.fake('ipmi_sim on %s:%d (%s)', host, port, dir);
    return started;
  }

  /** Every chassis-control call of the default script, oldest first: `get power`, `set power 0`, … */
  async calls(): Promise<string[]> {
    const text = await readFile(path.join(this.dir, 'calls'), 'utf8').catch(() => '');
    return text.split('\n').filter((line) => line !== '');
  }

  /** Makes the default chassis control drop the next `count` boot device sets. */
  async ignoreBootDeviceSets(count: number): Promise<void> {
    await writeFile(path.join(this.dir, 'ignore-boot'), `${count}\n`);
  }

  /** The boot device the default chassis control keeps (`pxe`, `cdrom`, …; `default` before any was set). */
  async bootDevice(): Promise<string> {
    return (await readFile(path.join(this.dir, 'boot'), 'utf8').catch(() => 'default')).trim();
  }

  /** The simulated machine's power (default script): true when on. */
  async powerOn(): Promise<boolean> {
    return (await readFile(path.join(this.dir, 'power'), 'utf8')).trim() === '1';
  }

  /** The ipmi_sim process's ID. */
  get pid(): number | undefined {
    return this.#child.pid;
  }

  /** What ipmi_sim printed last, for a failure's message. */
  get output(): string {
    return this.#output;
  }

  /** Stops ipmi_sim and removes its directory (one it made itself). */
  async close(): Promise<void> {
    if (this.#child.exitCode === null && this.#child.signalCode === null) {
      this.#child.kill('SIGKILL');
      await this.#exited;
    }
    if (this.#ownDir) await rm(this.dir, { recursive: true, force: true });
  }

  /** RMCP presence pings (ASF) until ipmi_sim answers one: it has bound its port. */
  async #waitForPong(): Promise<void> {
    const socket = createSocket(this.host.includes(':') ? 'udp6' : 'udp4');
    const ping = Buffer.from([0x06, 0x00, 0xff, 0x06, 0x00, 0x00, 0x11, 0xbe, 0x80, 0x00, 0x00, 0x00]);
    try {
      await new Promise<void>((resolve, reject) => {
        const deadline = Date.now() + 20_000;
        socket.on('message', () => resolve());
        const send = () => {
          if (this.#child.exitCode !== null) {
            reject(new Error(`ipmi_sim exited with code ${this.#child.exitCode}: ${this.#output}`));
            return;
          }
          if (Date.now() > deadline) {
            reject(new Error(`ipmi_sim did not answer an RMCP ping on ${this.host}:${this.port} within 20 s`));
            return;
          }
          socket.send(ping, this.port, this.host);
          timer = setTimeout(send, 50);
        };
        let timer = setTimeout(send, 0);
        socket.once('message', () => clearTimeout(timer));
      });
    } finally {
      socket.close();
    }
  }
}

/** A UDP port nothing listens on right now. */
async function freeUdpPort(host: string): Promise<number> {
  const socket = createSocket(host.includes(':') ? 'udp6' : 'udp4');
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    socket.bind(0, host, resolve);
  });
  const { port } = socket.address();
  await new Promise<void>((resolve) => socket.close(() => resolve()));
  return port;
}

/** Whether `program` is an executable file on `PATH`. */
export async function onPath(program: string): Promise<boolean> {
  for (const dir of (process.env.PATH ?? '/usr/bin:/bin').split(':')) {
    if (dir === '') continue;
    try {
      await access(path.join(dir, program), 1);
      return true;
    } catch {}
  }
  return false;
}
