import { AgentImageError, type BootKernel, findKernel as findBootKernel } from '@bmaas/agent';
import { LabSetupError } from './errors.js';

/** Debian's kernel (`linux-image-amd64`) and its modules, as the agent image finds it. */
export type GuestKernel = BootKernel;

/**
 * The newest `/boot/vmlinuz-*` whose modules are installed too (the VMs load
 * virtio and 9p modules from it).
 *
 * @throws {@link LabSetupError} naming the package when there is none
 */
export function findKernel(boot = '/boot', modules = '/lib/modules'): GuestKernel {
  try {
    return findBootKernel(boot, modules);
  } catch (error) {
    if (error instanceof AgentImageError) throw new LabSetupError(error.message, { cause: error });
    throw error;
  }
}
