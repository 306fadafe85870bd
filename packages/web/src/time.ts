import { type Html, html } from './html.js';

/** `3 min ago`, `in 12 s`: how far `date` is from `now`, coarsely. */
export function relativeTime(date: Date, now: Date): string {
  const ms = date.getTime() - now.getTime();
  const abs = Math.abs(ms);
  let text: string;
  if (abs < 1000) return 'now';
  if (abs < 60_000) text = `${Math.floor(abs / 1000)} s`;
  else if (abs < 3_600_000) text = `${Math.floor(abs / 60_000)} min`;
  else if (abs < 86_400_000) text = `${Math.floor(abs / 3_600_000)} h`;
  else text = `${Math.floor(abs / 86_400_000)} d`;
  return ms < 0 ? `${text} ago` : `in ${text}`;
}

/** `2026-11-23 10:12:03 UTC`. */
export function absoluteTime(date: Date): string {
  return `${date.toISOString().slice(0, 19).replace('T', ' ')} UTC`;
}

/** A `<time>` showing the relative time, the absolute one on hover. */
export function timeTag(date: Date | null | undefined, now: Date): Html {
  if (!date) return html`<span class="none">–</span>`;
  return html`<time datetime="${date.toISOString()}" title="${absoluteTime(date)}">${relativeTime(date, now)}</time>`;
}
