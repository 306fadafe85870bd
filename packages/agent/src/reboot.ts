import { spawn } from 'node:child_process';

/**
 * Runs the reboot command (`--reboot-command`, `reboot -f` in the image)
 * with `sh -c` and logs its exit code: resolved once it exited, which a
 * real reboot never lets happen. A command that cannot be started counts
 * as exit -1.
 */
export async function runRebootCommand(command: string, log: (line: string) => void): Promise<void> {
  const code = await new Promise<number | null>((resolve) => {
    const child = spawn('sh', ['-c', command], { stdio: 'ignore' });
    child.on('error', () => resolve(-1));
    child.on('close', resolve);
  });
  log(`reboot command exited ${code}`);
}
