import type { InstallationView, MachineView } from '../data.js';
import { type Html, href, html } from '../html.js';
import { relativeTime, timeTag } from '../time.js';
import { hardwareSection } from './hardware.js';
import { installationBadge, powerBadge, stageBadge } from './layout.js';

/** A JSON detail of an operator action, as `key value` pairs. */
function detailText(detail: Readonly<Record<string, unknown>> | null): string {
  if (detail === null) return '';
  return Object.entries(detail)
    .map(([key, value]) => `${key} ${typeof value === 'string' ? value : JSON.stringify(value)}`)
    .join(', ');
}

/** The install disk as the request names it: its path, its root-device hints (`serialNumber=…`), or both. */
function rootDeviceText(i: InstallationView): string {
  const hints = Object.entries(i.rootDeviceHints ?? {}).map(([field, value]) => `${field}=${value}`);
  return [...(i.rootDevice === undefined ? [] : [i.rootDevice]), ...hints].join(' ');
}

/** The machine's OS installation request (or disk wipe): generation, image, delivered, outcome and the agent's error. */
function installation(m: MachineView): Html {
  const i = m.osInstallation;
  if (i === null) return html`<span class="none">–</span> never requested`;
  const what =
    i.kind === 'DiskWipe'
      ? html`<div class="muted">wipe every disk's metadata${i.decommission ? ', then decommission the machine' : ''}</div>`
      : html`<div class="muted">${i.imageUrl} (${i.compression === 'gzip' ? 'gzip' : 'format by its first bytes'}) onto ${rootDeviceText(i)}${i.userDataBytes > 0 ? `, ${i.userDataBytes} bytes of user-data` : ''}</div>
<div class="muted id">sha256 ${i.imageSha256}</div>`;
  return html`${installationBadge(i)}
${what}
<div>requested by ${i.requestedBy} ${timeTag(i.requestedAt, m.now)}; ${
    i.deliveredAt ? html`delivered to its agent ${timeTag(i.deliveredAt, m.now)}` : 'not delivered yet'
  }${i.endedAt ? html`; ${i.state === 'Canceled' ? 'canceled' : 'reported'} ${timeTag(i.endedAt, m.now)}` : ''}</div>${
    i.kind === 'DiskImage' ? html`<div class="muted">${firstBootSettings(i)}</div>` : ''
  }${firstBoot(i, m.now)}${i.error === null ? '' : html`<div class="cause">${i.error}</div>`}`;
}

/** What the installed OS is given on its first boot (its config drive): hostname, SSH keys, network. */
function firstBootSettings(i: InstallationView): string {
  const keys = i.sshPublicKeys.length === 1 ? '1 SSH key' : `${i.sshPublicKeys.length} SSH keys`;
  const network = i.network === undefined ? 'DHCP on each NIC' : `${i.network.interfaces.length} interfaces configured`;
  return `first boot as ${i.hostname}, ${keys}, ${network}`;
}

/** Whether the installed OS came up: booted (when, its host keys), booting, or installed-not-booted. */
function firstBoot(i: InstallationView, now: Date): Html {
  if (i.firstBoot === undefined) return html``;
  if (i.firstBoot === 'booted' && i.bootedAt !== null) {
    const keys = i.bootedHostKeys.map((key) => html`<div class="muted id">host key ${key}</div>`);
    return html`<div><span class="first-boot first-boot-booted">booted</span> ${timeTag(i.bootedAt, now)}</div>${keys}`;
  }
  return i.firstBoot === 'installed-not-booted'
    ? html`<div><span class="first-boot first-boot-installed-not-booted">installed-not-booted</span> its OS has not reported its first boot</div>`
    : html`<div><span class="first-boot first-boot-booting">booting</span> its OS has not reported its first boot yet</div>`;
}

/** How the machine's agent arrives, as its inventory says. */
function agentBootText(m: MachineView): string {
  if (m.agentBoot === 'virtual-media') return 'virtual-media: its BMC boots the agent from virtual media';
  if (m.agentBoot === 'network') return 'network: its BMC boots the agent from the network';
  return 'ssh: the shepherd takes its running OS over through SSH';
}

/**
 * `/machines/<id>`: tags with its hold and power state, live work, backoffs,
 * its last hardware report, what operators did to it, and the work history
 * as a timeline.
 */
export function machinePage(m: MachineView): Html {
  const p = m.provided;
  const none = html`<span class="none">–</span>`;
  const tags = html`<dl class="tags">
<dt>stage</dt><dd>${stageBadge(m.stage)}</dd>
<dt>created</dt><dd>${timeTag(m.createdAt, m.now)}</dd>
${
  p
    ? html`<dt>provider</dt><dd><a href="${href('/machines', { provider: p.provider })}">${p.provider}</a></dd>
<dt>provider ID</dt><dd class="id">${p.providerId}${m.consoleUrl ? html` · <a href="${m.consoleUrl}" rel="noreferrer noopener" target="_blank">console</a>` : ''}</dd>
<dt>address</dt><dd>${p.providerIpAddress ?? none}</dd>
<dt>location</dt><dd>${p.providerLocation ?? none}</dd>
<dt>status</dt><dd>${p.providerStatus ?? none}</dd>
<dt>reservation</dt><dd class="id">${p.providerReservationId ?? none}</dd>`
    : html`<dt>provided</dt><dd>${none} no Provided tag</dd>`
}
<dt>agent boot</dt><dd>${agentBootText(m)}</dd>
<dt>agent started</dt><dd>${m.agentStartedAt ? timeTag(m.agentStartedAt, m.now) : html`${none} not started`}</dd>
<dt>agent key</dt><dd class="id">${m.agentKeyFingerprint ?? none}</dd>
<dt>hold</dt><dd>${
    m.hold
      ? html`<span class="held">held</span> by ${m.hold.actor} ${timeTag(m.hold.since, m.now)} (for ${relativeTime(
          m.hold.since,
          m.now,
        ).replace(' ago', '')})<div class="cause">${m.hold.reason}</div>`
      : html`${none} not held`
  }</dd>
<dt>power</dt><dd>${
    m.power
      ? html`${powerBadge(m.power.state, m.power.readAt, m.now)} ${m.power.readAt ? html`read ${timeTag(m.power.readAt, m.now)}` : ''}${
          m.power.failedAt
            ? html`<div class="cause">last read failed ${timeTag(m.power.failedAt, m.now)}: ${m.power.failedCause ?? ''}</div>`
            : ''
        }`
      : none
  }</dd>
<dt>installation</dt><dd>${installation(m)}</dd>
<dt>last heartbeat</dt><dd>${
    m.lastHeartbeatAt
      ? html`${timeTag(m.lastHeartbeatAt, m.now)} (age ${relativeTime(m.lastHeartbeatAt, m.now).replace(' ago', '')})`
      : html`${none} never`
  }</dd>
</dl>`;

  const work =
    m.liveWork.length === 0
      ? html`<p class="muted">No live work.</p>`
      : html`<div class="scroll"><table><thead><tr><th>process</th><th>held by</th><th>session</th><th>since</th></tr></thead><tbody>${m.liveWork.map(
          (w) => html`<tr><td>${w.process}</td><td>${w.componentName}${w.processor ? html` / ${w.processor}` : ''}</td>
<td class="id">${w.sessionId}</td><td>${timeTag(w.since, m.now)}</td></tr>`,
        )}</tbody></table></div>`;

  const backoffs =
    m.backoffs.length === 0
      ? html`<p class="muted">No backoffs.</p>`
      : html`<div class="scroll"><table><thead><tr><th>process</th><th>state</th><th>until</th><th>interval</th><th>cause</th></tr></thead><tbody>${m.backoffs.map(
          (
            b,
          ) => html`<tr><td>${b.process}</td><td>${b.active ? html`<span class="stage stage-awaitingRecovery">active</span>` : html`<span class="stage">expired</span>`}</td>
<td>${timeTag(b.until, m.now)}</td><td class="num">${b.lastIntervalSeconds === null ? '' : `${b.lastIntervalSeconds} s`}</td>
<td class="cause">${b.cause}</td></tr>`,
        )}</tbody></table></div>`;

  const timeline =
    m.history.length === 0
      ? html`<p class="muted">No work recorded.</p>`
      : html`<ol class="timeline">${m.history.map(
          (h) =>
            html`<li class="ev-${h.event}"><span class="event ev-${h.event}">${h.event}</span> ${h.process} · ${timeTag(h.timestamp, m.now)}${
              h.failedCause === null ? '' : html`<div class="cause">${h.failedCause}</div>`
            }</li>`,
        )}</ol>${
          m.historyTotal > m.history.length
            ? html`<p class="muted">${m.historyTotal - m.history.length} older entries not shown (the machine has ${m.historyTotal}).</p>`
            : ''
        }`;

  const operatorActions =
    m.operatorHistory.length === 0
      ? html`<p class="muted">No operator has acted on it.</p>`
      : html`<ol class="timeline operator">${m.operatorHistory.map(
          (a) =>
            html`<li class="ev-${a.outcome}"><span class="event">${a.action}</span> <span class="event ev-${a.outcome}">${a.outcome}</span> by ${a.actor} · ${timeTag(a.timestamp, m.now)}${
              a.reason === null ? '' : html`<div class="reason">${a.reason}</div>`
            }${a.cause === null ? '' : html`<div class="cause">${a.cause}</div>`}${
              a.detail === null ? '' : html`<div class="muted">${detailText(a.detail)}</div>`
            }</li>`,
        )}</ol>`;

  return html`<h1><span class="id">${m.machineId}</span></h1>
<div class="grid">
<section><h2>Tags</h2>${tags}</section>
<section><h2>Live work</h2>${work}<h2>Backoffs</h2>${backoffs}</section>
</div>
<h2>Hardware</h2>
<section class="hardware">${hardwareSection(m)}</section>
<h2>Agent log <span class="muted">(its last 64 KiB)</span></h2>
${agentLogSection(m)}
<h2>Operator actions <span class="muted">(holds, power, installations; newest first)</span></h2>
${operatorActions}
<h2>Work history <span class="muted">(newest first)</span></h2>
${timeline}`;
}

/** The tail of the agent's log its heartbeats carried, as text (whatever the agent wrote), with when it came. */
function agentLogSection(m: MachineView): Html {
  if (m.agentLog === null) return html`<p class="muted">No agent log: its agent has sent none.</p>`;
  return html`<p class="muted">Received from its agent ${timeTag(m.agentLog.receivedAt, m.now)}.</p>
<pre class="agent-log">${m.agentLog.text}</pre>`;
}
