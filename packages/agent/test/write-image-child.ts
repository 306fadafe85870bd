/**
 * A process writing one image, for the test that kills it mid-write:
 * `node write-image-child.cjs <url> <sha256> <disk>` (bundled by the test
 * with esbuild). It says "started" on standard output before the download.
 */
import { writeDiskImage } from '../src/install/write-image.js';

const [url, sha256, disk] = process.argv.slice(2) as [string, string, string];
process.stdout.write('started\n');
writeDiskImage({ url, sha256, compression: 'none' }, disk).then(
  () => process.stdout.write('written\n'),
  (error: unknown) => {
    process.stderr.write(`${(error as Error).message}\n`);
    process.exitCode = 1;
  },
);
