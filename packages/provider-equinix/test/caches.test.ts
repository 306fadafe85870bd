import { describe, expect, it, vi } from 'vitest';
import type { EquinixHardwareReservation } from '../src/index.js';
import { PenaltyBox } from '../src/provider/penalty-box.js';
import { ReservationCache } from '../src/provider/reservation-cache.js';

function reservation(id: string): EquinixHardwareReservation {
  return { id, provisionable: true, device: null, plan: { slug: 'm3.large.x86' } };
}

describe('PenaltyBox', () => {
  it('penalises for its duration from the moment of the failure', () => {
    let now = 1_000;
    const box = new PenaltyBox(3_600_000, () => now);
    expect(box.add('r1')).toBe(3_601_000);
    now += 3_599_999;
    expect(box.isPenalised('r1')).toBe(true);
    expect(box.isPenalised('r2')).toBe(false);
    now += 1;
    expect(box.isPenalised('r1')).toBe(false);
    now += 10;
    expect(box.add('r1')).toBe(now + 3_600_000);
    expect(box.until('r1')).toBe(now + 3_600_000);
  });
});

describe('ReservationCache', () => {
  it('lists once per period, shares a listing, and lists again after invalidation', async () => {
    let now = 0;
    const load = vi.fn(async () => [reservation(`r${load.mock.calls.length}`)]);
    const cache = new ReservationCache(load, 900_000, () => now);

    const [a, b] = await Promise.all([cache.get(), cache.get()]);
    expect(a).toBe(b);
    expect(load).toHaveBeenCalledTimes(1);
    now = 899_999;
    await cache.get();
    expect(load).toHaveBeenCalledTimes(1);
    now = 900_000;
    await cache.get();
    expect(load).toHaveBeenCalledTimes(2);
    cache.invalidate();
    await cache.get();
    expect(load).toHaveBeenCalledTimes(3);
  });

  it('does not keep a listing that was under way when invalidated', async () => {
    let release: (value: EquinixHardwareReservation[]) => void = () => {};
    const load = vi
      .fn<() => Promise<EquinixHardwareReservation[]>>()
      .mockImplementationOnce(() => new Promise((resolve) => (release = resolve)))
      .mockResolvedValue([reservation('fresh')]);
    const cache = new ReservationCache(load, 900_000);

    const stale = cache.get();
    cache.invalidate();
    release([reservation('stale')]);
    expect((await stale)[0]?.id).toBe('stale');
    expect((await cache.get())[0]?.id).toBe('fresh');
    expect((await cache.get())[0]?.id).toBe('fresh');
    expect(load).toHaveBeenCalledTimes(2);
  });

  it('remembers the latest listing for lookups across invalidations', async () => {
    const load = vi.fn(async () => [reservation('r1')]);
    const cache = new ReservationCache(load, 900_000);
    expect(cache.lastKnown('r1')).toBeUndefined();
    await cache.get();
    cache.invalidate();
    expect(cache.lastKnown('r1')?.plan.slug).toBe('m3.large.x86');
    expect(load).toHaveBeenCalledTimes(1);
  });

  it('forgets a failed listing', async () => {
    const load = vi
      .fn<() => Promise<EquinixHardwareReservation[]>>()
      .mockRejectedValueOnce(new Error('API down'))
      .mockResolvedValue([reservation('r')]);
    const cache = new ReservationCache(load, 900_000);
    await expect(cache.get()).rejects.toThrow('API down');
    await expect(cache.get()).resolves.toHaveLength(1);
  });
});
