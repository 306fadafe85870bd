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
  /** The one-time boot override as the BMC reports it (`Boot`). */
  readonly boot: RedfishBootSettings;
  /** Absolute URL of the system's own `VirtualMedia` collection, `undefined` when it links none. */
  readonly virtualMedia: string | undefined;
  /** Absolute URLs of the Managers that manage it (`Links.ManagedBy`), where a BMC keeps its virtual media. */
  readonly managedBy: readonly string[];
  /** The resource's `ETag`, sent back as `If-Match` with a PATCH of it; `undefined` when the BMC sends none. */
  readonly etag: string | undefined;
}

/** A ComputerSystem's `Boot`: the boot source override, as read back. */
export interface RedfishBootSettings {
  /** `BootSourceOverrideTarget`: `None`, `Pxe`, `Cd`, `Hdd`, … */
  readonly target: string | undefined;
  /** `BootSourceOverrideEnabled`: `Disabled`, `Once` or `Continuous`. */
  readonly enabled: string | undefined;
  /** `BootSourceOverrideMode`: `UEFI` or `Legacy`; `undefined` on BMCs that do not have it. */
  readonly mode: string | undefined;
  /** `BootSourceOverrideTarget@Redfish.AllowableValues`; `undefined` when not listed. */
  readonly allowableTargets: readonly string[] | undefined;
}

/** Reads a ComputerSystem: its reset action, allowable reset types and power state. */
export async function readSystem(
  transport: RedfishTransport,
  target: RedfishTarget,
  signal: AbortSignal | undefined,
): Promise<RedfishSystem> {
  const { body, etag } = await transport.send(target, 'GET', target.url, undefined, signal);
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
  const boot = isRecord(body.Boot) ? body.Boot : {};
  const links = isRecord(body.Links) ? body.Links : {};
  return {
    resetTarget,
    allowableResetTypes: allowable,
    powerState: typeof body.PowerState === 'string' ? body.PowerState : undefined,
    boot: {
      target: text(boot.BootSourceOverrideTarget),
      enabled: text(boot.BootSourceOverrideEnabled),
      mode: text(boot.BootSourceOverrideMode),
      allowableTargets: stringArray(boot['BootSourceOverrideTarget@Redfish.AllowableValues']),
    },
    virtualMedia: linkOf(target, body.VirtualMedia),
    managedBy: (Array.isArray(links.ManagedBy) ? links.ManagedBy : [])
      .map((manager: unknown) => linkOf(target, manager))
      .filter((url): url is string => url !== undefined),
    etag,
  };
}

/** The absolute URL of a Redfish link (`{ "@odata.id": … }`), on the system's origin; `undefined` for no link. */
export function linkOf(target: RedfishTarget, value: unknown): string | undefined {
  const id = isRecord(value) ? value['@odata.id'] : undefined;
  return typeof id === 'string' && id !== '' ? sameOrigin(target, id) : undefined;
}

function text(value: unknown): string | undefined {
  return typeof value === 'string' ? value : undefined;
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
export function sameOrigin(target: RedfishTarget, link: string): string {
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
