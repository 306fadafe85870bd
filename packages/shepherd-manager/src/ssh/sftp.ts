/** Uploading a file over SFTP so that it replaces the target whole. */
import { randomBytes } from 'node:crypto';
import type { SFTPWrapper } from 'ssh2';
import type { SshTarget } from '../ssh-client.js';
import { SshUploadError } from './errors.js';

export /**
 * Writes `contents` next to `targetPath`, makes it mode 0755 and renames it
 * over `targetPath`. Renaming, not rewriting in place, so that a copy of the
 * agent still running from an earlier attempt is no obstacle (Linux refuses to
 * open a running executable for writing: ETXTBSY), and so that the target is
 * never a half-written executable.
 */
async function replaceFile(sftp: SFTPWrapper, target: SshTarget, targetPath: string, contents: Buffer): Promise<void> {
  const temporary = `${targetPath}.upload-${randomBytes(4).toString('hex')}`;
  const step = (problem: string, run: (done: (error?: Error | null) => void) => void): Promise<void> =>
    new Promise((resolve, reject) =>
      run((error) =>
        error
          ? reject(new SshUploadError(target, targetPath, `${problem}: ${error.message}`, { cause: error }))
          : resolve(),
      ),
    );
  try {
    await step(`cannot write ${temporary}`, (done) => sftp.writeFile(temporary, contents, { mode: 0o755 }, done));
    // The mode given at creation is subject to the server's umask.
    await step('cannot chmod 0755', (done) => sftp.chmod(temporary, 0o755, done));
    await step('cannot rename into place', (done) => {
      try {
        sftp.ext_openssh_rename(temporary, targetPath, done);
      } catch {
        // No posix-rename@openssh.com: plain SFTP rename refuses to replace a file, so remove it first.
        sftp.unlink(targetPath, () => sftp.rename(temporary, targetPath, done));
      }
    });
  } catch (error) {
    sftp.unlink(temporary, () => {});
    throw error;
  }
}
