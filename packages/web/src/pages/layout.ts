import type { OSInstallationState, PowerState } from '@bmaas/bmdb-model';
import { type Html, href, html } from '../html.js';
import { absoluteTime, relativeTime } from '../time.js';

/** What every page's frame needs besides its content. */
export interface Frame {
  readonly title: string;
  /** The request's path and query, for the refresh toggle to come back to. */
  readonly path: string;
  /** Which nav entry is current. */
  readonly section: 'overview' | 'machines' | 'machine' | 'login';
  /** Seconds between refreshes; undefined when off. */
  readonly refreshSeconds: number | undefined;
  /** The database's time the page shows. */
  readonly now?: Date | undefined;
  /** Whether the header offers a logout (the page is behind a token). */
  readonly loggedIn?: boolean;
}

/** A whole HTML document: header with navigation and search, the content, a footer. */
export function layout(frame: Frame, content: Html): Html {
  const nav = (section: Frame['section'], path: string, label: string) =>
    html`<a href="${path}"${frame.section === section ? html` class="current" aria-current="page"` : ''}>${label}</a>`;
  const refresh =
    frame.section === 'login'
      ? ''
      : frame.refreshSeconds === undefined
        ? html`<a class="refresh" href="${href('/refresh', { set: 'on', back: frame.path })}">auto refresh off · turn on</a>`
        : html`<a class="refresh" href="${href('/refresh', { set: 'off', back: frame.path })}">refreshes every ${frame.refreshSeconds} s · turn off</a>`;
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
${frame.refreshSeconds === undefined ? '' : html`<meta http-equiv="refresh" content="${frame.refreshSeconds}">`}
<title>${frame.title} · shepherd</title>
<link rel="stylesheet" href="/style.css">
</head>
<body>
<header>
<a class="brand" href="/">shepherd fleet</a>
<nav>${nav('overview', '/', 'Overview')}${nav('machines', '/machines', 'Machines')}</nav>
${refresh}
${frame.loggedIn ? html`<a class="refresh" href="/logout">log out</a>` : ''}
${
  frame.section === 'login'
    ? ''
    : html`<form method="get" action="/machines" role="search">
<input type="search" name="q" placeholder="machine or provider ID" aria-label="machine or provider ID">
<button type="submit">Find</button>
</form>`
}
</header>
<main>
${content}
</main>
<footer>read-only view of the BMDB${frame.now ? html` · as of <time datetime="${frame.now.toISOString()}">${absoluteTime(frame.now)}</time>` : ''}</footer>
</body>
</html>
`;
}

/** Human names of the lifecycle stages. */
export const STAGE_LABELS = {
  unprovided: 'not provided',
  provided: 'provided',
  agentStarting: 'agent starting',
  agentStarted: 'agent started',
  heartbeating: 'heartbeating',
  awaitingRecovery: 'awaiting recovery',
  installed: 'installed',
} as const;

export function stageBadge(stage: keyof typeof STAGE_LABELS): Html {
  return html`<span class="stage stage-${stage}">${STAGE_LABELS[stage]}</span>`;
}

/** A message page's content (not found, bad request, database trouble). */
export function notice(title: string, message: string, kind: 'info' | 'error' = 'info'): Html {
  return html`<h1>${title}</h1><p class="notice${kind === 'error' ? ' error' : ''}">${message}</p>`;
}

/** Human names of the power states, and of a machine never read, as the `power` filter offers them. */
export const POWER_LABELS: Readonly<Record<PowerState | 'Unread', string>> = {
  On: 'on',
  Off: 'off',
  PoweringOn: 'powering on',
  PoweringOff: 'powering off',
  Unknown: 'unknown',
  Unread: 'not read yet',
};

/** A machine's power state, with when it was read on hover. */
export function powerBadge(state: PowerState | null, readAt: Date | null, now: Date): Html {
  const label = POWER_LABELS[state ?? 'Unread'];
  const read = readAt === null ? 'never read' : `read ${relativeTime(readAt, now)}, ${absoluteTime(readAt)}`;
  return html`<span class="power power-${state ?? 'Unread'}" title="${read}">${label}</span>`;
}

/** Human names of the OS installation states, as the `installation` filter offers them. */
export const INSTALLATION_LABELS: Readonly<Record<OSInstallationState, string>> = {
  Requested: 'requested',
  Delivered: 'delivered, installing',
  Succeeded: 'installed',
  Failed: 'failed',
  Canceled: 'canceled',
};

/** A machine's OS installation state with its generation. */
export function installationBadge(installation: { state: OSInstallationState; generation: bigint } | null): Html {
  if (installation === null) return html``;
  return html`<span class="install install-${installation.state}" title="generation ${String(installation.generation)}">${INSTALLATION_LABELS[installation.state]}</span> <span class="muted">gen ${String(installation.generation)}</span>`;
}
