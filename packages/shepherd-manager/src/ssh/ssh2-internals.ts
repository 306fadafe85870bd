/** What ssh2 does not offer through its API, reached through its internals (checked before use). */
import { describeError } from '@bmaas/common';
import type { ClientChannel } from 'ssh2';
import { log } from './log.js';

export /**
 * Asks the server to SIGKILL the command's process group. OpenSSH (≥ 7.9)
 * does so for users other than root only: root sessions run without privilege
 * separation, which it requires for signals. ssh2's `Channel.signal()`
 * refuses once our side sent EOF, as it did with every command's stdin,
 * though the protocol allows the request then; so the request goes to ssh2's
 * protocol layer, if that still looks as expected.
 */
function sendKillSignal(channel: ClientChannel): void {
  const internals = channel as unknown as {
    _client?: { _protocol?: { signal?: unknown } };
    outgoing?: { id?: unknown; state?: unknown };
  };
  const protocol = internals._client?._protocol;
  const id = internals.outgoing?.id;
  const state = internals.outgoing?.state;
  if (typeof protocol?.signal !== 'function' || typeof id !== 'number' || (state !== 'open' && state !== 'eof')) {
    log('cannot send a KILL signal request: unexpected ssh2 channel internals');
    return;
  }
  try {
    protocol.signal(id, 'KILL');
  } catch (error) {
    log('cannot send a KILL signal request: %s', describeError(error));
  }
}
