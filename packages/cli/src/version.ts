import { readFileSync } from 'node:fs';

/** This package's version, for --version and session runtime info. */
export const VERSION: string = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
).version;
