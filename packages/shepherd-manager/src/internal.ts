import createDebug from 'debug';

/** Loggers under `shepherd:*`; each line names the machine and provider IDs involved. */
export const log = {
  provisioner: createDebug('shepherd:provisioner'),
  initializer: createDebug('shepherd:initializer'),
  recoverer: createDebug('shepherd:recoverer'),
  power: createDebug('shepherd:power'),
  agentBooter: createDebug('shepherd:agent-booter'),
  bootFiles: createDebug('shepherd:boot-files'),
};

/** Steps within an event (an agent start begun, a reboot asked for): `shepherd:*` includes them, the CLI's default not. */
export const detail = {
  provisioner: createDebug('shepherd:provisioner:detail'),
  initializer: createDebug('shepherd:initializer:detail'),
  recoverer: createDebug('shepherd:recoverer:detail'),
  power: createDebug('shepherd:power:detail'),
  agentBooter: createDebug('shepherd:agent-booter:detail'),
  /** Each request of an image file or a boot's ISO (BMCs fetch ISOs in many ranges). */
  bootFiles: createDebug('shepherd:boot-files:detail'),
};
