import { BmcResponseError } from '../errors.js';
import { isRecord, stringArray } from './json.js';
import type { RedfishTarget } from './target.js';
import type { RedfishTransport } from './transport.js';

/** What the client read of a ComputerSystem. */
export interface RedfishSystem {
  /** Absolute URL of the `#ComputerSystem.Reset` action, `undefined` when the system has none. */
  readonly resetTarget: string | undefined;
  /** `ResetType@Redfish.AllowableValues` (or from the action's ActionInfo); `undefined` when not listed. */
  readonly allowableResetTypes: readonly string[] | undefined;
  readonly powerState: string | undefined;
}

/** Reads a ComputerSystem: its reset action, allowable reset types and power state. */
export async function readSystem(
  transport: RedfishTransport,
  target: RedfishTarget,
  signal: AbortSignal | undefined,
): Promise<RedfishSystem> {
  const { body } = await transport.send(target, 'GET', target.url, undefined, signal);
  if (!isRecord(body)) {
    throw new BmcResponseError(
      target.machine,
      'redfish',
      target.url,
      'the answer is not a Redfish resource (JSON object)',
    );
  }
  const actions = isRecord(body.Actions) ? body.Actions : undefined;
  const reset = actions && isRecord(actions['#ComputerSystem.Reset']) ? actions['#ComputerSystem.Reset'] : undefined;
  let resetTarget: string | undefined;
  if (reset && typeof reset.target === 'string' && reset.target !== '') {
    resetTarget = sameOrigin(target, reset.target);
  }
  let allowable = reset ? stringArray(reset['ResetType@Redfish.AllowableValues']) : undefined;
  const actionInfo = reset?.['@Redfish.ActionInfo'];
  if (allowable === undefined && typeof actionInfo === 'string') {
    allowable = await actionInfoResetTypes(transport, target, sameOrigin(target, actionInfo), signal);
  }
  return {
    resetTarget,
    allowableResetTypes: allowable,
    powerState: typeof body.PowerState === 'string' ? body.PowerState : undefined,
  };
}

/** `ResetType` allowable values from an ActionInfo resource, where a BMC lists them there. */
async function actionInfoResetTypes(
  transport: RedfishTransport,
  target: RedfishTarget,
  url: string,
  signal: AbortSignal | undefined,
): Promise<string[] | undefined> {
  const { body } = await transport.send(target, 'GET', url, undefined, signal);
  const parameters = isRecord(body) && Array.isArray(body.Parameters) ? body.Parameters : [];
  const resetType = parameters.find((p): p is Record<string, unknown> => isRecord(p) && p.Name === 'ResetType');
  return resetType ? stringArray(resetType.AllowableValues) : undefined;
}

/** A link of the BMC's resolved against the system URL; another origin would get our credentials: refused. */
function sameOrigin(target: RedfishTarget, link: string): string {
  const base = new URL(target.url);
  const resolved = new URL(link, base);
  if (resolved.origin !== base.origin) {
    throw new BmcResponseError(
      target.machine,
      'redfish',
      target.url,
      `the BMC links to ${resolved.origin}, another origin; refusing to send it the credentials`,
    );
  }
  return resolved.href;
}
