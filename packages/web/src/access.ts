import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';

/**
 * The login cookie the login form sets: a keyed digest of the token, never
 * the token itself. Its name (and the digest's label) keep the word
 * `session` they were released with: a new name would log every browser out.
 */
export const LOGIN_COOKIE = 'shepherd_web_session';

/** Shortest token accepted: a guessable token on a reachable port is no lock. */
export const MIN_TOKEN_LENGTH = 16;

/**
 * The page was asked to listen beyond loopback without a token, or with one
 * too short to protect it.
 */
export class WebTokenError extends Error {
  override name = 'WebTokenError';
  constructor(
    /** The host the page was to listen on. */
    readonly host: string,
    problem: string,
  ) {
    super(problem);
  }
}

/** Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`. */
export function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (bare === 'localhost') return true;
  if (isIP(bare) === 4) return bare.startsWith('127.');
  if (isIP(bare) === 6) return bare === '::1' || bare === '0:0:0:0:0:0:0:1' || bare.startsWith('::ffff:127.');
  return false;
}

/**
 * The token rule: the page may listen on loopback openly, anywhere else only
 * behind a token of at least {@link MIN_TOKEN_LENGTH} characters.
 *
 * @throws {@link WebTokenError} naming the host when the rule is broken
 */
export function checkTokenRule(host: string, token: string | undefined): void {
  if (token !== undefined && token.length < MIN_TOKEN_LENGTH) {
    throw new WebTokenError(host, `the web token must be at least ${MIN_TOKEN_LENGTH} characters long`);
  }
  if (token === undefined && !isLoopback(host)) {
    throw new WebTokenError(
      host,
      `serving the fleet page on ${host}, beyond loopback, needs a token (or listen on 127.0.0.1)`,
    );
  }
}

/**
 * The page was asked to listen beyond loopback over plain HTTP without
 * saying a TLS proxy in front terminates TLS, or to do both.
 */
export class WebTlsError extends Error {
  override name = 'WebTlsError';
  constructor(
    /** The host the page was to listen on. */
    readonly host: string,
    problem: string,
  ) {
    super(problem);
  }
}

/**
 * The TLS rule: beyond loopback the page, its token and its cookie travel
 * over TLS, served by the page itself (`tls`) or by a proxy in front that
 * terminates it (`insecureHttp`: the page speaks plain HTTP to the proxy).
 * On loopback, plain HTTP is allowed.
 *
 * @throws {@link WebTlsError} naming the host when the rule is broken
 */
export function checkTlsRule(host: string, transport: { tls: boolean; insecureHttp: boolean }): void {
  if (transport.tls && transport.insecureHttp) {
    throw new WebTlsError(
      host,
      'the fleet page is served either with TLS or as plain HTTP behind a TLS proxy, not both',
    );
  }
  if (!transport.tls && !transport.insecureHttp && !isLoopback(host)) {
    throw new WebTlsError(
      host,
      `serving the fleet page on ${host}, beyond loopback, needs TLS: a certificate, or a TLS proxy in front (insecure HTTP to it)`,
    );
  }
}

/** Checks bearer tokens and login cookies against one token, in constant time. */
export class TokenCheck {
  readonly #tokenDigest: Buffer;
  readonly #cookieValue: string;

  constructor(token: string) {
    this.#tokenDigest = sha256(token);
    // Keyed by the token: a new token logs everyone out, and the cookie never carries the token.
    this.#cookieValue = createHmac('sha256', token).update('shepherd-web-session v1').digest('base64url');
  }

  /** Whether `given` is the token. Both sides are hashed first so their lengths match. */
  matches(given: string): boolean {
    return timingSafeEqual(sha256(given), this.#tokenDigest);
  }

  /** Whether the request carries the token as `Authorization: Bearer …` or the login cookie. */
  admits(headers: { authorization?: string | undefined; cookie?: string | undefined }): boolean {
    const bearer = /^Bearer\s+(.+)$/i.exec(headers.authorization ?? '')?.[1]?.trim();
    if (bearer !== undefined && this.matches(bearer)) return true;
    const cookie = parseCookies(headers.cookie)[LOGIN_COOKIE];
    return cookie !== undefined && timingSafeEqual(sha256(cookie), sha256(this.#cookieValue));
  }

  /**
   * The `Set-Cookie` value that logs a browser in: HttpOnly, SameSite=Strict,
   * the whole site; `Secure` (sent over HTTPS only) when the page is reached over HTTPS.
   */
  loginCookie(secure: boolean): string {
    return `${LOGIN_COOKIE}=${this.#cookieValue}; HttpOnly; SameSite=Strict; Path=/${secure ? '; Secure' : ''}`;
  }
}

/** The `Set-Cookie` value that logs a browser out. */
export function expiredLoginCookie(secure: boolean): string {
  return `${LOGIN_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0${secure ? '; Secure' : ''}`;
}

/** `name=value` pairs of a Cookie header; malformed pairs are skipped. */
export function parseCookies(header: string | undefined): Record<string, string> {
  const cookies: Record<string, string> = {};
  for (const part of (header ?? '').split(';')) {
    const at = part.indexOf('=');
    if (at < 1) continue;
    const name = part.slice(0, at).trim();
    try {
      cookies[name] = decodeURIComponent(part.slice(at + 1).trim());
    } catch {
      // A value that is not valid percent-encoding is nobody's cookie of ours.
    }
  }
  return cookies;
}

function sha256(text: string): Buffer {
  return createHash('sha256').update(text).digest();
}
