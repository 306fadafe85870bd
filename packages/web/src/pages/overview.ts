import { MACHINE_STAGES } from '@bmaas/bmdb-model';
import type { Overview } from '../data.js';
import { type Html, href, html } from '../html.js';
import { relativeTime, timeTag } from '../time.js';
import { INSTALLATION_LABELS, POWER_LABELS, STAGE_LABELS } from './layout.js';

/** `/`: stages as a bar chart, live sessions, work in flight, backoffs by cause, recent failures, retired machines. */
export function overviewPage(o: Overview): Html {
  const largest = Math.max(1, ...MACHINE_STAGES.map((stage) => o.stages[stage]));
  const chart = MACHINE_STAGES.filter((stage) => stage !== 'unprovided' || o.stages.unprovided > 0).map((stage) => {
    const count = o.stages[stage];
    const percent = ((count / largest) * 100).toFixed(1);
    return html`<tr class="stage-${stage}">
<td><a href="${href('/machines', { stage })}">${STAGE_LABELS[stage]}</a></td>
<td class="bar"><svg role="img" aria-label="${STAGE_LABELS[stage]}: ${count}" preserveAspectRatio="none"><rect class="track" x="0" y="0" width="100%" height="100%"></rect><rect class="fill" x="0" y="0" width="${percent}%" height="100%"></rect></svg></td>
<td class="num">${count.toLocaleString('en-US')}</td>
</tr>`;
  });

  const power = (Object.keys(POWER_LABELS) as (keyof typeof POWER_LABELS)[])
    .filter((state) => o.powerStates[state] > 0 || state === 'On')
    .map(
      (state) =>
        html`<tr><td><a href="${href('/machines', { power: state })}">${POWER_LABELS[state]}</a></td><td class="num">${o.powerStates[
          state
        ].toLocaleString('en-US')}</td></tr>`,
    );
  const installations = (Object.keys(INSTALLATION_LABELS) as (keyof typeof INSTALLATION_LABELS)[])
    .filter((state) => o.installations[state] > 0)
    .map(
      (state) =>
        html`<tr><td><a href="${href('/machines', { installation: state })}"><span class="install install-${state}">${INSTALLATION_LABELS[state]}</span></a></td><td class="num">${o.installations[
          state
        ].toLocaleString('en-US')}</td></tr>`,
    );
  const work = Object.entries(o.liveWork);
  const sessions = o.sessions.map(
    (s) => html`<tr>
<td>${s.componentName}</td>
<td>${s.processor ?? html`<span class="none">–</span>`}</td>
<td class="hide-narrow">${s.runtimeInfo}</td>
<td>${timeTag(s.createdAt, o.now)}</td>
<td>${timeTag(s.deadline, o.now)}</td>
<td class="num">${s.work}</td>
</tr>`,
  );
  const causes = o.backoffCauses.map(
    (c) => html`<tr>
<td><a href="${href('/machines', { backoff: c.process })}">${c.process}</a></td>
<td class="cause" title="${c.exampleCause}">${c.cause}</td>
<td class="num">${c.machines.toLocaleString('en-US')}</td>
<td>${timeTag(c.soonestUntil, o.now)}${
      relativeTime(c.latestUntil, o.now) === relativeTime(c.soonestUntil, o.now)
        ? ''
        : html` – ${timeTag(c.latestUntil, o.now)}`
    }</td>
<td><a class="id" href="/machines/${c.exampleMachineId}">${c.exampleMachineId.slice(0, 8)}</a></td>
</tr>`,
  );
  const retired = o.retiredMachines.map(
    (r) => html`<tr>
<td>${r.provider}</td>
<td>${r.providerId}</td>
<td class="id">${r.machineId.slice(0, 8)}</td>
<td>${timeTag(r.retiredAt, o.now)}</td>
<td>${r.actor ?? html`<span class="none">–</span>`}</td>
<td>${r.wiped ? 'wiped' : 'not wiped'}</td>
<td class="cause">${r.reason ?? ''}</td>
</tr>`,
  );
  const failures = o.recentFailures.map(
    (f) => html`<tr>
<td>${timeTag(f.timestamp, o.now)}</td>
<td><a class="id" href="/machines/${f.machineId}">${f.providerId ?? f.machineId}</a></td>
<td>${f.process}</td>
<td class="cause">${f.cause ?? ''}</td>
</tr>`,
  );

  return html`<h1>Fleet: ${o.machines.toLocaleString('en-US')} machines</h1>
<div class="grid">
<section>
<h2>Machines per stage</h2>
<table class="chart">${chart}</table>
<h2>Held</h2>
<p>${
    o.held === 0
      ? html`<span class="muted">No machine is held.</span>`
      : html`<a href="${href('/machines', { held: 'yes' })}">${o.held.toLocaleString('en-US')} machine${o.held === 1 ? '' : 's'} held</a> by operators: no loop touches ${o.held === 1 ? 'it' : 'them'}`
  }</p>
<h2>Power</h2>
<table class="power-states"><thead><tr><th>state</th><th class="num">machines</th></tr></thead><tbody>${power}</tbody></table>
${
  o.powerReadFailed === 0
    ? ''
    : html`<p class="muted">${o.powerReadFailed.toLocaleString('en-US')} machine${o.powerReadFailed === 1 ? '' : 's'}: last power state read failed</p>`
}
<h2>OS installations</h2>
${
  installations.length === 0
    ? html`<p class="muted">No OS installation was requested.</p>`
    : html`<table class="installations"><thead><tr><th>state</th><th class="num">machines</th></tr></thead><tbody>${installations}</tbody></table>`
}
</section>
<section>
<h2>Work in flight</h2>
${
  work.length === 0
    ? html`<p class="muted">No live work.</p>`
    : html`<table><thead><tr><th>process</th><th class="num">machines</th></tr></thead><tbody>${work.map(
        ([process, count]) =>
          html`<tr><td><a href="${href('/machines', { work: process })}">${process}</a></td><td class="num">${count}</td></tr>`,
      )}</tbody></table>`
}
<h2>Live sessions</h2>
${
  sessions.length === 0
    ? html`<p class="muted">No live sessions: no shepherd is running.</p>`
    : html`<div class="scroll"><table><thead><tr><th>component</th><th>processor</th><th class="hide-narrow">runtime</th><th>started</th><th>deadline</th><th class="num">work</th></tr></thead><tbody>${sessions}</tbody></table></div>`
}
</section>
</div>
<h2>Backoffs by cause</h2>
${
  causes.length === 0
    ? html`<p class="muted">No machine is backing off.</p>`
    : html`<div class="scroll"><table><thead><tr><th>process</th><th>cause</th><th class="num">machines</th><th>ends</th><th>e.g.</th></tr></thead><tbody>${causes}</tbody></table></div>`
}
<h2>Recent failures</h2>
${
  failures.length === 0
    ? html`<p class="muted">No failures recorded.</p>`
    : html`<div class="scroll"><table><thead><tr><th>when</th><th>machine</th><th>process</th><th>cause</th></tr></thead><tbody>${failures}</tbody></table></div>`
}
<h2>Retired</h2>
${
  o.retired === 0
    ? html`<p class="muted">No machine is retired.</p>`
    : html`<p>${o.retired.toLocaleString('en-US')} machine${o.retired === 1 ? '' : 's'} retired (decommissioned): the provisioner leaves ${o.retired === 1 ? 'it' : 'them'} out while the provider lists ${o.retired === 1 ? 'it' : 'them'}, until <code>shepherd recommission</code>${o.retired > retired.length ? html`; the latest ${retired.length}` : ''}</p>
<div class="scroll"><table class="retired"><thead><tr><th>provider</th><th>provider ID</th><th>was machine</th><th>retired</th><th>by</th><th>disks</th><th>reason</th></tr></thead><tbody>${retired}</tbody></table></div>`
}`;
}
