#!/usr/bin/env node
// ipmi_sim's chassis control for a lab VM: ipmi_sim runs
//   chassis-control.js <QMP socket> <boot device file> get power [boot]
//   chassis-control.js <QMP socket> <boot device file> set power 0|1 | reset 1 | shutdown 1 | boot <device>
// and reads "power:1" lines back from a get. Errors go to stdout, which
// ipmi_sim logs, with a non-zero exit, which it answers as a failed command.
import { QemuPower, type VmBootDevice } from './power.js';

/** ipmi_sim's boot values (its boot_map) and the VM's devices: "default" is what `bootdev disk` sends. */
const FROM_IPMI: Record<string, VmBootDevice> = { default: 'disk', none: 'default', pxe: 'pxe', cdrom: 'cdrom' };
const TO_IPMI: Record<VmBootDevice, string> = { disk: 'default', default: 'default', pxe: 'pxe', cdrom: 'cdrom' };

async function main(argv: string[]): Promise<void> {
  const [socket, bootFile, op, ...parms] = argv;
  if (!socket || !bootFile || (op !== 'get' && op !== 'set')) {
    throw new Error('usage: chassis-control.js <QMP socket> <boot device file> get|set <parm> [value] ...');
  }
  const power = new QemuPower(socket, socket, bootFile);
  if (op === 'get') {
    const lines: string[] = [];
    for (const parm of parms) {
      if (parm === 'power') lines.push(`power:${(await power.state()) === 'On' ? 1 : 0}`);
      else if (parm === 'boot') lines.push(`boot:${TO_IPMI[await power.bootDevice()]}`);
      else throw new Error(`cannot get ${parm}`);
    }
    process.stdout.write(`${lines.join('\n')}\n`);
    return;
  }
  for (let i = 0; i + 1 < parms.length; i += 2) {
    const [parm, value] = [parms[i], parms[i + 1]];
    if (parm === 'power') await (value === '0' ? power.off() : power.on());
    else if (parm === 'reset') await power.reset();
    else if (parm === 'shutdown') await power.off({ graceful: true });
    else if (parm === 'boot') {
      const device = FROM_IPMI[value ?? ''];
      if (device === undefined) throw new Error(`unknown boot device ${value}`);
      await power.setBootDevice(device);
    } else if (parm !== 'identify') throw new Error(`cannot set ${parm}`);
  }
}

main(process.argv.slice(2)).catch((error: unknown) => {
  process.stdout.write(`chassis-control: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
});
