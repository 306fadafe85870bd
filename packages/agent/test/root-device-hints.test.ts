import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, test } from 'vitest';
import { type DiskRecord, readDisks } from '../src/hardware/disks.js';
import {
  chooseRootDevice,
  parseRootDeviceHints,
  RootDeviceHintError,
  RootDeviceNotFoundError,
} from '../src/root-device-hints.js';

const server = fileURLToPath(new URL('./fixtures/two-socket-server/', import.meta.url));
let disks: DiskRecord[];
beforeAll(async () => {
  disks = await readDisks(path.resolve(server), []);
});

const chosen = (hints: unknown) => chooseRootDevice(disks, parseRootDeviceHints(hints)).path;

describe('choosing the root device by hints', () => {
  test('by path, by-path link, serial, WWN (with or without 0x, any case), model, vendor, size and rotation', () => {
    expect(chosen({ deviceName: '/dev/sdb' })).toBe('/dev/sdb');
    expect(chosen({ deviceName: '/dev/disk/by-path/pci-0000:3b:00.0-nvme-1' })).toBe('/dev/nvme0n1');
    expect(chosen({ serialNumber: 'BTYF01234567480BGN' })).toBe('/dev/sda');
    expect(chosen({ wwn: '0x5000c500a1b2c3d4' })).toBe('/dev/sdb');
    expect(chosen({ wwn: '0025385B71B0FA2E' })).toBe('/dev/nvme0n1');
    expect(chosen({ model: 'intel ssdsc2kb48' })).toBe('/dev/sda');
    expect(chosen({ vendor: 'Seagate' })).toBe('/dev/sdb');
    expect(chosen({ minSizeGigabytes: 1000 })).toBe('/dev/sdb');
    expect(chosen({ rotational: false, minSizeGigabytes: 500 })).toBe('/dev/nvme0n1');
  });

  test('every hint must match: a right serial on the wrong path matches nothing', () => {
    expect(() => chosen({ deviceName: '/dev/sda', serialNumber: 'ZC20ABCD0000C8123456' })).toThrow(
      RootDeviceNotFoundError,
    );
  });

  test('hints matching no disk are an error naming every disk seen', () => {
    let error: unknown;
    try {
      chosen({ serialNumber: 'NOSUCHSERIAL' });
    } catch (thrown) {
      error = thrown;
    }
    expect(error).toBeInstanceOf(RootDeviceNotFoundError);
    const message = (error as Error).message;
    expect(message).toMatch(/matched no disk/);
    for (const name of ['/dev/nvme0n1', '/dev/sda', '/dev/sdb', 'S437NA0M512345', '0x5000c500a1b2c3d4']) {
      expect(message).toContain(name);
    }
  });

  test('hints matching several disks are an error naming the matches', () => {
    let error: unknown;
    try {
      chosen({ rotational: false });
    } catch (thrown) {
      error = thrown;
    }
    expect(error).toBeInstanceOf(RootDeviceNotFoundError);
    expect((error as RootDeviceNotFoundError).matched).toEqual(['/dev/nvme0n1', '/dev/sda']);
    expect((error as Error).message).toMatch(/matched 2 disks \(\/dev\/nvme0n1, \/dev\/sda\)/);
  });
});

describe('checking hints', () => {
  const refusal = (hints: unknown) => {
    try {
      parseRootDeviceHints(hints);
    } catch (error) {
      if (error instanceof RootDeviceHintError) return [error.field, error.problem, error.message];
      throw error;
    }
    throw new Error(`${JSON.stringify(hints)} was accepted`);
  };

  test('an unknown field is named, with the fields there are', () => {
    expect(refusal({ serial: 'X' })).toEqual([
      'serial',
      'unknown-field',
      expect.stringMatching(/^root device hint serial: unknown; the hints are deviceName, model/),
    ]);
  });

  test('an empty value is named', () => {
    expect(refusal({ model: '  ' })).toEqual(['model', 'empty', expect.stringContaining('model: empty')]);
  });

  test('a size that is not a positive whole number of GiB is named', () => {
    for (const size of ['100GB', -1, 0, 1.5, null]) {
      expect(refusal({ minSizeGigabytes: size }).slice(0, 2)).toEqual(['minSizeGigabytes', 'not-a-size']);
    }
  });

  test('wrong types, a WWN that is not hex, a device name outside /dev are named', () => {
    expect(refusal({ rotational: 'yes' }).slice(0, 2)).toEqual(['rotational', 'not-a-boolean']);
    expect(refusal({ serialNumber: 42 }).slice(0, 2)).toEqual(['serialNumber', 'not-a-string']);
    expect(refusal({ wwn: 'naa.5000' }).slice(0, 2)).toEqual(['wwn', 'not-a-wwn']);
    expect(refusal({ deviceName: 'sda' }).slice(0, 2)).toEqual(['deviceName', 'not-a-device-path']);
    expect(refusal(['/dev/sda']).slice(0, 2)).toEqual(['(hints)', 'not-an-object']);
  });

  test('valid hints come back trimmed', () => {
    expect(parseRootDeviceHints({ model: ' ST2000NM0135 ', minSizeGigabytes: 100, rotational: true })).toEqual({
      model: 'ST2000NM0135',
      minSizeGigabytes: 100,
      rotational: true,
    });
  });
});
