import { stat } from 'node:fs/promises';
import path from 'node:path';
import { buildAgentImage } from '@bmaas/agent';
import { log } from '../logging.js';
import { type Argv, optional, required, UsageError } from '../settings.js';

/** What `agent-image` does; `build` is the only one yet. */
export const AGENT_IMAGE_ACTIONS = ['build'] as const;

/**
 * `shepherd agent-image build --out DIR [--cache-dir DIR] [--agent-bundle FILE]`:
 * builds the agent environment (`vmlinuz`, `initramfs`, `agent.iso`, and
 * `takeover`, the payload the initializer uploads) into
 * DIR from this machine's Debian packages, reusing the parts whose inputs
 * did not change from the cache, and prints what it wrote.
 */
export async function agentImage(argv: Argv, write: (text: string) => void): Promise<void> {
  const out = path.resolve(required(argv, 'out', 'agent-image build'));
  const existing = await stat(out).catch(() => undefined);
  if (existing && !existing.isDirectory()) throw new UsageError('out', `${JSON.stringify(out)} is not a directory`);
  const bundle = optional(argv, 'agent-bundle');
  if (bundle !== undefined && !(await stat(bundle).catch(() => undefined))?.isFile()) {
    throw new UsageError(
      'agent-bundle',
      `${JSON.stringify(bundle)} is not a file (npm run bundle -w @bmaas/agent makes one)`,
    );
  }
  const cacheDir = optional(argv, 'cache-dir');
  const started = performance.now();
  const image = await buildAgentImage({
    out,
    ...(cacheDir === undefined ? {} : { cacheDir: path.resolve(cacheDir) }),
    ...(bundle === undefined ? {} : { agentBundle: path.resolve(bundle) }),
  });
  log('agent image built in %d ms, kernel %s', Math.round(performance.now() - started), image.kernel.release);
  const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
  write(
    [
      `${image.vmlinuz} (Debian's kernel ${image.kernel.release})`,
      `${image.initramfs} (${mib(image.initramfsBytes)}, gzip${image.cached.initramfs ? ', from the cache' : ''})`,
      `${image.iso} (${mib(image.isoBytes)}, BIOS and UEFI${image.cached.iso ? ', from the cache' : ''})`,
      `${image.takeover} (${mib(image.takeoverBytes)}, the takeover payload: --agent-executable-path of shepherd run)`,
      '',
    ].join('\n'),
  );
}
