// The "newc" cpio format the kernel unpacks an initramfs from (Documentation/driver-api/early-userspace).

/** One entry of an archive: a directory, a file (its bytes) or a symbolic link (its target). */
export type CpioEntry =
  | { readonly kind: 'dir'; readonly path: string; readonly mode?: number }
  | { readonly kind: 'file'; readonly path: string; readonly data: Uint8Array; readonly mode?: number }
  | { readonly kind: 'symlink'; readonly path: string; readonly target: string };

const TYPE = { dir: 0o040000, file: 0o100000, symlink: 0o120000 } as const;

/** The archive's bytes: the entries in order, then the trailer. Owned by root, dated at the epoch. */
export function cpioArchive(entries: readonly CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  let inode = 1;
  let offset = 0;
  const push = (buffer: Buffer) => {
    parts.push(buffer);
    offset += buffer.length;
  };
  const pad = () => {
    const rest = offset % 4;
    if (rest !== 0) push(Buffer.alloc(4 - rest));
  };
  const entry = (name: string, mode: number, data: Uint8Array, nlink: number) => {
    const fields = [inode++, mode, 0, 0, nlink, 0, data.length, 0, 0, 0, 0, Buffer.byteLength(name) + 1, 0];
    push(Buffer.from(`070701${fields.map((f) => f.toString(16).padStart(8, '0')).join('')}`, 'ascii'));
    push(Buffer.from(`${name}\0`, 'utf8'));
    pad();
    push(Buffer.from(data));
    pad();
  };
  for (const e of entries) {
    const name = e.path.replace(/^\/+/, '');
    if (e.kind === 'dir') entry(name, TYPE.dir | (e.mode ?? 0o755), new Uint8Array(), 2);
    else if (e.kind === 'file') entry(name, TYPE.file | (e.mode ?? 0o644), e.data, 1);
    else entry(name, TYPE.symlink | 0o777, Buffer.from(e.target, 'utf8'), 1);
  }
  entry('TRAILER!!!', 0, new Uint8Array(), 1);
  return Buffer.concat(parts);
}
