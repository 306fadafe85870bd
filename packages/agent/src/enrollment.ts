import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { type TakeoverInit, TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { AgentHardwareReportSchema } from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
import { EnrollRequestSchema } from '@bmaas/api/cloud/bmaas/server/api/enrollment_pb';
import { certificatePem, sleep } from '@bmaas/common';
import { create, fromBinary } from '@bufbuild/protobuf';
import { Code, ConnectError } from '@connectrpc/connect';
import { EnrollmentClient } from './callback/enrollment-client.js';
import { hardwareNode, readHardware } from './hardware/inventory.js';

/**
 * What a BMC-booted agent finds in `/etc/bmaas/enrollment.json`: the init
 * a takeover would have handed it (machine, server, its CA) and its
 * machine's one-time enrollment token.
 */
export interface Enrollment {
  readonly init: TakeoverInit;
  /** Never log it. */
  readonly token: string;
}

/** An enrollment file that is not one; names the file and what is wrong, never the token. */
export class EnrollmentFileError extends Error {
  override name = 'EnrollmentFileError';
}

/** The server refused the enrollment; the message is the server's (the machine and why). */
export class EnrollmentRefusedError extends Error {
  override name = 'EnrollmentRefusedError';
  constructor(
    readonly machineId: string,
    readonly code: Code,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Reads an enrollment file's JSON: `{ "init": base64 TakeoverInit, "token": string }`.
 *
 * @throws {@link EnrollmentFileError} naming `file` and the field at fault
 */
export function parseEnrollment(text: string, file: string): Enrollment {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new EnrollmentFileError(`enrollment file ${file} is not JSON: ${(error as Error).message}`);
  }
  const { init, token } = (typeof parsed === 'object' && parsed !== null ? parsed : {}) as Record<string, unknown>;
  if (typeof init !== 'string' || init === '') {
    throw new EnrollmentFileError(`enrollment file ${file}: "init" must be a base64 TakeoverInit`);
  }
  let takeoverInit: TakeoverInit;
  try {
    takeoverInit = fromBinary(TakeoverInitSchema, Buffer.from(init, 'base64'));
  } catch (error) {
    throw new EnrollmentFileError(`enrollment file ${file}: "init" is not a TakeoverInit: ${(error as Error).message}`);
  }
  if (takeoverInit.machineId === '')
    throw new EnrollmentFileError(`enrollment file ${file}: its init has no machine_id`);
  if (takeoverInit.bmaasEndpoint === '') {
    throw new EnrollmentFileError(
      `enrollment file ${file} of machine ${takeoverInit.machineId}: its init has no bmaas_endpoint`,
    );
  }
  if (typeof token !== 'string' || token === '') {
    throw new EnrollmentFileError(`enrollment file ${file} of machine ${takeoverInit.machineId}: "token" is missing`);
  }
  return { init: takeoverInit, token };
}

/** The codes a refusal comes with: asking again would be refused again. Any other is retried. */
const REFUSALS: ReadonlySet<Code> = new Set([
  Code.PermissionDenied,
  Code.Unauthenticated,
  Code.InvalidArgument,
  Code.FailedPrecondition,
  Code.Unimplemented,
]);

/**
 * Enrolls this machine's agent: makes its ed25519 key (as a takeover does),
 * reads its hardware report, and calls Enroll with the token until the
 * server answers, retrying with backoff (0.5 s doubling up to `maxDelayMs`)
 * while it cannot be reached or is unavailable. Resolves with the key the
 * server now knows as the machine's agent's, for `runAgent`.
 *
 * @throws {@link EnrollmentRefusedError} when the server refuses (a wrong, expired or used token: the
 *   machine and why, as the server said); nothing is retried then
 */
export async function enrollAgent(
  enrollment: Enrollment,
  options: {
    readonly root?: string | undefined;
    readonly maxDelayMs?: number | undefined;
    readonly signal?: AbortSignal | undefined;
    readonly log?: ((line: string) => void) | undefined;
  } = {},
): Promise<KeyObject> {
  const { init } = enrollment;
  const log = options.log ?? (() => {});
  const maxDelay = options.maxDelayMs ?? 30_000;
  const { privateKey } = generateKeyPairSync('ed25519');
  const inventory = await readHardware(options.root ?? '/');
  for (const warning of inventory.warnings) log(`hardware report: ${warning}`);
  const request = create(EnrollRequestSchema, {
    machineId: init.machineId,
    token: enrollment.token,
    hardwareReport: create(AgentHardwareReportSchema, {
      report: hardwareNode(inventory),
      warning: [...inventory.warnings],
    }),
  });
  const client = new EnrollmentClient({
    machineId: init.machineId,
    endpoint: init.bmaasEndpoint,
    privateKey,
    ca: init.caCertificate.length > 0 ? certificatePem(init.caCertificate) : undefined,
  });
  log(`enrolling at ${init.bmaasEndpoint}`);
  try {
    for (let failures = 0; ; failures++) {
      options.signal?.throwIfAborted();
      try {
        await client.enroll(request, options.signal);
        log('enrolled');
        return privateKey;
      } catch (error) {
        const refusal = ConnectError.from(error);
        if (REFUSALS.has(refusal.code)) {
          throw new EnrollmentRefusedError(init.machineId, refusal.code, refusal.rawMessage);
        }
        options.signal?.throwIfAborted();
        const delay = Math.min(maxDelay, 500 * 2 ** Math.min(failures, 16));
        log(`enrollment failed (${refusal.rawMessage}); again in ${delay} ms`);
        await sleep(delay, options.signal);
      }
    }
  } finally {
    client.close();
  }
}
