import { SshKey } from '@bmaas/shepherd-manager';
import { type Argv, sshKeyPath } from '../settings.js';

/** `shepherd ssh-key`: prints the public key of --ssh-key-path, generating the key when missing. */
export async function sshKey(argv: Argv, write: (text: string) => void): Promise<void> {
  const key = await SshKey.loadOrGenerate(sshKeyPath(argv));
  write(`${key.authorizedKey}\n`);
}
