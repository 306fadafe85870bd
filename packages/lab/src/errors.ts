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

/** A shepherd process of the lab did not stop cleanly (exit 0) when stopped. Names it and its log. */
export class LabProcessError extends Error {
  override name = 'LabProcessError';
  constructor(
    /** The process's name (`shepherd run static`, `shepherd server`). */
    readonly process: string,
    problem: string,
  ) {
    super(`${process} ${problem}`);
  }
}
