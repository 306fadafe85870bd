/** The lab cannot be set up: a Debian package missing, a file that cannot be made. Names what to install. */
export class LabSetupError extends Error {
  override name = 'LabSetupError';
}

/** A virtual machine (QEMU, its QMP socket, its guest) did not do what was asked. Names the VM. */
export class VmError extends Error {
  override name = 'VmError';
  constructor(
    /** The VM's name (its inventory `id`). */
    readonly vm: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(`VM ${vm}: ${problem}`, options);
  }
}
