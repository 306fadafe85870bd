/**
 * The config drive on a disk (a regular file standing in for one) holding
 * an image's body: the partition table as sfdisk reads it, and the files as
 * mtools, blkid and fsck.fat read the file system, at the paths cloud-init's
 * ConfigDrive source reads.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, open, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  CONFIG_DRIVE_BYTES,
  type ConfigDriveContents,
  ConfigDriveError,
  writeConfigDrive,
} from '../src/install/config-drive.js';
import { networkData } from '../src/install/network-data.js';
import { gptDiskImage, LINUX_TYPE_GUID } from './disk-image-builder.js';

const run = promisify(execFile);
const MiB = 2 ** 20;
const HEAD = MiB;
const MACHINE = '0b9c1f7e-5d2a-4c3b-9e8f-7a6b5c4d3e2f';
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBmaas0perat0rKeyForTests0000000000000000 ops@example';
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'config-drive-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const contents: ConfigDriveContents = {
  machineId: MACHINE,
  hostname: 'rack1-node7',
  sshPublicKeys: [KEY],
  userData: Buffer.from('#cloud-config\npackages: [htop]\n'),
  networkData: networkData(
    {
      interfaces: [
        { kind: 'device', name: 'eno1', mac: '0c:c4:7a:00:00:01', addresses: [], dhcp: false, routes: [] },
        { kind: 'device', name: 'eno2', mac: '0c:c4:7a:00:00:02', addresses: [], dhcp: false, routes: [] },
        {
          kind: 'bond',
          name: 'bond0',
          mode: '802.3ad',
          members: ['eno1', 'eno2'],
          addresses: [],
          dhcp: false,
          routes: [],
        },
        {
          kind: 'vlan',
          name: 'bond0.20',
          parent: 'bond0',
          id: 20,
          protocol: '802.1Q',
          addresses: ['192.0.2.10/24', '2001:db8::10/64'],
          dhcp: false,
          routes: [{ destination: '0.0.0.0/0', gateway: '192.0.2.1' }],
        },
      ],
      nameservers: ['192.0.2.53'],
    },
    [],
  ),
  phoneHome: { url: `https://shepherd.example:8443/phone-home/${MACHINE}/s3cret`, caCertificate: undefined },
};

/** The image written as the write sequence leaves it before the head: its body on the disk, its head apart. */
async function diskWithBody(name: string, image: Buffer, diskBytes: number): Promise<{ disk: string; head: Buffer }> {
  const disk = path.join(dir, name);
  const handle = await open(disk, 'w');
  await handle.truncate(diskBytes);
  await handle.write(image, HEAD, image.length - HEAD, HEAD);
  await handle.close();
  return { disk, head: Buffer.from(image.subarray(0, HEAD)) };
}

async function withHead(disk: string, head: Buffer): Promise<void> {
  const handle = await open(disk, 'r+');
  await handle.write(head, 0, head.length, 0);
  await handle.close();
}

const mtools = (disk: string, offset: number) => ({
  image: `${disk}@@${offset}`,
  env: { ...process.env, MTOOLS_SKIP_CHECK: '1' },
});

describe('writeConfigDrive', () => {
  test('adds a config-2 partition at a GPT disk’s end holding what cloud-init reads, and moves the backup GPT there', async () => {
    const image = gptDiskImage(6 * MiB, [
      { type: LINUX_TYPE_GUID, guid: '11111111-2222-4333-8444-555555555555', firstLba: 2048, lastLba: 12254 },
    ]);
    const diskBytes = 256 * MiB;
    const { disk, head } = await diskWithBody('gpt.img', image, diskBytes);
    const newHead = await writeConfigDrive({ disk, diskBytes, head }, contents);
    expect(newHead.length).toBe(head.length);
    await withHead(disk, newHead);

    const table = JSON.parse((await run('sfdisk', ['--json', disk])).stdout).partitiontable;
    expect(table.label).toBe('gpt');
    expect(table.lastlba).toBe(diskBytes / 512 - 34);
    expect(table.partitions).toHaveLength(2);
    const drive = table.partitions[1];
    expect(drive).toMatchObject({ name: 'config-2', size: CONFIG_DRIVE_BYTES / 512 });
    expect(drive.start % 2048).toBe(0);
    expect(drive.start + drive.size - 1).toBeLessThanOrEqual(table.lastlba);
    // Both headers and both entry arrays agree, with their CRCs: sfdisk finds nothing to say.
    const verified = await run('sfdisk', ['--verify', disk]);
    expect(verified.stdout + verified.stderr).not.toMatch(/corrupt|invalid|mismatch|wrong/i);
    // The image's own backup header, at its end, is gone.
    const old = Buffer.alloc(512);
    const handle = await open(disk, 'r');
    await handle.read(old, 0, 512, image.length - 512);
    await handle.close();
    expect(old.every((byte) => byte === 0)).toBe(true);

    const offset = drive.start * 512;
    const partition = path.join(dir, 'gpt-partition.img');
    await writeFile(partition, (await readFile(disk)).subarray(offset, offset + CONFIG_DRIVE_BYTES));
    const probed = (await run('blkid', ['-p', '-o', 'export', partition])).stdout;
    expect(probed).toContain('LABEL=config-2\n');
    expect(probed).toContain('TYPE=vfat\n');
    await run('fsck.fat', ['-n', partition]);

    const { image: at, env } = mtools(disk, offset);
    const listed = (await run('mdir', ['-i', at, '-b', '::/openstack/latest'], { env })).stdout;
    expect(listed.split('\n').filter(Boolean).sort()).toEqual(
      ['meta_data.json', 'network_data.json', 'user_data', 'vendor_data.json'].map(
        (name) => `::/openstack/latest/${name}`,
      ),
    );
    const read = async (name: string) =>
      (await run('mtype', ['-i', at, `::/openstack/latest/${name}`], { env, encoding: 'buffer' })).stdout;
    expect(JSON.parse((await read('meta_data.json')).toString())).toMatchObject({
      uuid: MACHINE,
      hostname: 'rack1-node7',
      public_keys: { 'key-0': KEY },
    });
    expect((await read('user_data')).toString()).toBe('#cloud-config\npackages: [htop]\n');
    expect(JSON.parse((await read('network_data.json')).toString())).toEqual({
      links: [
        { id: 'eno1', type: 'phy', ethernet_mac_address: '0c:c4:7a:00:00:01' },
        { id: 'eno2', type: 'phy', ethernet_mac_address: '0c:c4:7a:00:00:02' },
        {
          id: 'bond0',
          type: 'bond',
          bond_links: ['eno1', 'eno2'],
          bond_mode: '802.3ad',
          ethernet_mac_address: '0c:c4:7a:00:00:01',
        },
        { id: 'bond0.20', type: 'vlan', vlan_link: 'bond0', vlan_id: 20, vlan_mac_address: '0c:c4:7a:00:00:01' },
      ],
      networks: [
        {
          id: 'network0',
          type: 'ipv4',
          link: 'bond0.20',
          ip_address: '192.0.2.10',
          netmask: '255.255.255.0',
          routes: [{ network: '0.0.0.0', netmask: '0.0.0.0', gateway: '192.0.2.1' }],
        },
        {
          id: 'network1',
          type: 'ipv6',
          link: 'bond0.20',
          ip_address: '2001:db8::10',
          netmask: 'ffff:ffff:ffff:ffff::',
          routes: [],
        },
      ],
      services: [{ type: 'dns', address: '192.0.2.53' }],
    });
    const vendor = JSON.parse((await read('vendor_data.json')).toString());
    expect(vendor['cloud-init']).toBe(
      `#cloud-config\n${JSON.stringify({ phone_home: { url: contents.phoneHome?.url, post: 'all', tries: 10 } })}\n`,
    );
  });

  test('adds a primary partition at an MBR disk’s end, DHCP on each NIC when no network is given', async () => {
    const image = Buffer.alloc(4 * MiB, 0x5a);
    image.fill(0, 0, 512);
    image[446 + 4] = 0x83;
    image.writeUInt32LE(2048, 446 + 8);
    image.writeUInt32LE(4 * 2048 - 2048, 446 + 12);
    image.writeUInt16LE(0xaa55, 510);
    const diskBytes = 128 * MiB;
    const { disk, head } = await diskWithBody('mbr.img', image, diskBytes);
    const dhcp = {
      ...contents,
      userData: undefined,
      phoneHome: undefined,
      networkData: networkData(undefined, ['52:54:00:12:34:56']),
    };
    await withHead(disk, await writeConfigDrive({ disk, diskBytes, head }, dhcp));

    const table = JSON.parse((await run('sfdisk', ['--json', disk])).stdout).partitiontable;
    expect(table.label).toBe('dos');
    expect(table.partitions[1]).toMatchObject({ size: CONFIG_DRIVE_BYTES / 512, type: 'e' });
    expect(table.partitions[1].start + table.partitions[1].size).toBe(diskBytes / 512);
    const { image: at, env } = mtools(disk, table.partitions[1].start * 512);
    const listed = (await run('mdir', ['-i', at, '-b', '::/openstack/latest'], { env })).stdout;
    expect(listed).not.toContain('user_data');
    expect(listed).not.toContain('vendor_data.json');
    const network = (await run('mtype', ['-i', at, '::/openstack/latest/network_data.json'], { env })).stdout;
    expect(JSON.parse(network)).toEqual({
      links: [{ id: 'nic0', type: 'phy', ethernet_mac_address: '52:54:00:12:34:56' }],
      networks: [{ id: 'network0', type: 'ipv4_dhcp', link: 'nic0' }],
      services: [],
    });
  });

  test('on a disk of 4096-byte blocks, in those blocks: the GPT as fdisk reads it, a FAT of 4096-byte sectors', async () => {
    const image = gptDiskImage(
      8 * MiB,
      [{ type: LINUX_TYPE_GUID, guid: '11111111-2222-4333-8444-555555555555', firstLba: 256, lastLba: 1791 }],
      0x5a,
      4096,
    );
    const diskBytes = 128 * MiB;
    const { disk, head } = await diskWithBody('4kn.img', image, diskBytes);
    await withHead(disk, await writeConfigDrive({ disk, diskBytes, blockSize: 4096, head }, contents));
    // sfdisk takes the sector size from the device alone; fdisk is told it.
    const listed = await run('fdisk', ['-b', '4096', '-l', '-o', 'Start,Sectors,Name', disk]);
    expect(listed.stderr).toBe('');
    expect(listed.stdout).toContain('Disklabel type: gpt');
    const rows = listed.stdout
      .split('\n')
      .map((line) => /^\s*(\d+)\s+(\d+)\s+(\S+)\s*$/.exec(line))
      .flatMap((m) => (m ? [{ start: Number(m[1]), size: Number(m[2]), name: m[3] }] : []));
    expect(rows).toEqual([
      { start: 256, size: 1536, name: 'part' },
      { start: diskBytes / 4096 - 256 - CONFIG_DRIVE_BYTES / 4096, size: CONFIG_DRIVE_BYTES / 4096, name: 'config-2' },
    ]);
    const offset = (rows[1]?.start ?? 0) * 4096;
    const partition = path.join(dir, '4kn-partition.img');
    await writeFile(partition, (await readFile(disk)).subarray(offset, offset + CONFIG_DRIVE_BYTES));
    expect((await run('blkid', ['-p', '-o', 'export', partition])).stdout).toContain('LABEL=config-2\n');
    const { image: at, env } = mtools(disk, offset);
    const meta = (await run('mtype', ['-i', at, '::/openstack/latest/meta_data.json'], { env })).stdout;
    expect(JSON.parse(meta)).toMatchObject({ uuid: MACHINE, hostname: 'rack1-node7' });
  });

  test('refuses a disk with no room after the image, naming the disk, and writes nothing', async () => {
    const image = gptDiskImage(6 * MiB, [
      { type: LINUX_TYPE_GUID, guid: '11111111-2222-4333-8444-555555555555', firstLba: 2048, lastLba: 12254 },
    ]);
    const diskBytes = 64 * MiB;
    const { disk, head } = await diskWithBody('small.img', image, diskBytes);
    const before = await readFile(disk);
    const refusal = writeConfigDrive({ disk, diskBytes, head }, contents);
    await expect(refusal).rejects.toThrow(ConfigDriveError);
    await expect(refusal).rejects.toThrow(`${disk}: no 64 MiB free after the image`);
    expect((await readFile(disk)).equals(before)).toBe(true);
  });
});
