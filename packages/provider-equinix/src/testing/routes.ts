/** The calls the fake Equinix API answers, how a request is matched to one, and what an answer is. */

/** The calls the fake API implements, named `METHOD /path/{template}`. */
export type FakeRoute =
  | 'GET /projects/{id}/devices'
  | 'POST /projects/{id}/devices'
  | 'GET /projects/{id}/hardware-reservations'
  | 'GET /devices/{id}'
  | 'POST /devices/{id}/actions'
  | 'GET /projects/{id}/ssh-keys'
  | 'POST /projects/{id}/ssh-keys'
  | 'PUT /ssh-keys/{id}';

/** A call the fake API received. The API key is never recorded. */
export interface FakeRequest {
  readonly method: string;
  /** Path without the base path: `/projects/…/devices`. */
  readonly path: string;
  /** The route it matched, if any. */
  readonly route: FakeRoute | undefined;
  readonly query: Readonly<Record<string, string>>;
  /** Parsed JSON body (the raw text if it was not JSON; `undefined` without a body). */
  readonly body: unknown;
  /** Whether it carried the right API key. */
  readonly authenticated: boolean;
}

/** What a route answers: a status and a JSON body, if any. */
export interface Answer {
  readonly status: number;
  readonly body?: unknown;
}

const ROUTES: ReadonlyArray<{ route: FakeRoute; method: string; pattern: RegExp }> = [
  { route: 'GET /projects/{id}/devices', method: 'GET', pattern: /^\/projects\/([^/]+)\/devices$/ },
  { route: 'POST /projects/{id}/devices', method: 'POST', pattern: /^\/projects\/([^/]+)\/devices$/ },
  {
    route: 'GET /projects/{id}/hardware-reservations',
    method: 'GET',
    pattern: /^\/projects\/([^/]+)\/hardware-reservations$/,
  },
  { route: 'GET /devices/{id}', method: 'GET', pattern: /^\/devices\/([^/]+)$/ },
  { route: 'POST /devices/{id}/actions', method: 'POST', pattern: /^\/devices\/([^/]+)\/actions$/ },
  { route: 'GET /projects/{id}/ssh-keys', method: 'GET', pattern: /^\/projects\/([^/]+)\/ssh-keys$/ },
  { route: 'POST /projects/{id}/ssh-keys', method: 'POST', pattern: /^\/projects\/([^/]+)\/ssh-keys$/ },
  { route: 'PUT /ssh-keys/{id}', method: 'PUT', pattern: /^\/ssh-keys\/([^/]+)$/ },
];

/** The route `method` and `path` (below the base path) call, if the fake implements it. */
export function matchRoute(method: string | undefined, path: string): { route: FakeRoute; id: string } | undefined {
  const match = ROUTES.find((r) => r.method === method && r.pattern.test(path));
  return match && { route: match.route, id: decodeURIComponent(match.pattern.exec(path)?.[1] ?? '') };
}

/** Whether some route has this path, whatever its method: 405 rather than 404. */
export function isKnownPath(path: string): boolean {
  return ROUTES.some((r) => r.pattern.test(path));
}

export const NOT_FOUND: Answer = { status: 404, body: { errors: ['Not found'] } };

export function unprocessable(message: string): Answer {
  return { status: 422, body: { errors: [message] } };
}
