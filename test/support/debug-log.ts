import { format } from 'node:util';
import createDebug from 'debug';

/** Debug log lines being captured, and how to stop. */
export interface CapturedDebugLog {
  /** Each line as the logger wrote it (without colors: tests read no TTY). */
  readonly lines: string[];
  /** Puts back the namespaces enabled and the output there were before. */
  restore(): void;
}

/**
 * Captures what the `debug` loggers of `namespaces` (`shepherd:recoverer`,
 * `shepherd:*`, ...) write, instead of printing it, until `restore()`.
 */
export function captureDebugLog(namespaces: string): CapturedDebugLog {
  const lines: string[] = [];
  const previousNamespaces = createDebug.disable();
  const previousLog = createDebug.log;
  createDebug.enable(namespaces);
  createDebug.log = (...args: unknown[]) => void lines.push(format(...args));
  return {
    lines,
    restore() {
      createDebug.log = previousLog;
      createDebug.disable();
      if (previousNamespaces) createDebug.enable(previousNamespaces);
    },
  };
}
