import { connect, createServer, type Server, type Socket } from 'node:net';

/**
 * A TCP proxy in front of the test database, to cut a client off the way a
 * network partition or a dead host would: `cut()` drops every connection and
 * refuses new ones until `restore()`; `stall()` closes nothing and forwards
 * nothing more (half-open connections).
 */
export class TcpProxy {
  #sockets = new Set<Socket>();
  #cut = false;
  #stalled = false;

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  /** Proxies 127.0.0.1:<random port> to `target` (a URL's host and port). */
  static async start(targetHost: string, targetPort: number): Promise<TcpProxy> {
    let proxy: TcpProxy | undefined;
    const server = createServer((client) => {
      if (!proxy || proxy.#cut) {
        client.destroy();
        return;
      }
      if (proxy.#stalled) {
        // Taken, never forwarded nor closed: closed with the proxy.
        const sockets = proxy.#sockets;
        sockets.add(client);
        client.pause();
        client.on('close', () => sockets.delete(client));
        client.on('error', () => client.destroy());
        return;
      }
      const upstream = connect(targetPort, targetHost);
      for (const socket of [client, upstream]) {
        proxy.#sockets.add(socket);
        const sockets = proxy.#sockets;
        socket.on('close', () => sockets.delete(socket));
        socket.on('error', () => {
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream);
      upstream.pipe(client);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    if (!address || typeof address !== 'object') throw new Error('proxy has no port');
    proxy = new TcpProxy(server, address.port);
    return proxy;
  }

  /** A PostgreSQL URL like `url`, but through this proxy. */
  proxied(url: string): string {
    const parsed = new URL(url);
    parsed.hostname = '127.0.0.1';
    parsed.port = String(this.port);
    return parsed.toString();
  }

  /** Drops all connections and refuses new ones. */
  cut(): void {
    this.#cut = true;
    for (const socket of this.#sockets) socket.destroy();
  }

  /**
   * Stops forwarding without closing anything, as a path whose far end
   * vanished without a word (a half-open connection): every connection stays
   * open and nothing more gets through it, either way; new ones are taken
   * and never answered. Until {@link restore}, for new connections; those
   * stalled stay so until closed.
   */
  stall(): void {
    this.#stalled = true;
    for (const socket of this.#sockets) {
      socket.unpipe();
      socket.pause();
    }
  }

  /** Accepts (and forwards) connections again. */
  restore(): void {
    this.#cut = false;
    this.#stalled = false;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Proxies `url`'s host and port; returns the proxy and the proxied URL. */
  static async for(url: string): Promise<{ proxy: TcpProxy; url: string }> {
    const parsed = new URL(url);
    const proxy = await TcpProxy.start(parsed.hostname, Number(parsed.port || 5432));
    return { proxy, url: proxy.proxied(url) };
  }
}
