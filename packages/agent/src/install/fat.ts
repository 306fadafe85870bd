// A FAT16 file system written byte by byte, for the config drive: the agent image carries no
// mkfs.fat or mtools, and a loop mount needs what a test machine may not grant. Every name gets
// long-name (VFAT) entries, so Linux, cloud-init and mtools read them as written, in lower case.

/** A file of the file system, by its path (`openstack/latest/meta_data.json`). */
export interface FatFile {
  readonly path: string;
  readonly contents: Uint8Array;
}

/** The file system's layout and its bytes that matter: those before the first free cluster. */
export interface FatImage {
  /** From the file system's first byte: boot sector, FATs, root directory, the used clusters. */
  readonly bytes: Buffer;
  readonly sectorSize: number;
  readonly totalSectors: number;
}

/** The file system cannot hold what was asked of it. */
export class FatError extends Error {
  override name = 'FatError';
}

const ROOT_ENTRIES = 512;
const ENTRY = 32;
const ATTR_DIRECTORY = 0x10;
const ATTR_ARCHIVE = 0x20;
const ATTR_VOLUME = 0x08;
const ATTR_LONG_NAME = 0x0f;
/** FAT16 holds 4085 to 65524 clusters: fewer is FAT12, more FAT32, whatever the label says. */
const MIN_CLUSTERS = 4085;
const MAX_CLUSTERS = 65524;

interface Directory {
  readonly name: string;
  readonly children: Map<string, Directory | FatFile>;
  cluster: number;
}

/**
 * A FAT16 file system of `totalSectors` sectors of `sectorSize` bytes,
 * labelled `label` (at most 11 characters), holding `files` under
 * directories made as their paths need. `hiddenSectors` is where the
 * partition starts on its disk (the boot sector records it). Only the
 * returned prefix need be written: the clusters after it are free.
 *
 * @throws {@link FatError} when the files do not fit, a path is empty, or the size makes no FAT16
 */
export function fatImage(options: {
  readonly label: string;
  readonly files: readonly FatFile[];
  readonly sectorSize: number;
  readonly totalSectors: number;
  readonly hiddenSectors: number;
  readonly volumeId: number;
  readonly time: Date;
}): FatImage {
  const { sectorSize, totalSectors } = options;
  if (options.label.length > 11 || !/^[\x20-\x7e]*$/.test(options.label)) {
    throw new FatError(`label ${JSON.stringify(options.label)}: want at most 11 printable ASCII characters`);
  }
  const rootSectors = (ROOT_ENTRIES * ENTRY) / sectorSize;
  let clusterSectors = 1;
  let fatSectors = 0;
  let clusters = 0;
  for (; clusterSectors <= 128; clusterSectors *= 2) {
    // The FAT's size depends on the clusters it maps and the other way round: settle it from above.
    fatSectors = Math.ceil(((totalSectors / clusterSectors + 2) * 2) / sectorSize);
    clusters = Math.floor((totalSectors - 1 - 2 * fatSectors - rootSectors) / clusterSectors);
    if (clusters <= MAX_CLUSTERS) break;
  }
  if (clusters < MIN_CLUSTERS || clusters > MAX_CLUSTERS) {
    throw new FatError(`${totalSectors} sectors of ${sectorSize} bytes make no FAT16 (${clusters} clusters)`);
  }
  const clusterBytes = clusterSectors * sectorSize;

  const root: Directory = { name: '', children: new Map(), cluster: 0 };
  for (const file of options.files) {
    const parts = file.path.split('/');
    const base = parts.pop();
    if (!base || parts.some((part) => part === '')) throw new FatError(`path ${JSON.stringify(file.path)} is empty`);
    let directory = root;
    for (const part of parts) {
      let next = directory.children.get(part);
      if (next === undefined) {
        next = { name: part, children: new Map(), cluster: 0 };
        directory.children.set(part, next);
      }
      if (!('children' in next)) throw new FatError(`${file.path}: ${part} is a file`);
      directory = next;
    }
    directory.children.set(base, file);
  }

  // Clusters are handed out in order from 2, so the used ones are one run after the root directory.
  const fat: number[] = [0xfff8, 0xffff];
  const placed: { readonly first: number; readonly bytes: Buffer }[] = [];
  const allocate = (bytes: number): number => {
    const count = Math.max(1, Math.ceil(bytes / clusterBytes));
    const first = fat.length;
    for (let i = 0; i < count; i++) fat.push(i === count - 1 ? 0xffff : first + i + 1);
    if (fat.length - 2 > clusters) throw new FatError(`the files need more than ${clusters} clusters`);
    return first;
  };
  const place = (first: number, bytes: Buffer) => placed.push({ first, bytes });
  const stamp = dosTime(options.time);

  const writeDirectory = (directory: Directory, parent: number): Buffer => {
    const entries: Buffer[] = [];
    if (directory !== root) {
      entries.push(entry('.          ', ATTR_DIRECTORY, directory.cluster, 0, stamp));
      entries.push(entry('..         ', ATTR_DIRECTORY, parent, 0, stamp));
    } else {
      entries.push(entry(options.label.padEnd(11, ' '), ATTR_VOLUME, 0, 0, stamp));
    }
    const shortNames = new Set<string>();
    for (const [name, child] of directory.children) {
      const short = shortName(name, shortNames);
      entries.push(...longNameEntries(name, short));
      if ('children' in child) entries.push(entry(short, ATTR_DIRECTORY, child.cluster, 0, stamp));
      else {
        const cluster = child.contents.length === 0 ? 0 : allocate(child.contents.length);
        if (cluster !== 0) place(cluster, Buffer.from(child.contents));
        entries.push(entry(short, ATTR_ARCHIVE, cluster, child.contents.length, stamp));
      }
    }
    return Buffer.concat(entries);
  };

  // Each directory's cluster is taken before its entries are written, since its parent names it.
  const walk = (directory: Directory, parent: number): Buffer => {
    for (const child of directory.children.values()) {
      if ('children' in child) child.cluster = allocate(directoryBytes(child));
    }
    const bytes = writeDirectory(directory, parent);
    for (const child of directory.children.values()) {
      if ('children' in child) place(child.cluster, walk(child, directory === root ? 0 : directory.cluster));
    }
    return bytes;
  };
  const rootBytes = walk(root, 0);
  if (rootBytes.length > ROOT_ENTRIES * ENTRY)
    throw new FatError(`the root directory holds more than ${ROOT_ENTRIES} entries`);

  const boot = Buffer.alloc(sectorSize);
  boot.set([0xeb, 0x3c, 0x90], 0);
  boot.write('BMAAS   ', 3, 'latin1');
  boot.writeUInt16LE(sectorSize, 11);
  boot[13] = clusterSectors;
  boot.writeUInt16LE(1, 14);
  boot[16] = 2;
  boot.writeUInt16LE(ROOT_ENTRIES, 17);
  boot.writeUInt16LE(totalSectors < 0x10000 ? totalSectors : 0, 19);
  boot[21] = 0xf8;
  boot.writeUInt16LE(fatSectors, 22);
  boot.writeUInt16LE(32, 24);
  boot.writeUInt16LE(64, 26);
  boot.writeUInt32LE(options.hiddenSectors <= 0xffffffff ? options.hiddenSectors : 0, 28);
  boot.writeUInt32LE(totalSectors < 0x10000 ? 0 : totalSectors, 32);
  boot[36] = 0x80;
  boot[38] = 0x29;
  boot.writeUInt32LE(options.volumeId >>> 0, 39);
  boot.write(options.label.padEnd(11, ' '), 43, 'latin1');
  boot.write('FAT16   ', 54, 'latin1');
  boot.writeUInt16LE(0xaa55, 510);

  const table = Buffer.alloc(fatSectors * sectorSize);
  for (const [i, next] of fat.entries()) table.writeUInt16LE(next, i * 2);
  const rootRegion = Buffer.alloc(rootSectors * sectorSize);
  rootBytes.copy(rootRegion);
  const data = Buffer.alloc((fat.length - 2) * clusterBytes);
  for (const { first, bytes } of placed) bytes.copy(data, (first - 2) * clusterBytes);
  const bytes = Buffer.concat([boot, table, table, rootRegion, data]);
  return { bytes, sectorSize, totalSectors };
}

/** A directory's entries' bytes: `.`, `..` and each child's long and short entries. */
function directoryBytes(directory: Directory): number {
  let count = 2;
  for (const name of directory.children.keys()) count += Math.ceil(name.length / 13) + 1;
  return count * ENTRY;
}

/** One 8.3 directory entry; `name` is the 11 characters as stored. */
function entry(name: string, attributes: number, cluster: number, size: number, stamp: DosTime): Buffer {
  const e = Buffer.alloc(ENTRY);
  e.write(name, 0, 11, 'latin1');
  e[11] = attributes;
  e.writeUInt16LE(stamp.time, 14);
  e.writeUInt16LE(stamp.date, 16);
  e.writeUInt16LE(stamp.date, 18);
  e.writeUInt16LE(stamp.time, 22);
  e.writeUInt16LE(stamp.date, 24);
  e.writeUInt16LE(cluster, 26);
  e.writeUInt32LE(size, 28);
  return e;
}

/** A unique 8.3 name for `name` in its directory: `META_D~1JSO`. */
function shortName(name: string, taken: Set<string>): string {
  const dot = name.lastIndexOf('.');
  const clean = (text: string) => text.toUpperCase().replace(/[^A-Z0-9_-]/g, '_');
  const base = clean(dot > 0 ? name.slice(0, dot) : name);
  const extension = clean(dot > 0 ? name.slice(dot + 1) : '').slice(0, 3);
  for (let n = 1; n < 1_000_000; n++) {
    const tail = `~${n}`;
    const short = `${base.slice(0, 8 - tail.length)}${tail}`.padEnd(8, ' ') + extension.padEnd(3, ' ');
    if (!taken.has(short)) {
      taken.add(short);
      return short;
    }
  }
  throw new FatError(`no short name left for ${JSON.stringify(name)}`);
}

/** The VFAT long-name entries of `name`, last part first, as they precede its short entry. */
function longNameEntries(name: string, short: string): Buffer[] {
  if (name.length > 255) throw new FatError(`name ${JSON.stringify(name)} is longer than 255 characters`);
  let checksum = 0;
  for (const byte of Buffer.from(short, 'latin1')) checksum = (((checksum & 1) << 7) + (checksum >> 1) + byte) & 0xff;
  const units: number[] = [...name].map((c) => c.charCodeAt(0));
  const count = Math.ceil(units.length / 13);
  if (units.length % 13 !== 0) units.push(0);
  while (units.length < count * 13) units.push(0xffff);
  const entries: Buffer[] = [];
  for (let i = count; i >= 1; i--) {
    const e = Buffer.alloc(ENTRY);
    e[0] = i | (i === count ? 0x40 : 0);
    e[11] = ATTR_LONG_NAME;
    e[13] = checksum;
    const part = units.slice((i - 1) * 13, i * 13);
    for (const [j, unit] of part.entries()) {
      e.writeUInt16LE(unit, j < 5 ? 1 + j * 2 : j < 11 ? 14 + (j - 5) * 2 : 28 + (j - 11) * 2);
    }
    entries.push(e);
  }
  return entries;
}

interface DosTime {
  readonly date: number;
  readonly time: number;
}

function dosTime(at: Date): DosTime {
  const year = Math.min(Math.max(at.getUTCFullYear(), 1980), 2107);
  return {
    date: ((year - 1980) << 9) | ((at.getUTCMonth() + 1) << 5) | at.getUTCDate(),
    time: (at.getUTCHours() << 11) | (at.getUTCMinutes() << 5) | Math.floor(at.getUTCSeconds() / 2),
  };
}
