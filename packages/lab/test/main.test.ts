/** `npm run lab`'s flags: bad values exit 2 naming the flag, before anything starts. */
import { afterEach, expect, test, vi } from 'vitest';
import { main } from '../src/main.js';

afterEach(() => {
  vi.restoreAllMocks();
});

test('--blank beyond --vms, or no number, exits 2 naming the flag and the value', async () => {
  const written: string[] = [];
  vi.spyOn(process.stderr, 'write').mockImplementation((chunk) => {
    written.push(String(chunk));
    return true;
  });
  expect(await main(['--vms', '2', '--blank', '3'])).toBe(2);
  expect(await main(['--blank', 'two'])).toBe(2);
  expect(written).toEqual([
    'lab: --blank must be a whole number from 0 to --vms (2), got "3"\n',
    'lab: --blank must be a whole number from 0 to --vms (3), got "two"\n',
  ]);
});
