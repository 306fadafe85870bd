/** The page's one stylesheet, served as /style.css (the CSP allows no inline styles). */
export const STYLESHEET = `
:root { color-scheme: light dark; --fg: #1b1f24; --muted: #5b6470; --bg: #ffffff; --panel: #f5f7f9; --line: #d9dee3;
  --accent: #1f6feb; --ok: #1a7f37; --warn: #9a6700; --bad: #cf222e; --bar: #1f6feb; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6edf3; --muted: #9aa5b1; --bg: #0d1117; --panel: #161b22; --line: #30363d; --accent: #58a6ff;
    --ok: #3fb950; --warn: #d29922; --bad: #f85149; --bar: #58a6ff; }
}
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
header { display: flex; flex-wrap: wrap; gap: .5rem 1.25rem; align-items: center; padding: .6rem 1rem;
  border-bottom: 1px solid var(--line); background: var(--panel); }
header .brand { font-weight: 700; color: var(--fg); }
header nav { display: flex; gap: 1rem; }
header nav a.current { font-weight: 600; color: var(--fg); }
header form { margin-left: auto; display: flex; gap: .4rem; }
header .refresh { font-size: .85rem; color: var(--muted); }
main { padding: 1rem; max-width: 1400px; margin: 0 auto; }
h1 { font-size: 1.35rem; margin: .2rem 0 1rem; word-break: break-all; }
h2 { font-size: 1.05rem; margin: 1.6rem 0 .6rem; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 28rem), 1fr)); gap: 0 2rem; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; }
table { border-collapse: collapse; width: 100%; font-size: .92rem; }
th, td { text-align: left; padding: .35rem .6rem .35rem 0; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .86rem; word-break: break-all; }
.cause { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .84rem; white-space: pre-wrap;
  word-break: break-word; max-width: 48rem; }
td.cause { min-width: 16rem; }
pre.agent-log { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .8rem; white-space: pre-wrap;
  word-break: break-word; max-height: 32rem; overflow: auto; border: 1px solid var(--line); padding: .5rem; }
time { white-space: nowrap; }
h1 .id { font-size: 1.15rem; }
.none, .muted { color: var(--muted); }
.stage { display: inline-block; padding: 0 .45rem; border-radius: 1rem; font-size: .8rem; white-space: nowrap;
  border: 1px solid var(--line); }
.stage-heartbeating { color: var(--ok); border-color: var(--ok); }
.stage-awaitingRecovery, .ev-Failed { color: var(--bad); border-color: var(--bad); }
.stage-agentStarting, .stage-agentStarted, .ev-Canceled { color: var(--warn); border-color: var(--warn); }
.ev-Finished { color: var(--ok); }
.power { display: inline-block; padding: 0 .45rem; border-radius: 1rem; font-size: .8rem; white-space: nowrap;
  border: 1px solid var(--line); color: var(--muted); }
.power-On { color: var(--ok); border-color: var(--ok); }
.power-Off { color: var(--bad); border-color: var(--bad); }
.power-PoweringOn, .power-PoweringOff { color: var(--warn); border-color: var(--warn); }
.install { display: inline-block; padding: 0 .45rem; border-radius: 1rem; font-size: .8rem; white-space: nowrap;
  border: 1px solid var(--line); }
.install-Succeeded, .stage-installed { color: var(--ok); border-color: var(--ok); }
.install-Failed { color: var(--bad); border-color: var(--bad); }
.install-Requested, .install-Delivered { color: var(--warn); border-color: var(--warn); }
.first-boot { display: inline-block; padding: 0 .45rem; border-radius: 1rem; font-size: .8rem; white-space: nowrap;
  border: 1px solid var(--line); }
.first-boot-booted { color: var(--ok); border-color: var(--ok); }
.first-boot-installed-not-booted { color: var(--bad); border-color: var(--bad); }
.first-boot-booting { color: var(--warn); border-color: var(--warn); }
.held { display: inline-block; padding: 0 .45rem; border-radius: 1rem; font-size: .8rem; font-weight: 600;
  color: var(--warn); border: 1px solid var(--warn); }
.ev-Succeeded { color: var(--ok); }
.ev-Refused { color: var(--warn); }
.chart td { border: 0; padding: .15rem .6rem .15rem 0; white-space: nowrap; }
.chart td.bar { width: 100%; }
.chart svg { display: block; width: 100%; height: 1.1rem; }
.chart rect.track { fill: var(--panel); }
.chart rect.fill { fill: var(--bar); }
.chart .stage-awaitingRecovery rect.fill { fill: var(--bad); }
.chart .stage-heartbeating rect.fill { fill: var(--ok); }
.chart .stage-agentStarting rect.fill, .chart .stage-agentStarted rect.fill { fill: var(--warn); }
form.filters { display: flex; flex-wrap: wrap; gap: .6rem 1rem; align-items: end; margin-bottom: 1rem; }
form.filters label { display: flex; flex-direction: column; font-size: .8rem; color: var(--muted); gap: .15rem; }
input, select, button { font: inherit; font-size: .92rem; padding: .3rem .45rem; border: 1px solid var(--line);
  border-radius: .35rem; background: var(--bg); color: var(--fg); }
button { background: var(--accent); color: #fff; border-color: var(--accent); cursor: pointer; }
.pager { display: flex; gap: 1.5rem; margin-top: 1rem; }
dl.tags { display: grid; grid-template-columns: max-content 1fr; gap: .3rem 1.2rem; margin: 0; }
dl.tags dt { color: var(--muted); }
dl.tags dd { margin: 0; word-break: break-word; }
ol.timeline { list-style: none; padding: 0; margin: 0; border-left: 2px solid var(--line); }
ol.timeline li { position: relative; padding: .25rem 0 .45rem 1rem; }
ol.timeline li::before { content: ""; position: absolute; left: -6px; top: .65rem; width: 10px; height: 10px;
  border-radius: 50%; background: var(--muted); }
ol.timeline li.ev-Started::before { background: var(--accent); }
ol.timeline li.ev-Finished::before { background: var(--ok); }
ol.timeline li.ev-Failed::before { background: var(--bad); }
ol.timeline li.ev-Canceled::before, ol.timeline li.ev-Refused::before { background: var(--warn); }
ol.timeline li.ev-Succeeded::before { background: var(--ok); }
ol.timeline .event { font-weight: 600; }
.notice { padding: .6rem .8rem; border: 1px solid var(--line); border-radius: .4rem; background: var(--panel); }
.error { border-color: var(--bad); color: var(--bad); }
footer { padding: 1rem; color: var(--muted); font-size: .8rem; text-align: center; }
@media (max-width: 640px) {
  header form { margin-left: 0; width: 100%; }
  header form input { flex: 1; }
  main { padding: .75rem; }
  .hide-narrow { display: none; }
}
`;
