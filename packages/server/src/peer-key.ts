import type { IncomingMessage } from 'node:http';
import type { Http2ServerRequest } from 'node:http2';
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

/** Keys already read, per connection: every heartbeat of an agent arrives on the same one. */
const keys = new WeakMap<TLSSocket, Uint8Array | undefined>();

/** The {@link peerKey} of `request`'s connection. */
export function peerKeyOf(request: IncomingMessage | Http2ServerRequest): Uint8Array | undefined {
  const socket = ('stream' in request ? request.stream.session?.socket : request.socket) as TLSSocket | undefined;
  if (socket === undefined || typeof socket.getPeerX509Certificate !== 'function') return undefined;
  if (keys.has(socket)) return keys.get(socket);
  const key = ed25519Key(socket);
  keys.set(socket, key);
  return key;
}

function ed25519Key(socket: TLSSocket): Uint8Array | undefined {
  const certificate = socket.getPeerX509Certificate();
  if (certificate === undefined || certificate.publicKey.asymmetricKeyType !== 'ed25519') return undefined;
  const { x } = certificate.publicKey.export({ format: 'jwk' });
  return x === undefined ? undefined : new Uint8Array(Buffer.from(x, 'base64url'));
}
