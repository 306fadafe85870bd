import { stat } from 'node:fs/promises';
import path from 'node:path';
import { buildAgentImage, type MissingFirmware } from '@bmaas/agent';
import { log } from '../logging.js';
import { type Argv, optional, required, UsageError } from '../settings.js';

/** What `agent-image` does; `build` is the only one yet. */
export const AGENT_IMAGE_ACTIONS = ['build'] as const;

/**
 * `shepherd agent-image build --out DIR [--cache-dir DIR] [--agent-bundle FILE] [--firmware-dir DIR]`:
 * builds the agent environment (`vmlinuz`, `initramfs`, `agent.iso`, and
 * `takeover`, the payload the initializer uploads) into
 * DIR from this machine's Debian packages, reusing the parts whose inputs
 * did not change from the cache, and prints what it wrote, then each
 * driver's declared firmware that the firmware directory does not have.
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
  const firmwareDir = optional(argv, 'firmware-dir');
  if (firmwareDir !== undefined && !(await stat(firmwareDir).catch(() => undefined))?.isDirectory()) {
    throw new UsageError('firmware-dir', `${JSON.stringify(path.resolve(firmwareDir))} is not a directory`);
  }
  const started = performance.now();
  const image = await buildAgentImage({
    out,
    ...(cacheDir === undefined ? {} : { cacheDir: path.resolve(cacheDir) }),
    ...(bundle === undefined ? {} : { agentBundle: path.resolve(bundle) }),
    ...(firmwareDir === undefined ? {} : { firmwareDir: path.resolve(firmwareDir) }),
  });
  log('agent image built in %d ms, kernel %s', Math.round(performance.now() - started), image.kernel.release);
  const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
  write(
    [
      `${image.vmlinuz} (Debian's kernel ${image.kernel.release})`,
      `${image.initramfs} (${mib(image.initramfsBytes)}, gzip${image.cached.initramfs ? ', from the cache' : ''})`,
      `${image.iso} (${mib(image.isoBytes)}, BIOS and UEFI${image.cached.iso ? ', from the cache' : ''})`,
      `${image.takeover} (${mib(image.takeoverBytes)}, the takeover payload: --agent-executable-path of shepherd run)`,
      `${image.modules.length} kernel modules, ${image.firmware.length} firmware files from ${image.firmwareDir}`,
      ...missingFirmware(image.missingFirmware, image.firmwareDir),
      '',
    ].join('\n'),
  );
}

/** The declared firmware not found, one line per driver; none when all was found. */
function missingFirmware(missing: readonly MissingFirmware[], firmwareDir: string): string[] {
  if (missing.length === 0) return [];
  const byModule = new Map<string, string[]>();
  for (const { module, firmware } of missing) byModule.set(module, [...(byModule.get(module) ?? []), firmware]);
  return [
    `firmware declared by ${byModule.size} drivers not found in ${firmwareDir} (those drivers may not start their devices; see @bmaas/agent's README, "Firmware"):`,
    ...[...byModule].map(([module, files]) => `  ${module}: ${files.join(' ')}`),
  ];
}
