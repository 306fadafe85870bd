import { execFile } from 'node:child_process';
import { constants } from 'node:fs';
import { access, appendFile, copyFile, readFile, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';

/** The agent image the takeover kexecs into, and the kexec it does it with. */
export interface KexecImage {
  /** The image's kernel (`vmlinuz`). */
  readonly kernel: string;
  /** The image's initramfs; a copy with the machine's config appended is what is loaded. */
  readonly initramfs: string;
  /** kexec-tools' `kexec`: a path, or a name looked up on the PATH. */
  readonly kexec: string;
}

/** `kexec -l` refused the image: the takeover runs the agent in place instead, and says why. */
export class KexecError extends Error {
  override name = 'KexecError';
}

/**
 * Why the running kernel cannot kexec into `image`, or undefined when it
 * can as far as can be seen before trying: the image's files, the `kexec`
 * program, root, a kernel built with kexec (`/sys/kernel/kexec_loaded`)
 * that has not disabled it (`/proc/sys/kernel/kexec_load_disabled`).
 * `root` is where sysfs and procfs are (tests point it at a recorded tree).
 */
export async function kexecUnavailable(image: KexecImage, root = '/'): Promise<string | undefined> {
  for (const file of [image.kernel, image.initramfs]) {
    if (
      !(await stat(file).then(
        (s) => s.isFile(),
        () => false,
      ))
    )
      return `${file} is missing`;
  }
  if ((await findProgram(image.kexec)) === undefined) {
    return `no ${image.kexec} program (Debian's kexec-tools)`;
  }
  if (process.getuid?.() !== 0) return `kexec needs root, and the agent runs as user ${process.getuid?.()}`;
  if (
    !(await stat(path.join(root, 'sys/kernel/kexec_loaded')).then(
      () => true,
      () => false,
    ))
  ) {
    return 'the running kernel was built without kexec (no /sys/kernel/kexec_loaded)';
  }
  const disabled = await readFile(path.join(root, 'proc/sys/kernel/kexec_load_disabled'), 'utf8').catch(() => '0');
  if (disabled.trim() === '1') return 'kexec is disabled on the running kernel (kernel.kexec_load_disabled = 1)';
  return undefined;
}

/**
 * The agent image's kernel command line: the running kernel's consoles
 * (`console=` of `/proc/cmdline`), so its output goes where this machine's
 * did (a BMC's serial-over-LAN), else the first serial port's, as upstream.
 */
export function kexecCommandLine(runningCommandLine: string | undefined): string {
  const consoles = (runningCommandLine ?? '').split(/\s+/).filter((word) => /^console=[\w,.:/-]+$/.test(word));
  return [...(consoles.length > 0 ? consoles : ['console=tty0', 'console=ttyS0,115200']), 'panic=10'].join(' ');
}

/**
 * Loads the agent image into the running kernel (`kexec -l`, run later by
 * `kexec -e`): its kernel, and its initramfs with `config` (one machine's
 * agentConfigArchive) appended, 4-byte aligned as the kernel reads
 * concatenated archives. The combined initramfs is written next to the
 * image's, loaded, and removed (the kernel holds its copy).
 *
 * @throws {@link KexecError} with kexec's own words when it refuses
 */
export async function stageKexec(image: KexecImage, config: Uint8Array, commandLine: string): Promise<void> {
  const combined = `${image.initramfs}.${process.pid}.kexec`;
  try {
    await copyFile(image.initramfs, combined);
    const size = (await stat(combined)).size;
    await appendFile(combined, Buffer.concat([Buffer.alloc((4 - (size % 4)) % 4), config]));
    await promisify(execFile)(image.kexec, [
      '-l',
      image.kernel,
      `--initrd=${combined}`,
      `--command-line=${commandLine}`,
    ]).catch((error: NodeJS.ErrnoException & { stderr?: string }) => {
      throw new KexecError(`${image.kexec} -l ${image.kernel} failed: ${error.stderr?.trim() || error.message}`);
    });
  } finally {
    await rm(combined, { force: true });
  }
}

/** The path of `program` (one with a slash as it is, else the first executable on the PATH), or undefined. */
async function findProgram(program: string): Promise<string | undefined> {
  const candidates = program.includes('/')
    ? [program]
    : (process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':').map((dir) => path.join(dir, program));
  for (const candidate of candidates) {
    if (
      await access(candidate, constants.X_OK).then(
        () => true,
        () => false,
      )
    )
      return candidate;
  }
  return undefined;
}

/**
 * Resolves once the SSH session that ran the takeover has ended, so that
 * its answer reached the shepherd before the kexec: the nearest `sshd`
 * ancestor of process `from` (OpenSSH's session process) has exited, or,
 * without one, process `from` itself; waiting at most `boundMs`.
 */
export async function sessionEnded(from: number, boundMs: number, root = '/'): Promise<void> {
  const session = (await sshdAncestor(from, root)) ?? from;
  const started = await startTime(session, root);
  const deadline = Date.now() + boundMs;
  while (started !== undefined && (await startTime(session, root)) === started && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** The nearest ancestor of `pid` (itself included) whose command is sshd (or sshd-session), if any. */
async function sshdAncestor(pid: number, root: string): Promise<number | undefined> {
  for (let current = pid, hops = 0; current > 1 && hops < 64; hops++) {
    const stat = await readFile(path.join(root, `proc/${current}/stat`), 'utf8').catch(() => undefined);
    if (stat === undefined) return undefined;
    const command = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
    if (command === 'sshd' || command === 'sshd-session') return current;
    current = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  }
  return undefined;
}

/** A process's start time (field 22 of its stat), so a reused process ID is not taken for it; undefined once gone. */
async function startTime(pid: number, root: string): Promise<string | undefined> {
  const stat = await readFile(path.join(root, `proc/${pid}/stat`), 'utf8').catch(() => undefined);
  if (stat === undefined) return undefined;
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return fields[0] === 'Z' ? undefined : fields[19];
}
