#!/usr/bin/env node
// The shepherd command. Runs the compiled CLI: `npm run build` first when working from a checkout.
import { main } from '../dist/main.js';

process.exitCode = await main(process.argv.slice(2));
// Everything is closed by now; should a stray handle keep the process alive, do not hang.
setTimeout(() => process.exit(), 5_000).unref();
