import { openSync, writeSync } from 'node:fs';
import type { AgentStartEvent } from '@bmaas/provider-dummy';
import { UsageError } from '../settings.js';

/**
 * `--dummy-agent-start-log`: one JSON line per fake agent start event,
 * appended (O_APPEND, one write each) so several shepherds can share a file,
 * and written synchronously so a line is on record before anything else
 * happens, even if the process is killed right after.
 */
export function agentStartRecorder(file: string): (event: AgentStartEvent) => void {
  let fd: number;
  try {
    // Kept open for the process's life; the kernel closes it at exit.
    fd = openSync(file, 'a');
  } catch (error) {
    const reason = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
    throw new UsageError('dummy-agent-start-log', `cannot open ${JSON.stringify(file)} for appending (${reason})`);
  }
  return (event) => {
    const line = JSON.stringify({
      phase: event.phase,
      machine: event.machineId ?? null,
      address: event.address,
      ...(event.outcome === undefined ? {} : { outcome: event.outcome }),
      pid: process.pid,
      at: event.at.toISOString(),
    });
    writeSync(fd, `${line}\n`);
  };
}
