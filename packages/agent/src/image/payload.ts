import { createReadStream } from 'node:fs';
import { open, readFile, rename, stat } from 'node:fs/promises';
import { AgentImageError } from './errors.js';
import { AGENT_PATH } from './init-script.js';

/** The header's size: busybox starts at this offset, where `dd bs=4096 skip=1` finds it. */
const BLOCK = 4096;

/** What goes into a takeover payload: busybox, the image's kernel and gzip initramfs, and what to extract. */
export interface TakeoverPayloadParts {
  readonly busybox: string;
  readonly vmlinuz: string;
  readonly initramfs: string;
  /** The files the takeover runs from, paths inside the initramfs: node, the agent, kexec, their libraries. */
  readonly runtime: readonly string[];
  /** The directories of the libraries, paths inside the initramfs (ld.so's --library-path). */
  readonly libraryDirs: readonly string[];
  /** The dynamic loader inside the initramfs (`/lib64/ld-linux-x86-64.so.2`). */
  readonly loader: string;
  /** Flags for `takeover` (and so the agent), each a word: `--interval=30s`. */
  readonly flags?: readonly string[];
}

/**
 * Writes the takeover payload, the one file the shepherd's initializer
 * uploads and runs over SSH (`agent-executable-path`): a `sh` header, then
 * busybox-static, the image's `vmlinuz` and its initramfs. The header needs
 * nothing on the machine but a POSIX shell with `dd`, `mkdir`, `chmod` and
 * `rm`: it cuts busybox out with `dd`, with busybox the kernel and
 * initramfs (into `<payload>.d`), and from the initramfs (gzip, which
 * busybox reads) node, the agent, kexec and their libraries; then runs
 * `takeover --image-dir` with node through the image's own dynamic loader,
 * so the machine's libc does not matter (its own arguments follow the
 * flags, and override them). Nothing is in it twice: node is
 * taken out of the initramfs the image boots with.
 *
 * @returns its size in bytes
 * @throws {@link AgentImageError} when a flag is not a plain word
 */
export async function writeTakeoverPayload(parts: TakeoverPayloadParts, target: string): Promise<number> {
  for (const flag of parts.flags ?? []) {
    if (!/^--[a-z-]+(=[\w.:/,-]+)?$/.test(flag)) {
      throw new AgentImageError(`takeover flag ${JSON.stringify(flag)}: want --name or --name=value, a plain word`);
    }
  }
  const busyboxBytes = (await stat(parts.busybox)).size;
  const vmlinuzBytes = (await stat(parts.vmlinuz)).size;
  const initramfsBytes = (await stat(parts.initramfs)).size;
  const busyboxBlocks = Math.ceil(busyboxBytes / BLOCK);
  const vmlinuzAt = BLOCK * (1 + busyboxBlocks);
  const initramfsAt = vmlinuzAt + vmlinuzBytes;
  const inside = (file: string) => file.replace(/^\/+/, '');
  const libraryPath = parts.libraryDirs.map((dir) => `$R/${inside(dir)}`).join(':');
  const script = `#!/bin/sh
# The BMaaS agent's takeover (shepherd agent-image build): this script, then busybox, the agent
# image's kernel (${vmlinuzBytes} bytes) and initramfs (${initramfsBytes} bytes). The shepherd runs it
# over SSH: a TakeoverInit on standard input, a TakeoverResponse on standard output.
set -e
D="$0.d"
rm -rf "$D"
mkdir -m 700 "$D" "$D/root"
dd if="$0" of="$D/busybox" bs=${BLOCK} skip=1 count=${busyboxBlocks} 2>/dev/null
chmod 700 "$D/busybox"
B="$D/busybox"
R="$D/root"
"$B" tail -c +${vmlinuzAt + 1} "$0" | "$B" head -c ${vmlinuzBytes} >"$D/vmlinuz"
"$B" tail -c +${initramfsAt + 1} "$0" | "$B" head -c ${initramfsBytes} >"$D/initramfs"
(cd "$R" && "$B" gunzip -c ../initramfs | "$B" cpio -i -d ${parts.runtime.map((file) => `'${inside(file)}'`).join(' ')} 2>/dev/null)
for program in node:usr/bin/node kexec:usr/sbin/kexec; do
  printf '#!/bin/sh\\nexec "%s" --library-path "%s" "%s" "$@"\\n' "$R/${inside(parts.loader)}" "${libraryPath}" "$R/\${program#*:}" >"$D/\${program%%:*}"
  chmod 700 "$D/\${program%%:*}"
done
exec "$D/node" "$R/${inside(AGENT_PATH)}" takeover --image-dir "$D" --kexec "$D/kexec" --node "$D/node" --log-file "$D/agent.log" ${(parts.flags ?? []).map((flag) => `'${flag}'`).join(' ')} "$@"
`;
  const header = Buffer.from(script);
  if (header.length >= BLOCK) {
    throw new AgentImageError(`the takeover header is ${header.length} bytes, more than its ${BLOCK}-byte block`);
  }
  const temporary = `${target}.${process.pid}.tmp`;
  const out = await open(temporary, 'w', 0o755);
  try {
    // The rest of the header's block: a comment the shell never reads (it execs before).
    await out.write(Buffer.concat([header, Buffer.alloc(BLOCK - header.length, '#')]));
    const busybox = await readFile(parts.busybox);
    await out.write(Buffer.concat([busybox, Buffer.alloc(busyboxBlocks * BLOCK - busybox.length)]));
    for (const file of [parts.vmlinuz, parts.initramfs]) {
      for await (const chunk of createReadStream(file)) await out.write(chunk as Buffer);
    }
  } finally {
    await out.close();
  }
  await rename(temporary, target);
  return (await stat(target)).size;
}
