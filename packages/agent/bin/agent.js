#!/usr/bin/env node
// The BMaaS agent's command line (src/cli.ts). `npm run bundle -w @bmaas/agent` bundles it
// into one file that plain `node` runs, dist/agent.cjs: no top-level await, for CommonJS.
import { main } from '../dist/cli.js';

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
