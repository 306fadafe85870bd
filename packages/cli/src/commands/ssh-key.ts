import path from 'node:path';
import { SshKey } from '@bmaas/shepherd-manager';
import { ensureDirectory } from '../directory.js';
import { type Argv, sshKeyFlag, sshKeyPath } from '../settings.js';

/** `shepherd ssh-key`: prints the public key of --ssh-key-path, generating the key when missing. */
export async function sshKey(argv: Argv, write: (text: string) => void): Promise<void> {
  const keyPath = sshKeyPath(argv);
  await ensureDirectory(sshKeyFlag(argv), path.dirname(keyPath), 0o700);
  const key = await SshKey.loadOrGenerate(keyPath);
  write(`${key.authorizedKey}\n`);
}
