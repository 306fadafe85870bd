import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { type TakeoverInit, TakeoverInitSchema, TakeoverResponseSchema } from './gen/cloud/agent/api/takeover_pb.js';

/**
 * Said in every TakeoverSuccess until the agent boots its own environment:
 * upstream's takeover kexecs into the agent's kernel and initramfs; this
 * agent runs in place, on the OS the machine was provisioned with.
 */
export const IN_PLACE_WARNING =
  'the agent runs in place on the provisioned OS: capturing its network configuration and kexec into the agent environment are not implemented';

/** The outcome of a takeover: what to write to standard output, and, on success, what the agent runs with. */
export type Takeover =
  | { readonly ok: true; readonly response: Uint8Array; readonly init: TakeoverInit; readonly privateKey: KeyObject }
  | { readonly ok: false; readonly response: Uint8Array; readonly message: string };

/**
 * Answers the shepherd's TakeoverInit (its standard input): a
 * TakeoverSuccess echoing the init and carrying the raw public half of a new
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
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const key = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url');
  const response = toBinary(
    TakeoverResponseSchema,
    create(TakeoverResponseSchema, {
      result: { case: 'success', value: { initMessage: init, key, warning: [IN_PLACE_WARNING] } },
    }),
  );
  return { ok: true, response, init, privateKey };
}

function refused(message: string): Takeover {
  const response = toBinary(
    TakeoverResponseSchema,
    create(TakeoverResponseSchema, { result: { case: 'error', value: { message } } }),
  );
  return { ok: false, response, message };
}
