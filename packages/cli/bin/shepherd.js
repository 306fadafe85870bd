#!/usr/bin/env node
// The shepherd command. Runs the compiled CLI (`npm ci` builds it in a checkout).

// Read before anything loads the `debug` package, which deletes an empty DEBUG (here: no logs).
const debug = process.env.DEBUG;
const { main } = await import('../dist/main.js');

process.exitCode = await main(process.argv.slice(2), { debug });
// Everything is closed by now; should a stray handle keep the process alive, do not hang.
setTimeout(() => process.exit(), 5_000).unref();
