import type { IncomingMessage, ServerResponse } from 'node:http';
import { constants, type Http2ServerRequest, type Http2ServerResponse } from 'node:http2';
import { type BMDB, BMDBError } from '@bmaas/bmdb-controlloop';
import { recordFirstBoot } from '@bmaas/bmdb-model';
import { isUuid } from '@bmaas/common';
import { type Overrun, overrunMessage, type RequestBudget } from './limits.js';
import { log } from './log.js';
import type { ServerMetrics } from './metrics.js';

type Request = IncomingMessage | Http2ServerRequest;
type Response = ServerResponse | Http2ServerResponse;

/**
 * Where an installed OS reports its first boot: `POST /phone-home/<machine
 * ID>/<secret>`, the URL its agent wrote into its config drive's vendor
 * data for cloud-init's `phone_home`. The secret is in the path because
 * cloud-init posts only its own form fields.
 */
export const PHONE_HOME_PATH = '/phone-home/';

/**
 * cloud-init's form fields holding the SSH host keys (`N/A` for a key type
 * the OS has none of). Not `pub_key_dsa`: cloud-init 22.4 (Debian 12's)
 * still makes an ssh-dss host key and posts it, but sshd has offered none
 * since OpenSSH 7.0 and the BMDB takes no ssh-dss key, so read, it had the
 * whole report refused and a stock Debian 12 never read booted.
 */
const HOST_KEY_FIELDS = ['pub_key_ed25519', 'pub_key_ecdsa', 'pub_key_rsa'];
/** cloud-init's form is a few kilobytes (the keys, the hostname): more is not a phone home. */
const MAX_BODY_BYTES = 64 * 1024;

/** Whether a request is for the phone-home endpoint (it needs no client certificate). */
export function isPhoneHome(request: Request): boolean {
  return request.url?.startsWith(PHONE_HOME_PATH) === true;
}

/**
 * Answers an installed OS's first boot report: the machine's succeeded
 * installation must hold the sha256 of the secret in the path (see
 * `recordFirstBoot`). `200` once recorded, and for the same report again;
 * `403` for a secret no succeeded installation of the machine holds
 * (nothing written); `400` naming what is malformed; `405` for anything but
 * POST. The secret (and so the path) is never logged. Its body is held to
 * `budget` as the agents' requests are: cut off (its HTTP/2 stream reset,
 * its HTTP/1.1 connection closed) past a share of the bytes buffered or when
 * not answered within `requestTimeout`.
 */
export function phoneHomeHandler(
  bmdb: BMDB,
  metrics: ServerMetrics | undefined,
  budget: RequestBudget,
): (request: Request, response: Response) => void {
  const answer = (response: Response, status: number, code: string, text: string) => {
    // Cut off meanwhile: nothing to answer on.
    const gone = 'stream' in response ? response.stream.destroyed : response.socket?.destroyed !== false;
    if (gone || response.writableEnded) return;
    metrics?.requests.inc({ method: 'PhoneHome', code });
    response.writeHead(status, {
      'content-type': 'text/plain; charset=utf-8',
      'content-length': Buffer.byteLength(`${text}\n`),
      // HTTP/1.1 cannot leave the rest of a body unread on a connection that goes on.
      ...(status === 413 && !('stream' in response) && { connection: 'close' }),
    });
    response.end(`${text}\n`);
  };
  return (request, response) => {
    const [machineId = '', secret = '', ...rest] = (request.url ?? '').slice(PHONE_HOME_PATH.length).split('/');
    if (request.method !== 'POST') {
      response.setHeader('allow', 'POST');
      answer(response, 405, 'unimplemented', `${request.method} is not how a first boot is reported: POST`);
      return;
    }
    if (rest.length > 0 || machineId === '' || secret === '') {
      answer(response, 404, 'not_found', 'want /phone-home/<machine ID>/<secret>');
      return;
    }
    // Logged only as a machine ID: a path's parts in the wrong order must not put a secret in a log.
    const logged = isUuid(machineId) ? machineId : '(not a machine ID)';
    const connection = 'stream' in request ? request.stream.session : request.socket;
    const held = budget.hold(connection ?? request);
    let whole = false;
    const cutOff = (overrun: Overrun) => {
      log.server(
        'cut off a first boot report of machine %s: %s',
        logged,
        overrunMessage(overrun, budget.limits, whole),
      );
      held.release();
      if ('stream' in request) request.stream.close(constants.NGHTTP2_ENHANCE_YOUR_CALM);
      else request.socket.destroy();
    };
    const overtime = setTimeout(() => cutOff(budget.overrun('requestTimeout')), budget.limits.requestTimeout);
    overtime.unref();
    response.once('close', () => {
      clearTimeout(overtime);
      held.release();
    });
    readBody(request, (bytes) => {
      const overrun = held.take(bytes);
      if (overrun !== undefined) cutOff(overrun);
      return overrun === undefined;
    })
      .then(async (body) => {
        whole = true;
        if (body === null) return;
        if (body === undefined) {
          answer(response, 413, 'resource_exhausted', `the report is larger than ${MAX_BODY_BYTES} bytes`);
          return;
        }
        const form = new URLSearchParams(body);
        const hostKeys = HOST_KEY_FIELDS.map((field) => form.get(field)?.trim() ?? '').filter(
          (key) => key !== '' && key !== 'N/A',
        );
        const outcome = await recordFirstBoot(bmdb.db, machineId, { secret, hostKeys });
        if (outcome.result === 'refused') {
          log.firstBoot(
            'refused a first boot report of machine %s: no succeeded installation holds its secret',
            machineId,
          );
          answer(response, 403, 'permission_denied', `machine ${machineId}: no installation of it holds that secret`);
          return;
        }
        if (outcome.result === 'booted') {
          log.firstBoot('machine %s reported its first boot with %d SSH host keys', machineId, outcome.hostKeys.length);
        }
        answer(response, 200, 'ok', `machine ${machineId} booted at ${outcome.bootedAt.toISOString()}`);
      })
      .catch((error: unknown) => {
        if (error instanceof BMDBError) {
          // Its message names the machine and the bad field, never the secret's value.
          answer(response, 400, 'invalid_argument', error.message);
          return;
        }
        log.server('could not record a first boot of machine %s: %s', logged, (error as Error).message);
        answer(response, 503, 'unavailable', `could not record the first boot of machine ${machineId}`);
      });
  };
}

/**
 * The body as text; undefined when it is longer than {@link MAX_BODY_BYTES}
 * (the rest left unread), null when `take` refused a chunk (the request cut off).
 */
function readBody(request: Request, take: (bytes: number) => boolean): Promise<string | undefined | null> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let bytes = 0;
    const stop = (value: undefined | null) => {
      request.removeAllListeners('data');
      request.pause();
      resolve(value);
    };
    request.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > MAX_BODY_BYTES) return stop(undefined);
      if (!take(chunk.length)) return stop(null);
      chunks.push(chunk);
    });
    request.once('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    request.once('error', reject);
  });
}
