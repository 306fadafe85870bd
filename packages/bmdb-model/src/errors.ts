import { BMDBError } from '@bmaas/bmdb-controlloop';

/*
 * The machine model's own errors, beside those of the first boot's and the
 * root-device hints' checks (in their modules). Each is a `BMDBError`, so a
 * caller catching the library's errors catches these too.
 */

/** Why an enrollment was refused (see {@link EnrollmentRefusedError}). */
export type EnrollmentRefusal = 'NoToken' | 'WrongToken' | 'Expired' | 'Used';

const ENROLLMENT_REFUSALS: Readonly<Record<EnrollmentRefusal, string>> = {
  NoToken: 'no enrollment token was issued for it',
  WrongToken: 'the enrollment token is not the one issued for it',
  Expired: 'its enrollment token expired',
  Used: 'its enrollment token was used already',
};

/**
 * An agent's enrollment was refused: the machine had no token issued
 * (`NoToken`, also for a machine that does not exist), the token presented
 * is not its own (`WrongToken`), or its token expired (`Expired`) or was
 * used (`Used`). The message names the machine and the reason, never the
 * token.
 */
export class EnrollmentRefusedError extends BMDBError {
  override name = 'EnrollmentRefusedError';
  constructor(
    readonly machine: string,
    readonly reason: EnrollmentRefusal,
  ) {
    super(`enrollment of machine ${machine} refused: ${ENROLLMENT_REFUSALS[reason]}`);
  }
}
