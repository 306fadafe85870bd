import type { IncomingMessage } from 'node:http';
import type { Http2ServerRequest, Http2Session } from 'node:http2';
import type { TLSSocket } from 'node:tls';
import { createContextKey } from '@connectrpc/connect';

/**
 * The raw ed25519 public key of the client certificate a request's
 * connection presented, or `undefined` when it presented none, or one over
 * another kind of key. The certificate's chain is not checked (it is
 * self-signed): what counts is that the TLS handshake proved the client
 * holds the private half of this key.
 */
export const peerKey = createContextKey<Uint8Array | undefined>(undefined, { description: 'client ed25519 key' });

/**
 * Keys already read, per connection (an HTTP/2 connection, Node's
 * `Http2Session`, or the socket for HTTP/1.1): every heartbeat of an agent
 * arrives on the same one. `null`: the connection has none.
 */
const keys = new WeakMap<Http2Session | TLSSocket, Uint8Array | null>();

/** The {@link peerKey} of `request`'s connection. */
export function peerKeyOf(request: IncomingMessage | Http2ServerRequest): Uint8Array | undefined {
  if ('stream' in request) return connectionPeerKey(request.stream.session);
  const socket = request.socket as TLSSocket;
  return readPeerKey(socket, socket);
}

/**
 * The {@link peerKey} of an HTTP/2 connection (a stream's `session`, in
 * Node's words; none once the connection is gone).
 */
export function connectionPeerKey(connection: Http2Session | undefined): Uint8Array | undefined {
  if (connection === undefined) return undefined;
  const known = keys.get(connection);
  // The connection's socket is read only the first time: it is a proxy that binds every method read from it.
  return known === undefined ? readPeerKey(connection, connection.socket as TLSSocket) : (known ?? undefined);
}

function readPeerKey(connection: Http2Session | TLSSocket, socket: TLSSocket): Uint8Array | undefined {
  let key = keys.get(connection);
  if (key === undefined) {
    key = (typeof socket.getPeerX509Certificate === 'function' ? ed25519Key(socket) : undefined) ?? null;
    keys.set(connection, key);
  }
  return key ?? undefined;
}

function ed25519Key(socket: TLSSocket): Uint8Array | undefined {
  const certificate = socket.getPeerX509Certificate();
  if (certificate === undefined || certificate.publicKey.asymmetricKeyType !== 'ed25519') return undefined;
  const { x } = certificate.publicKey.export({ format: 'jwk' });
  return x === undefined ? undefined : new Uint8Array(Buffer.from(x, 'base64url'));
}
