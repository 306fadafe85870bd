import { MachineNotFoundError, NotImplementedError } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EquinixPower } from '../src/index.js';
import { powerStateForState } from '../src/provider/device-facts.js';
import { FakeEquinixApi } from '../src/testing/index.js';
import { fastClient } from './helpers.js';

let api: FakeEquinixApi;
let power: EquinixPower;

beforeAll(async () => {
  api = await FakeEquinixApi.start();
  power = new EquinixPower(fastClient(api));
});
afterAll(() => api.close());

describe('EquinixPower', () => {
  it('reads the device state, and powers off, on and cycles through device actions', async () => {
    const device = api.addDevice({ hostname: 'power-me' });
    expect(power.type).toBe('Equinix');
    expect(await power.readPowerState(device.id)).toBe('On');
    expect(await power.powerOff(device.id, { graceful: false })).toEqual({ command: 'power_off' });
    expect(await power.readPowerState(device.id)).toBe('Off');
    expect(await power.powerOn(device.id)).toEqual({ command: 'power_on' });
    expect(await power.readPowerState(device.id)).toBe('On');
    expect(await power.powerCycle(device.id)).toEqual({ command: 'reboot' });
    expect(api.actions(device.id)).toEqual(['power_off', 'power_on', 'reboot']);
    expect(api.requestsTo('POST /devices/{id}/actions').map((r) => r.body)).toEqual([
      { type: 'power_off' },
      { type: 'power_on' },
      { type: 'reboot' },
    ]);
  });

  it('says by name that it cannot power off gracefully, and asks the API nothing', async () => {
    const device = api.addDevice({ hostname: 'no-graceful' });
    const before = api.requestsTo('POST /devices/{id}/actions').length;
    const error = await power.powerOff(device.id, { graceful: true }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(NotImplementedError);
    expect((error as Error).message).toBe(
      'provider Equinix does not implement a graceful power off (the API has power_off only)',
    );
    expect(api.requestsTo('POST /devices/{id}/actions')).toHaveLength(before);
  });

  it('names a device the API does not know', async () => {
    const missing = '00000000-0000-0000-0000-000000000000';
    for (const call of [
      () => power.readPowerState(missing),
      () => power.powerOn(missing),
      () => power.powerOff(missing, { graceful: false }),
      () => power.powerCycle(missing),
    ]) {
      const error = await call().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(MachineNotFoundError);
      expect((error as Error).message).toBe(`provider Equinix has no machine ${missing}`);
    }
  });

  it('maps device states to power states', () => {
    expect(
      ['active', 'inactive', 'powering_on', 'powering_off', 'provisioning', 'failed', 'new'].map(powerStateForState),
    ).toEqual(['On', 'Off', 'PoweringOn', 'PoweringOff', 'Unknown', 'Unknown', 'Unknown']);
  });
});
