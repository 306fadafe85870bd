import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';

/** An image an {@link ImageServer} serves, optionally slowly. */
export interface ServedImage {
  readonly bytes: Uint8Array;
  /** Send it in chunks of this many bytes (default: all at once)… */
  readonly chunkBytes?: number;
  /** …each this many milliseconds after the last. */
  readonly chunkDelayMs?: number;
  /** Send the last chunk only once this settles: a download the test lets finish when it chooses. */
  readonly lastChunkAfter?: Promise<unknown>;
}

/**
 * A real HTTPS server of disk images for tests: `GET /<name>` answers the
 * image of that name, anything else 404. Counts requests and knows whether a
 * download was broken off by its client.
 */
export class ImageServer {
  readonly #images = new Map<string, ServedImage>();
  readonly requests: string[] = [];
  /** Downloads the client closed before the last byte. */
  readonly brokenOff: string[] = [];

  private constructor(private readonly server: Server) {}

  static async start(tls: { readonly cert: string; readonly key: string }): Promise<ImageServer> {
    let images: ImageServer | undefined;
    const server = createServer({ cert: tls.cert, key: tls.key }, (request, response) => {
      const name = (request.url ?? '/').slice(1);
      images?.requests.push(name);
      const image = images?.image(name);
      if (image === undefined || request.method !== 'GET') {
        response.writeHead(404).end('no such image');
        return;
      }
      response.writeHead(200, { 'content-length': image.bytes.length, 'content-type': 'application/octet-stream' });
      const chunk = image.chunkBytes ?? image.bytes.length;
      let offset = 0;
      let waited = image.lastChunkAfter === undefined;
      const send = () => {
        if (response.destroyed) return;
        const end = Math.min(offset + chunk, image.bytes.length);
        if (end >= image.bytes.length && !waited) {
          waited = true;
          void image.lastChunkAfter?.then(send, send);
          return;
        }
        response.write(image.bytes.subarray(offset, end));
        offset = end;
        if (offset >= image.bytes.length) response.end();
        else setTimeout(send, image.chunkDelayMs ?? 0);
      };
      response.on('close', () => {
        if (offset < image.bytes.length) images?.brokenOff.push(name);
      });
      send();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    images = new ImageServer(server);
    return images;
  }

  /** Serves `image` as `/<name>` from now on. */
  serve(name: string, image: ServedImage): void {
    this.#images.set(name, image);
  }

  image(name: string): ServedImage | undefined {
    return this.#images.get(name);
  }

  /** The URL of `/<name>` (served or not). */
  url(name: string): string {
    return `https://127.0.0.1:${(this.server.address() as AddressInfo).port}/${name}`;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
