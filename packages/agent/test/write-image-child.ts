/**
 * A process writing one image, for the test that kills it mid-write:
 * `node write-image-child.cjs <url> <sha256> <disk>` (bundled by the test
 * with esbuild).
 */
import { writeDiskImage } from '../src/install/write-image.js';

const [url, sha256, disk] = process.argv.slice(2) as [string, string, string];
writeDiskImage({ url, sha256, compression: 'none' }, disk).then(
  () => process.stdout.write('written\n'),
  (error: unknown) => {
    process.stderr.write(`${(error as Error).message}\n`);
    process.exitCode = 1;
  },
);
