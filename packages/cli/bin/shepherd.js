#!/usr/bin/env node
// The shepherd command. Runs the compiled CLI (`npm ci` builds it in a checkout).

// Read before anything loads the `debug` package, which deletes an empty DEBUG (here: no logs).
const debug = process.env.DEBUG;
const { main } = await import('../dist/main.js');

process.exitCode = await main(process.argv.slice(2), { debug });
// Everything is closed by now; a stray handle, or a file system call abandoned on a stop
// signal (see run), must not keep the process alive.
setTimeout(() => process.exit(), 1_000).unref();
