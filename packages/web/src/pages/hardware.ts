import type { MachineView } from '../data.js';
import { type Html, html } from '../html.js';
import { timeTag } from '../time.js';

type MachineHardware = NonNullable<MachineView['hardware']>;
type HardwareReport = NonNullable<MachineHardware['report']>;
type HardwareDisk = HardwareReport['disks'][number];

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'] as const;

/** Bytes in binary units, three significant digits at most: `15.6 GiB`, `512 B`. */
export function byteSize(bytes: number): string {
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : Number(value.toPrecision(3))} ${UNITS[unit]}`;
}

/** A link's speed in bits a second, as NICs are sold: `25 Gb/s`; from the report's bytes a second. */
export function linkSpeed(bytesPerSecond: number): string {
  const megabits = (bytesPerSecond * 8) / 1_000_000;
  return megabits >= 1000 ? `${Number((megabits / 1000).toPrecision(3))} Gb/s` : `${megabits} Mb/s`;
}

const none = html`<span class="none">–</span>`;

/** What the firmware says of a disk's health: OK, or its critical warning, media errors, spare and wear. */
function health(disk: HardwareDisk): Html {
  const h = disk.health;
  const figures = [
    h.mediaErrors === undefined ? undefined : `${h.mediaErrors} media errors`,
    h.availableSpareRatio === undefined ? undefined : `${Math.round(h.availableSpareRatio * 100)}% spare`,
    h.usageRatio === undefined ? undefined : `${Math.round(h.usageRatio * 100)}% worn`,
  ].filter((figure) => figure !== undefined);
  return html`${h.criticalWarning ? html`<span class="cause">critical warning</span>` : 'OK'}${
    figures.length > 0 ? html` <span class="muted">${figures.join(', ')}</span>` : ''
  }`;
}

function report(r: HardwareReport): Html {
  const threads = r.cpus.reduce((sum, cpu) => sum + cpu.threads, 0);
  const cores = r.cpus.reduce((sum, cpu) => sum + cpu.cores, 0);
  const summary = html`<dl class="tags">
<dt>system</dt><dd>${r.system.manufacturer || none} ${r.system.product}</dd>
<dt>serial</dt><dd class="id">${r.system.serialNumber || none}</dd>
<dt>boot</dt><dd>${r.boot} <span class="muted">(EFI support ${r.efiSupport})</span></dd>
<dt>memory</dt><dd>${byteSize(r.memory.installedBytes)} installed${
    r.memory.usableRatio > 0 ? `, ${byteSize(r.memory.installedBytes * r.memory.usableRatio)} usable` : ''
  }</dd>
<dt>CPU</dt><dd>${
    r.cpus.length === 0
      ? none
      : html`${r.cpus.length} × ${r.cpus[0]?.model}: ${cores} cores, ${threads} threads <span class="muted">${r.cpus[0]?.vendor}</span>`
  }</dd>
</dl>`;
  const disks =
    r.disks.length === 0
      ? html`<p class="muted">No disks reported.</p>`
      : html`<div class="scroll"><table class="disks"><thead><tr><th>model</th><th>serial</th><th>WWN</th><th>size</th><th>protocol</th><th>rotational</th><th>health</th></tr></thead><tbody>${r.disks.map(
          (d) => html`<tr><td>${[d.vendor, d.model].filter((part) => part !== '').join(' ') || none}</td>
<td class="id">${d.serialNumber || none}</td><td class="id">${d.wwn || none}</td>
<td class="num">${byteSize(d.sizeBytes)} <span class="muted">(${d.logicalBlockSize}/${d.physicalBlockSize} B blocks)</span></td>
<td>${d.protocol}</td><td>${d.rotational ? 'yes' : 'no'}</td><td>${health(d)}</td></tr>`,
        )}</tbody></table></div>`;
  const nics =
    r.nics.length === 0
      ? html`<p class="muted">No NICs reported.</p>`
      : html`<div class="scroll"><table class="nics"><thead><tr><th>MAC</th><th>driver</th><th>speed</th><th>link</th></tr></thead><tbody>${r.nics.map(
          (n) => html`<tr><td class="id">${n.mac}</td><td>${n.driver || none}</td>
<td class="num">${n.speedBytesPerSecond > 0 ? linkSpeed(n.speedBytesPerSecond) : none}</td><td>${n.linkUp ? 'up' : 'down'}</td></tr>`,
        )}</tbody></table></div>`;
  const warnings =
    r.warnings.length === 0
      ? ''
      : html`<ul class="warnings">${r.warnings.map((w) => html`<li class="cause">${w}</li>`)}</ul>`;
  return html`${summary}<h3>Disks</h3>${disks}<h3>NICs</h3>${nics}${warnings}`;
}

/** The machine's last hardware report: system, boot, memory, CPUs, each disk and NIC, the agent's warnings. */
export function hardwareSection(m: MachineView): Html {
  const hardware = m.hardware;
  if (hardware === null) return html`<p class="muted">No hardware report: its agent has sent none.</p>`;
  return html`<p class="muted">Reported by its agent ${timeTag(hardware.reportedAt, m.now)}.</p>${
    hardware.report === undefined
      ? html`<div class="cause">${hardware.unreadable ?? ''}</div>`
      : report(hardware.report)
  }`;
}
