import { mkdtemp } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Lab } from './lab.js';

const USAGE = `usage: npm run lab -- [--vms N] [--blank N] [--web-listen HOST:PORT] [--cache-dir DIR] [--dir DIR] [--keep]

Starts N QEMU virtual machines (default 3) booting Debian's kernel, a BMC for
each (ipmi_sim for odd-numbered VMs, the fake Redfish BMC for even ones), and
the shepherd around them: shepherd run static, shepherd server and the fleet
page. With --blank N the last N VMs have an empty disk and no OS: their BMC
boots the agent (virtual media for a Redfish one, iPXE for an IPMI one), and
the agent enrolls. Ctrl-C (or SIGINT, SIGTERM or SIGHUP to the lab's process) stops everything and
removes the lab's files (--keep leaves them).`;

/** `npm run lab`: exit code 0 after a clean stop, 2 for a bad flag, 1 when the lab cannot start. */
export async function main(argv: readonly string[]): Promise<number> {
  let values: {
    vms?: string;
    blank?: string;
    'web-listen'?: string;
    'cache-dir'?: string;
    dir?: string;
    keep?: boolean;
    help?: boolean;
  };
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: {
        vms: { type: 'string' },
        blank: { type: 'string' },
        'web-listen': { type: 'string' },
        'cache-dir': { type: 'string' },
        dir: { type: 'string' },
        keep: { type: 'boolean' },
        help: { type: 'boolean' },
      },
      strict: true,
    }));
  } catch (error) {
    process.stderr.write(`lab: ${(error as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const vms = Number(values.vms ?? '3');
  if (!Number.isSafeInteger(vms) || vms < 1 || vms > 20) {
    process.stderr.write(`lab: --vms must be a whole number from 1 to 20, got ${JSON.stringify(values.vms)}\n`);
    return 2;
  }
  const blank = Number(values.blank ?? '0');
  if (!Number.isSafeInteger(blank) || blank < 0 || blank > vms) {
    process.stderr.write(
      `lab: --blank must be a whole number from 0 to --vms (${vms}), got ${JSON.stringify(values.blank)}\n`,
    );
    return 2;
  }
  const webListen = values['web-listen'] ?? '127.0.0.1:8080';
  if (!/^[^\s:]+:\d{1,5}$/.test(webListen)) {
    process.stderr.write(`lab: --web-listen must be HOST:PORT, got ${JSON.stringify(webListen)}\n`);
    return 2;
  }
  const cacheDir = path.resolve(
    values['cache-dir'] ?? path.join(process.env.XDG_CACHE_HOME ?? path.join(homedir(), '.cache'), 'shepherd-lab'),
  );
  const dir = path.resolve(values.dir ?? (await mkdtemp(path.join(tmpdir(), 'shepherd-lab-'))));
  const stop = new AbortController();
  let repeated = false;
  // Under `npm run lab` one Ctrl-C arrives twice (the terminal's SIGINT, and npm's copy of it), so a
  // second signal cannot mean "exit at once"; exiting midway would leave the VMs, the BMDB and the
  // lab's directory behind. The stop is bounded instead: each process is killed after its grace.
  const onSignal = () => {
    if (stop.signal.aborted) {
      if (!repeated)
        process.stderr.write('lab: already stopping (each process is killed if it does not stop in time)\n');
      repeated = true;
      return;
    }
    process.stderr.write('lab: stopping (the shepherd, its server, the BMCs and the VMs)…\n');
    stop.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  // A closed terminal: the shepherd's processes run in groups of their own, so only the lab can stop them.
  process.on('SIGHUP', onSignal);
  // After a hangup the terminal is gone: a line written to it fails (EIO), and must not end the stop midway.
  for (const stream of [process.stdout, process.stderr]) stream.on('error', () => {});
  const say = (line: string) => process.stdout.write(`lab: ${line}\n`);
  let lab: Lab | undefined;
  try {
    say(`starting ${vms} VM(s) in ${dir}`);
    lab = await Lab.start({
      vms,
      dir,
      cacheDir,
      keep: values.keep ?? false,
      webListen,
      // The lab's BMCs alternate, IPMI first: a blank Redfish VM boots from virtual media, a blank IPMI one through iPXE.
      agentBoot: (index) => (index < vms - blank ? undefined : index % 2 === 0 ? 'network' : 'virtual-media'),
      shepherd: fileURLToPath(new URL('../../cli/bin/shepherd.js', import.meta.url)),
      report: say,
      signal: stop.signal,
    });
    if (!stop.signal.aborted) {
      process.stdout.write(`\n${lab.describe()}\n\nCtrl-C stops the lab.\n`);
      await new Promise<void>((resolve) => {
        stop.signal.addEventListener('abort', () => resolve(), { once: true });
        // A shepherd process that dies ends the lab: nothing would be watching the VMs.
        for (const process of [lab?.run, lab?.server]) process?.exited.then(() => resolve());
      });
      for (const process of [lab.run, lab.server]) {
        if (process && !process.running && !stop.signal.aborted) {
          say(`${process.name} exited; its log: ${process.logFile}\n${process.output.slice(-2000)}`);
        }
      }
    }
    return 0;
  } catch (error) {
    // Ctrl-C during the start is a clean stop, not a failure.
    if (stop.signal.aborted) return 0;
    process.stderr.write(`lab: ${error instanceof Error ? error.message : String(error)}\n`);
    return 1;
  } finally {
    await lab?.stop();
    say(values.keep ? `stopped; files kept in ${dir}` : 'stopped; files removed');
  }
}
