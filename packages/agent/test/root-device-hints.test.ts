import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { checkRootDeviceHints, RootDeviceHintError as RequestHintError } from '@bmaas/bmdb-model';
import { beforeAll, describe, expect, test } from 'vitest';
import { type DiskRecord, readDisks } from '../src/hardware/disks.js';
import {
  chooseRootDevice,
  noHints,
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

/**
 * The library checks the hints an installation request stores; the agent
 * parses what it is handed. The agent depends on no workspace package, so
 * the two are written twice: the same table through both keeps them in step.
 */
describe('the agent and the library take and refuse the same hints', () => {
  const cases: readonly unknown[] = [
    { serialNumber: 'S3Z1NX0K' },
    { serialNumber: ' S3Z1NX0K ', minSizeGigabytes: 100 },
    { deviceName: '/dev/disk/by-path/pci-0000:00:1f.2-ata-1' },
    { deviceName: '/dev/sda', model: 'ST2000NM0135', vendor: 'SEAGATE' },
    { wwn: '0x5002538e40a1b2c3' },
    { wwn: '5002538E40A1B2C3', rotational: false },
    { rotational: true },
    {},
    { serial: 'S3Z1NX0K' },
    { model: '  ' },
    { vendor: '' },
    { minSizeGigabytes: 0 },
    { minSizeGigabytes: -1 },
    { minSizeGigabytes: 1.5 },
    { minSizeGigabytes: '100' },
    { minSizeGigabytes: '100GB' },
    { minSizeGigabytes: null },
    { wwn: 'naa.5000' },
    { wwn: '0xZZ' },
    { deviceName: 'sda' },
    { rotational: 'yes' },
    { serialNumber: 42 },
    ['/dev/sda'],
    null,
    'serialNumber=S3Z1NX0K',
  ];
  /** The hints as taken, or the field refused; no hint at all is refused by both (the agent: noHints). */
  const agent = (hints: unknown) => {
    try {
      const parsed = parseRootDeviceHints(hints);
      return noHints(parsed) ? { refused: '(hints)' } : { taken: parsed };
    } catch (error) {
      if (!(error instanceof RootDeviceHintError)) throw error;
      return { refused: error.field };
    }
  };
  const library = (hints: unknown) => {
    try {
      return { taken: checkRootDeviceHints(hints, 'test') };
    } catch (error) {
      if (!(error instanceof RequestHintError)) throw error;
      return { refused: error.field };
    }
  };
  test.each(cases.map((hints) => [JSON.stringify(hints), hints]))('%s', (_name, hints) => {
    expect(library(hints)).toEqual(agent(hints));
  });

  test('the table has both outcomes', () => {
    const outcomes = cases.map((hints) => ('taken' in library(hints) ? 'taken' : 'refused'));
    expect(outcomes.filter((o) => o === 'taken')).toHaveLength(7);
    expect(outcomes.filter((o) => o === 'refused')).toHaveLength(cases.length - 7);
  });
});
