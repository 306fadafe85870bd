import { MACHINE_STAGES, type MachineFilter } from '@bmaas/bmdb-model';
import type { MachineList } from '../data.js';
import { type Html, href, html } from '../html.js';
import { relativeTime, timeTag } from '../time.js';
import {
  INSTALLATION_LABELS,
  installationBadge,
  POWER_LABELS,
  powerBadge,
  STAGE_LABELS,
  stageBadge,
} from './layout.js';

/** The query parameters of `/machines` for a filter (and a page start). */
export function filterQuery(filter: MachineFilter, after?: string): Record<string, string | undefined> {
  return {
    stage: filter.stage,
    provider: filter.provider,
    work: filter.liveWork,
    backoff: filter.inBackoff === true ? 'any' : filter.inBackoff,
    held: filter.held === undefined ? undefined : filter.held ? 'yes' : 'no',
    power: filter.powerState,
    installation: filter.installation,
    q: filter.search,
    after,
  };
}

/** `/machines`: the filter form, one page of the table, links to the next page. */
export function machinesPage(list: MachineList): Html {
  const f = list.filter;
  const option = (value: string, label: string, selected: boolean) =>
    html`<option value="${value}"${selected ? html` selected` : ''}>${label}</option>`;
  const form = html`<form class="filters" method="get" action="/machines">
<label>stage<select name="stage">${option('', 'any', f.stage === undefined)}${MACHINE_STAGES.map((stage) =>
    option(stage, STAGE_LABELS[stage], f.stage === stage),
  )}</select></label>
<label>provider<select name="provider">${option('', 'any', f.provider === undefined)}${list.providers.map((p) =>
    option(p, p, f.provider === p),
  )}</select></label>
<label>live work<select name="work">${option('', 'any', f.liveWork === undefined)}${list.processes.map((p) =>
    option(p, p, f.liveWork === p),
  )}</select></label>
<label>in backoff<select name="backoff">${option('', 'any', f.inBackoff === undefined)}${option(
    'any',
    'yes, any process',
    f.inBackoff === true,
  )}${list.processes.map((p) => option(p, p, f.inBackoff === p))}</select></label>
<label>held<select name="held">${option('', 'any', f.held === undefined)}${option('yes', 'held', f.held === true)}${option(
    'no',
    'not held',
    f.held === false,
  )}</select></label>
<label>power<select name="power">${option('', 'any', f.powerState === undefined)}${Object.entries(POWER_LABELS).map(
    ([state, label]) => option(state, label, f.powerState === state),
  )}</select></label>
<label>installation<select name="installation">${option('', 'any', f.installation === undefined)}${Object.entries(
    INSTALLATION_LABELS,
  ).map(([state, label]) => option(state, label, f.installation === state))}</select></label>
<label>machine or provider ID<input type="search" name="q" value="${f.search ?? ''}" placeholder="ID or its start"></label>
<button type="submit">Filter</button>
${Object.values(filterQuery(f)).some((v) => v !== undefined) ? html`<a href="/machines">clear</a>` : ''}
</form>`;

  const rows = list.machines.map(
    (m) => html`<tr>
<td><a class="id" href="/machines/${m.machineId}">${m.machineId}</a></td>
<td>${m.provided ? html`${m.provided.provider} <span class="id">${m.provided.providerId}</span>` : html`<span class="none">–</span>`}</td>
<td class="hide-narrow">${m.provided?.providerStatus ?? ''}</td>
<td class="hide-narrow">${m.provided?.providerLocation ?? ''}</td>
<td>${stageBadge(m.stage)}</td>
<td>${m.provided ? powerBadge(m.powerState, m.powerStateReadAt, list.now) : ''}</td>
<td>${installationBadge(m.installation)}</td>
<td>${
      m.hold
        ? html`<span class="held" title="held by ${m.hold.actor} since ${m.hold.since.toISOString()}">held</span> ${relativeTime(
            m.hold.since,
            list.now,
          ).replace(' ago', '')} · ${m.hold.actor}<div class="cause">${m.hold.reason}</div>`
        : ''
    }</td>
<td>${timeTag(m.lastHeartbeatAt, list.now)}</td>
<td>${m.liveWork.join(', ')}</td>
<td>${m.backoffs.length === 0 ? '' : html`${m.backoffs.join(', ')}<div class="cause">${m.backoffCause ?? ''}</div>`}</td>
</tr>`,
  );
  const table =
    rows.length === 0
      ? html`<p class="notice">No machine matches.</p>`
      : html`<div class="scroll"><table><thead><tr><th>machine</th><th>provider</th><th class="hide-narrow">status</th><th class="hide-narrow">location</th><th>stage</th><th>power</th><th>installation</th><th>hold</th><th>heartbeat</th><th>live work</th><th>backoff</th></tr></thead><tbody>${rows}</tbody></table></div>`;
  const pager = html`<div class="pager">
${f.after === undefined ? '' : html`<a href="${href('/machines', filterQuery(f))}">« first page</a>`}
${list.next === undefined ? '' : html`<a rel="next" href="${href('/machines', filterQuery(f, list.next))}">next page »</a>`}
</div>`;
  return html`<h1>Machines</h1>${form}${table}${pager}`;
}
