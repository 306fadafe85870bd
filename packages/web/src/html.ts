/**
 * HTML built by one tagged template, `html`, which escapes every value it is
 * given unless the value is itself `Html` built by it. Provider IDs, failure
 * causes and runtime infos come from outside the shepherd: nothing reaches a
 * page without passing through {@link escapeHtml}.
 */

/** Markup that is safe as it is: made by {@link html} (or {@link escapeHtml}). */
export class Html {
  /** @internal Only this module makes Html; everything else goes through `html`. */
  constructor(readonly value: string) {}
  toString(): string {
    return this.value;
  }
}

/** A value `html` accepts: text (escaped), markup, numbers, lists of these; nothing for null/undefined/false. */
export type HtmlValue = Html | string | number | boolean | null | undefined | readonly HtmlValue[];

const ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

/** Text as HTML: safe in element content and in quoted attribute values alike. */
export function escapeHtml(text: string): Html {
  return new Html(text.replace(/[&<>"']/g, (c) => ESCAPES[c] as string));
}

function render(value: HtmlValue): string {
  if (value instanceof Html) return value.value;
  if (value === null || value === undefined || value === false) return '';
  if (Array.isArray(value)) return value.map(render).join('');
  return escapeHtml(String(value)).value;
}

/** `html\`<td>${cause}</td>\``: the template's literal parts as they are, every value escaped. */
export function html(strings: TemplateStringsArray, ...values: HtmlValue[]): Html {
  let out = strings[0] ?? '';
  values.forEach((value, i) => {
    out += render(value) + (strings[i + 1] ?? '');
  });
  return new Html(out);
}

/** A URL path with query parameters, the values URL-encoded; unset ones left out. */
export function href(path: string, query: Record<string, string | undefined> = {}): string {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) if (value !== undefined && value !== '') params.set(key, value);
  const search = params.toString();
  return search ? `${path}?${search}` : path;
}
