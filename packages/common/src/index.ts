/**
 * What every BMaaS package shares, none of it about machines: pauses and
 * retries that a signal stops, telling a stop from a failure, an error's
 * message for logs, the UUID check, a semaphore, a secret that does not
 * leak, and self-signed X.509 certificates.
 *
 * @packageDocumentation
 */

export { isAbortError, isAbortOf, isStop } from './abort.js';
export { describeError } from './describe-error.js';
export { type RetryOptions, retry } from './retry.js';
export { Secret } from './secret.js';
export { Semaphore } from './semaphore.js';
export { sleep } from './sleep.js';
export { isUuid } from './uuid.js';
export { certificatePem, type SelfSignedOptions, selfSignedCertificate } from './x509.js';
