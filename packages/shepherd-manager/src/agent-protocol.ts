import {
  type TakeoverInit,
  TakeoverInitSchema,
  type TakeoverResponse,
  TakeoverResponseSchema,
} from '@bmaas/api/cloud/agent/api/takeover_pb';
import { describeError } from '@bmaas/common';
import { create, equals, fromBinary, toBinary } from '@bufbuild/protobuf';
import { ShepherdError } from './provider.js';

/** Length of an ed25519 public key, the only kind of key an agent may answer with. */
export const AGENT_KEY_LENGTH = 32;

/** What the shepherd tells an agent it starts (the fields of `TakeoverInit`). */
export interface TakeoverInitParams {
  /** The machine's ID in the BMDB (a UUID string). */
  readonly machineId: string;
  /** Address of the BMaaS service the agent connects to. */
  readonly bmaasEndpoint: string;
  /** DER-encoded X.509 CA certificate of the endpoint; absent: the agent trusts its system CAs. */
  readonly caCertificate?: Uint8Array | undefined;
}

/** A successful takeover, as the agent reported it. */
export interface AgentTakeover {
  /** The agent's ed25519 public key ({@link AGENT_KEY_LENGTH} bytes). */
  readonly key: Uint8Array;
  /** Non-fatal problems the agent reported; worth logging. */
  readonly warnings: readonly string[];
}

/** Why an agent's answer was rejected; see {@link AgentResponseError}. */
export type AgentResponseRejection = 'agent-error' | 'init-mismatch' | 'bad-key-length' | 'unparseable' | 'no-result';

/**
 * An agent's answer to a `TakeoverInit` was not a usable `TakeoverSuccess`.
 * `reason` says which check failed.
 */
export class AgentResponseError extends ShepherdError {
  override name = 'AgentResponseError';
  constructor(
    readonly machineId: string,
    readonly reason: AgentResponseRejection,
    detail: string,
    options?: ErrorOptions,
  ) {
    super(`agent on machine ${machineId}: ${detail}`, options);
  }
}

/** The wire form of a `TakeoverInit`, to be written to the agent's standard input. */
export function encodeTakeoverInit(params: TakeoverInitParams): Uint8Array {
  return toBinary(TakeoverInitSchema, takeoverInit(params));
}

/**
 * Parses and checks an agent's standard output as a `TakeoverResponse` to the
 * `TakeoverInit` built from `sent`.
 *
 * @throws {@link AgentResponseError} when the agent reported an error, did not
 *   echo the init message it was given, answered with a key that is not an
 *   ed25519 public key, or wrote something that is not a `TakeoverResponse`
 */
export function parseTakeoverResponse(stdout: Uint8Array, sent: TakeoverInitParams): AgentTakeover {
  const { machineId } = sent;
  let response: TakeoverResponse;
  try {
    response = fromBinary(TakeoverResponseSchema, stdout);
  } catch (error) {
    throw new AgentResponseError(
      machineId,
      'unparseable',
      `standard output (${stdout.length} bytes) is not a TakeoverResponse: ${describeError(error)}`,
      { cause: error },
    );
  }
  const { result } = response;
  switch (result.case) {
    case 'error':
      throw new AgentResponseError(machineId, 'agent-error', `agent reported an error: ${result.value.message}`);
    case 'success':
      break;
    default:
      throw new AgentResponseError(
        machineId,
        'no-result',
        `TakeoverResponse from ${stdout.length} bytes of output has neither success nor error set`,
      );
  }
  const { initMessage, key, warning } = result.value;
  const expected = takeoverInit(sent);
  const echoed = initMessage ?? create(TakeoverInitSchema);
  if (!equals(TakeoverInitSchema, expected, echoed)) {
    throw new AgentResponseError(
      machineId,
      'init-mismatch',
      `echoed init message differs from the one sent (${describeMismatch(expected, echoed)})`,
    );
  }
  if (key.length !== AGENT_KEY_LENGTH) {
    throw new AgentResponseError(
      machineId,
      'bad-key-length',
      `agent key is ${key.length} bytes, want ${AGENT_KEY_LENGTH} (ed25519 public key)`,
    );
  }
  return { key, warnings: warning };
}

function takeoverInit(params: TakeoverInitParams): TakeoverInit {
  return create(TakeoverInitSchema, {
    machineId: params.machineId,
    bmaasEndpoint: params.bmaasEndpoint,
    caCertificate: params.caCertificate ?? new Uint8Array(),
  });
}

// Names the differing fields so an operator can tell a confused agent from a wrong machine.
function describeMismatch(expected: TakeoverInit, echoed: TakeoverInit): string {
  const differences: string[] = [];
  if (expected.machineId !== echoed.machineId) {
    differences.push(`machine_id ${JSON.stringify(echoed.machineId)}, sent ${JSON.stringify(expected.machineId)}`);
  }
  if (expected.bmaasEndpoint !== echoed.bmaasEndpoint) {
    differences.push(
      `bmaas_endpoint ${JSON.stringify(echoed.bmaasEndpoint)}, sent ${JSON.stringify(expected.bmaasEndpoint)}`,
    );
  }
  if (!sameBytes(expected.caCertificate, echoed.caCertificate)) {
    differences.push(
      `ca_certificate of ${echoed.caCertificate.length} bytes, sent ${expected.caCertificate.length} bytes`,
    );
  }
  return differences.length > 0 ? differences.join('; ') : 'unknown fields differ';
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}
