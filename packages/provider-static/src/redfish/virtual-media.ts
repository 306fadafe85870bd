import { BmcResponseError, BmcUnsupportedError, RedfishHttpError, VirtualMediaUnsupportedError } from '../errors.js';
import { isRecord, stringArray } from './json.js';
import { linkOf, type RedfishSystem, sameOrigin } from './system.js';
import type { RedfishTarget } from './target.js';
import type { RedfishTransport } from './transport.js';

/** A CD or DVD virtual media of a BMC (a `#VirtualMedia` resource), as read. */
export interface RedfishVirtualMedia {
  /** The resource's absolute URL. */
  readonly url: string;
  readonly mediaTypes: readonly string[];
  readonly inserted: boolean;
  /** The image's URL, as the BMC says it (`Image`); `undefined` when it says none. */
  readonly image: string | undefined;
  /** `#VirtualMedia.InsertMedia`'s target; `undefined` when it has none. */
  readonly insertTarget: string | undefined;
  /** `#VirtualMedia.EjectMedia`'s target; `undefined` when it has none. */
  readonly ejectTarget: string | undefined;
}

/** Media types an ISO is inserted as. */
const CD_TYPES = ['CD', 'DVD'];

/**
 * The system's CD or DVD virtual media: the first member whose `MediaTypes`
 * has `CD` or `DVD` of the system's own `VirtualMedia` collection, else of
 * its Managers' (`Links.ManagedBy`, where iDRAC and most BMCs keep it).
 *
 * @throws {@link VirtualMediaUnsupportedError} when no collection is linked, or none has a CD or DVD
 */
export async function findCdMedia(
  transport: RedfishTransport,
  target: RedfishTarget,
  system: RedfishSystem,
  signal: AbortSignal | undefined,
): Promise<RedfishVirtualMedia> {
  // What the collections held that is no CD, for the error.
  const seen: string[] = [];
  const cdIn = async (collection: string): Promise<RedfishVirtualMedia | undefined> => {
    const members = (await getRecord(transport, target, collection, signal)).Members;
    for (const member of Array.isArray(members) ? members : []) {
      const url = linkOf(target, member);
      if (url === undefined) continue;
      const media = readMedia(target, url, await getRecord(transport, target, url, signal));
      if (media.mediaTypes.some((type) => CD_TYPES.includes(type))) return media;
      seen.push(`${url} (${media.mediaTypes.join(', ') || 'no MediaTypes'})`);
    }
    return undefined;
  };
  const own = system.virtualMedia === undefined ? undefined : await cdIn(system.virtualMedia);
  if (own !== undefined) return own;
  for (const manager of system.managedBy) {
    const collection = linkOf(target, (await getRecord(transport, target, manager, signal)).VirtualMedia);
    const media = collection === undefined ? undefined : await cdIn(collection);
    if (media !== undefined) return media;
  }
  throw new VirtualMediaUnsupportedError(
    target.machine,
    'redfish',
    target.url,
    seen.length === 0
      ? 'the BMC has no virtual media: neither the ComputerSystem nor its Manager (Links.ManagedBy) links a VirtualMedia collection with members'
      : `the BMC has no CD or DVD virtual media (it has ${seen.join('; ')})`,
  );
}

/**
 * `#VirtualMedia.InsertMedia` of `image` (`Inserted`, `WriteProtected`, and
 * `TransferProtocolType` from its scheme).
 *
 * @throws {@link VirtualMediaUnsupportedError} when the media has no InsertMedia action
 * @throws {@link BmcResponseError} when the BMC refuses it (an HTTP error), naming the action and the image
 */
export async function insertMedia(
  transport: RedfishTransport,
  target: RedfishTarget,
  media: RedfishVirtualMedia,
  image: string,
  signal: AbortSignal | undefined,
): Promise<void> {
  if (media.insertTarget === undefined) {
    throw new VirtualMediaUnsupportedError(
      target.machine,
      'redfish',
      media.url,
      'the virtual media has no #VirtualMedia.InsertMedia action with a target',
    );
  }
  const body = {
    Image: image,
    Inserted: true,
    WriteProtected: true,
    TransferProtocolType: new URL(image).protocol === 'https:' ? 'HTTPS' : 'HTTP',
  };
  try {
    // BMCs name the image in their refusals, the ones retried (and logged) too.
    await transport.send(target, 'POST', media.insertTarget, body, signal, {
      conceal: (text) => concealImagePath(text, image),
    });
  } catch (error) {
    if (!(error instanceof RedfishHttpError)) throw error;
    // Its detail is concealed already; the HTTP error is not kept as the cause all the same.
    const { detail } = error;
    throw new BmcResponseError(
      target.machine,
      'redfish',
      media.insertTarget,
      `InsertMedia of ${mediaName(image)} refused: HTTP ${error.status}${detail === '' ? '' : `: ${detail}`}`,
    );
  }
}

/**
 * `#VirtualMedia.EjectMedia`.
 *
 * @throws {@link BmcUnsupportedError} when the media has no EjectMedia action
 */
export async function ejectMedia(
  transport: RedfishTransport,
  target: RedfishTarget,
  media: RedfishVirtualMedia,
  signal: AbortSignal | undefined,
): Promise<void> {
  if (media.ejectTarget === undefined) {
    throw new BmcUnsupportedError(
      target.machine,
      'redfish',
      media.url,
      'the virtual media has no #VirtualMedia.EjectMedia action with a target',
    );
  }
  await transport.send(target, 'POST', media.ejectTarget, {}, signal);
}

/**
 * An image URL as named in messages and logs: its origin and file name.
 * The path between may be what keeps a boot's media (and the token in it)
 * unguessable, so it is never shown.
 */
export function mediaName(image: string): string {
  try {
    const url = new URL(image);
    return `${url.origin}/…/${url.pathname.split('/').pop() ?? ''}`;
  } catch {
    return '(an image URL that does not parse)';
  }
}

/**
 * `text` with the image's directory path (the URL's path but its file name)
 * shown as `/…`, as {@link mediaName} shows it: the whole URL, or its path
 * alone, as a BMC may quote either.
 */
function concealImagePath(text: string, image: string): string {
  let directory: string;
  try {
    const { pathname } = new URL(image);
    directory = pathname.slice(0, pathname.lastIndexOf('/'));
  } catch {
    return text;
  }
  return directory === '' ? text : text.replaceAll(directory, '/…');
}

function readMedia(target: RedfishTarget, url: string, body: Record<string, unknown>): RedfishVirtualMedia {
  const actions = isRecord(body.Actions) ? body.Actions : {};
  const actionTarget = (name: string): string | undefined => {
    const action = actions[name];
    return isRecord(action) && typeof action.target === 'string' && action.target !== ''
      ? sameOrigin(target, action.target)
      : undefined;
  };
  return {
    url,
    mediaTypes: stringArray(body.MediaTypes) ?? [],
    inserted: body.Inserted === true,
    image: typeof body.Image === 'string' && body.Image !== '' ? body.Image : undefined,
    insertTarget: actionTarget('#VirtualMedia.InsertMedia'),
    ejectTarget: actionTarget('#VirtualMedia.EjectMedia'),
  };
}

async function getRecord(
  transport: RedfishTransport,
  target: RedfishTarget,
  url: string,
  signal: AbortSignal | undefined,
): Promise<Record<string, unknown>> {
  const { body } = await transport.send(target, 'GET', url, undefined, signal);
  if (!isRecord(body)) {
    throw new BmcResponseError(target.machine, 'redfish', url, 'the answer is not a Redfish resource (JSON object)');
  }
  return body;
}
