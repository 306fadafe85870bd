import { connect, createServer, type Server, type Socket } from 'node:net';

/** How a {@link HostileProxy} treats the connections it accepts from now on. */
export type HostileMode =
  /** Passes bytes both ways. */
  | { readonly kind: 'pass' }
  /** Accepts the connection and says nothing, ever: a host whose SSH server hangs. */
  | { readonly kind: 'silent' }
  /** Passes bytes until the client has sent `bytes`, then drops the connection: a network cut mid-transfer. */
  | { readonly kind: 'cut'; readonly bytes: number };

/**
 * A TCP proxy on 127.0.0.1 in front of a server (an sshd), misbehaving on
 * demand: a mode applies to the connections accepted after it is set.
 */
export class HostileProxy {
  mode: HostileMode = { kind: 'pass' };
  /** Connections cut by a `cut` mode. */
  cuts = 0;
  /** Connections held open by the `silent` mode. */
  silenced = 0;
  readonly #sockets = new Set<Socket>();

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(targetPort: number, targetHost = '127.0.0.1'): Promise<HostileProxy> {
    let proxy: HostileProxy | undefined;
    const server = createServer((client) => {
      if (proxy) proxy.#accept(client, targetHost, targetPort);
      else client.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    if (!address || typeof address !== 'object') throw new Error('proxy has no port');
    proxy = new HostileProxy(server, address.port);
    return proxy;
  }

  #track(socket: Socket): void {
    this.#sockets.add(socket);
    socket.on('close', () => this.#sockets.delete(socket));
    socket.on('error', () => socket.destroy());
  }

  #accept(client: Socket, host: string, port: number): void {
    const mode = this.mode;
    this.#track(client);
    if (mode.kind === 'silent') {
      this.silenced++;
      return;
    }
    const upstream = connect(port, host);
    this.#track(upstream);
    const drop = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', drop);
    upstream.on('close', drop);
    upstream.pipe(client);
    if (mode.kind === 'pass') {
      client.pipe(upstream);
      return;
    }
    let sent = 0;
    client.on('data', (chunk: Buffer) => {
      if (sent + chunk.length >= mode.bytes) {
        this.cuts++;
        drop();
        return;
      }
      sent += chunk.length;
      upstream.write(chunk);
    });
  }

  /** Drops every connection and stops listening. */
  async close(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
