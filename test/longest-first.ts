import { relative } from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Orders test files for the workers: files Vitest has no duration for first
 * (new ones, or every file on a machine without the cache), biggest first;
 * then files that failed last time; then the rest by their last duration,
 * longest first. Across projects: Vitest's own order goes project by
 * project, so a long file of a late project (cli's) started near the end and
 * ran on alone while the other workers sat idle.
 */
export class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const root = this.ctx.config.root;
    const known = (file: TestSpecification) => {
      const key = `${file.project.name}:${relative(root, file.moduleId)}`;
      return {
        file,
        last: this.ctx.cache.getFileTestResults(key),
        size: this.ctx.cache.getFileStats(key)?.size ?? 0,
      };
    };
    return files
      .map(known)
      .sort((a, b) => {
        if (!a.last || !b.last) return a.last ? 1 : b.last ? -1 : b.size - a.size;
        if (a.last.failed !== b.last.failed) return a.last.failed ? -1 : 1;
        return b.last.duration - a.last.duration;
      })
      .map(({ file }) => file);
  }
}
