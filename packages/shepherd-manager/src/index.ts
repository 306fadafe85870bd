/**
 * The shepherd: brings machines in from a provider, starts the agent on each
 * over SSH, and reboots the ones whose agent went silent, all through the BMDB.
 *
 * @packageDocumentation
 */

export {
  Availability,
  type CreateMachineRequest,
  type Machine,
  MachineNotFoundError,
  NotImplementedError,
  type Provider,
  type Recoverer,
  ShepherdError,
} from './provider.js';
