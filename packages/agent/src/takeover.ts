import { createPublicKey, generateKeyPairSync, type KeyObject } from 'node:crypto';
import { type TakeoverInit, TakeoverInitSchema, TakeoverResponseSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';

/**
 * Said in a TakeoverSuccess when the agent runs in place, on the OS the
 * machine was provisioned with, rather than in the agent image upstream's
 * takeover kexecs into: `takeover` without an image, or where kexec cannot
 * run (the CLI says why before it).
 */
export const IN_PLACE_WARNING =
  'the agent runs in place on the provisioned OS, not in the agent image: no kexec, and the running network configuration is kept as it is';

/** The outcome of a takeover: what to write to standard output, and, on success, what the agent runs with. */
export type Takeover =
  | { readonly ok: true; readonly response: Uint8Array; readonly init: TakeoverInit; readonly privateKey: KeyObject }
  | { readonly ok: false; readonly response: Uint8Array; readonly message: string };

/**
 * Answers the shepherd's TakeoverInit (its standard input): a
 * TakeoverSuccess (with {@link IN_PLACE_WARNING}) echoing the init and carrying the raw public half of a new
 * ed25519 key, or a TakeoverError saying why the init is unusable (not a
 * TakeoverInit, no machine_id, no bmaas_endpoint). The shepherd's initializer
 * checks the echo and the key's length (parseTakeoverResponse).
 */
export function takeover(stdin: Uint8Array): Takeover {
  let init: TakeoverInit;
  try {
    init = fromBinary(TakeoverInitSchema, stdin);
  } catch (error) {
    return refused(`standard input (${stdin.length} bytes) is not a TakeoverInit: ${(error as Error).message}`);
  }
  if (init.machineId === '') return refused('TakeoverInit has no machine_id');
  if (init.bmaasEndpoint === '') return refused(`TakeoverInit of machine ${init.machineId} has no bmaas_endpoint`);
  const { privateKey } = generateKeyPairSync('ed25519');
  return { ok: true, response: takeoverResponse(init, privateKey, [IN_PLACE_WARNING]), init, privateKey };
}

/**
 * A TakeoverSuccess echoing `init`, with the raw public half of
 * `privateKey` and `warnings`: what the CLI answers once it knows whether
 * the machine boots the agent image or runs the agent in place.
 */
export function takeoverResponse(init: TakeoverInit, privateKey: KeyObject, warnings: readonly string[]): Uint8Array {
  const key = Buffer.from(createPublicKey(privateKey).export({ format: 'jwk' }).x ?? '', 'base64url');
  return toBinary(
    TakeoverResponseSchema,
    create(TakeoverResponseSchema, {
      result: { case: 'success', value: { initMessage: init, key, warning: [...warnings] } },
    }),
  );
}

function refused(message: string): Takeover {
  const response = toBinary(
    TakeoverResponseSchema,
    create(TakeoverResponseSchema, { result: { case: 'error', value: { message } } }),
  );
  return { ok: false, response, message };
}
