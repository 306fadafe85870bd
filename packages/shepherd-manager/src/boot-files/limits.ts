// What the clients of the boot files server (BMCs, iPXE, whoever else reaches its port) may hold of it.
import type { Server } from 'node:http';
import { log } from '../internal.js';

/**
 * What the boot files server's clients may hold of it. Every connection
 * holds a socket, and one downloading a file holds that file open too.
 * Durations in milliseconds.
 */
export interface AgentBootFilesLimits {
  /**
   * Connections open at once; past it a new connection is closed as it is
   * accepted (the BMC or iPXE tries again). Default 1024.
   */
  readonly connections: number;
  /**
   * How long a connection may go without a byte read or written before it
   * is closed: a download whose client stopped reading is cut off then, and
   * its file closed. Default 60 s.
   */
  readonly idleTimeout: number;
}

/**
 * The defaults: a BMC fetches an ISO over one to a few connections, iPXE a
 * kernel and two initramfs over one; the agent booter boots 10 machines at
 * once by default. A BMC on a slow link still moves a byte a minute.
 */
const DEFAULT_AGENT_BOOT_FILES_LIMITS: AgentBootFilesLimits = {
  connections: 1024,
  idleTimeout: 60_000,
};

/** Timers wait at most 2^31-1 ms (about 24.8 days). */
const LONGEST_TIMER_MS = 2 ** 31 - 1;

/**
 * `given` over the defaults, each a whole number above zero (`idleTimeout`
 * at most 2^31-1 ms); a bad one is a `RangeError` naming it and its value.
 */
export function agentBootFilesLimits(given: Partial<AgentBootFilesLimits> = {}): AgentBootFilesLimits {
  const limits = { ...DEFAULT_AGENT_BOOT_FILES_LIMITS, ...given };
  for (const [name, value] of Object.entries(limits) as [keyof AgentBootFilesLimits, number][]) {
    if (!Number.isSafeInteger(value) || value < 1) {
      throw new RangeError(`agent boot files limits: ${name} must be a whole number above zero, got ${value}`);
    }
  }
  if (limits.idleTimeout > LONGEST_TIMER_MS) {
    throw new RangeError(
      `agent boot files limits: idleTimeout must be at most ${LONGEST_TIMER_MS} ms, got ${limits.idleTimeout}`,
    );
  }
  return limits;
}

/**
 * Holds `server`'s connections to `limits`. The idle timeout is node:http's
 * own socket timeout: with no `timeout` listener on the server, request or
 * response, node:http destroys the socket, and the download's file stream
 * (piped into the response) is destroyed with it, closing the file. The
 * connections past the cap are dropped by node:net before node:http sees
 * them; the first of a run of them is logged, once.
 */
export function holdConnections(server: Server, limits: AgentBootFilesLimits): void {
  server.setTimeout(limits.idleTimeout);
  server.maxConnections = limits.connections;
  let refusing = false;
  server.on('drop', () => {
    if (refusing) return;
    refusing = true;
    log.bootFiles(
      'at %d open connections (the agent boot files connections limit): refusing new ones until some close',
      limits.connections,
    );
  });
  server.on('connection', () => {
    refusing = false;
  });
}
