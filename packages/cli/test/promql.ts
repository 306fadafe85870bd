/**
 * The metric names a PromQL expression (or a Grafana query) selects, for
 * checking alert rules and dashboards against what the processes export.
 * Not a parser: strings, label matchers, ranges, label lists of `by`,
 * `without`, `on`, `ignoring` and `group_*`, numbers and Grafana variables
 * are taken out; what remains is function names (an identifier before `(`),
 * keywords, and metric names.
 */
export function metricNames(expression: string): Set<string> {
  // Grafana's `label_values(metric{…}, label)`: the metric is its first argument.
  const labelValues = /label_values\(\s*([^,)]*)(?:,[^)]*)?\)/g;
  let text = expression.replace(labelValues, (_, selector: string) => ` ${selector} `);
  text = text
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, ' ')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
    .replace(/\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/g, ' ');
  const names = new Set<string>();
  const identifier = /[A-Za-z_:][A-Za-z0-9_:]*/g;
  for (let match = identifier.exec(text); match !== null; match = identifier.exec(text)) {
    const name = match[0];
    const before = text[match.index - 1] ?? ' ';
    // Part of a number (1e3, 0x1f) or a duration (5m, 1h30m).
    if (/[0-9.]/.test(before)) continue;
    if (KEYWORDS.has(name.toLowerCase())) continue;
    if (/^\s*\(/.test(text.slice(match.index + name.length))) continue;
    names.add(name);
  }
  return names;
}

const KEYWORDS = new Set([
  'and',
  'or',
  'unless',
  'by',
  'without',
  'on',
  'ignoring',
  'group_left',
  'group_right',
  'bool',
  'offset',
  'atan2',
  'inf',
  'nan',
]);
