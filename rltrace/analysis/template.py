# ruff: noqa: E501  (HTML template: long lines are markup)
"""The HTML report's jinja2 template: one self-contained page (inline CSS, plots as data URIs)."""

HTML = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rltrace report — {{ rep.logdir }}</title>
<style>
:root { --fg: #1d2330; --muted: #5b6475; --line: #dfe3ea; --accent: #3b6fd8; --bad: #c8372d; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       margin: 0; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .meta { color: #c5cbd6; font-size: 12.5px; }
nav { position: sticky; top: 0; background: #fff; border-bottom: 1px solid var(--line); padding: 8px 28px;
      z-index: 2; }
nav a { margin-right: 16px; color: var(--accent); text-decoration: none; font-weight: 600; font-size: 13px; }
main { padding: 8px 28px 40px; max-width: 1280px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 20px;
          margin: 16px 0; }
h2 { font-size: 17px; margin: 4px 0 8px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
p.explain { color: var(--muted); margin: 4px 0 10px; max-width: 980px; }
.findings li { margin: 4px 0; }
.findings .kind { display: inline-block; min-width: 74px; font-size: 11px; font-weight: 700;
                  text-transform: uppercase; color: var(--muted); }
.findings .straggler .kind, .findings .phase .kind, .findings .group .kind { color: var(--bad); }
section#groups h3 { font-size: 13.5px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 12.5px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px; text-align: right; white-space: nowrap; }
th { background: #f0f2f5; font-weight: 600; }
td.l, th.l { text-align: left; }
td.wrap { white-space: normal; overflow-wrap: anywhere; text-align: left; max-width: 520px; }
td.narrow { min-width: 150px; max-width: 230px; }
td.id { min-width: 9em; max-width: 12em; }
td.id code { word-break: break-all; }
tr.flag td { background: #fdecea; }
.scroll { overflow-x: auto; max-width: 100%; }
figure { margin: 10px 0 14px; }
figure img { max-width: 100%; border: 1px solid var(--line); border-radius: 4px; background: #fff; }
figcaption { color: var(--muted); font-size: 12.5px; }
.note { color: var(--muted); font-size: 12px; }
code { background: #f0f2f5; padding: 0 3px; border-radius: 3px; }
details summary { cursor: pointer; color: var(--accent); margin: 6px 0; }
</style>
</head>
<body>
<header>
  <h1>rltrace report</h1>
  <div class="meta">{{ rep.logdir }} · {{ rep.inputs.sessions }} sessions · {{ rep.inputs.ranks|length }} rank(s)
    · {{ rep.inputs.steps|length }} step(s) · {{ rep.inputs.trace_events }} trace events · steps {{ rep.options.steps }}
    · k = {{ rep.options.k }}{% if rep.inputs.skipped_lines or rep.inputs.skipped_fields %} · <b>{{ rep.inputs|skipped }}</b>{% endif %} · generated {{ rep.generated_at }}</div>
</header>
<nav>
  <a href="#findings">Findings</a><a href="#groups">1 Slow groups</a><a href="#longtail">2 Long tail</a>
  <a href="#stragglers">3 Stragglers</a><a href="#phases">4 Time breakdown</a><a href="#turns">5 Turns, tools, workers</a>
  <a href="#status">6 Status</a><a href="#summary">7 Run summary</a><a href="#inputs">Inputs</a>
</nav>
<main>
{% macro plot(key) -%}
{% if key in plots %}{% set p = plots[key] %}
<figure><img class="plot" data-plot="{{ key }}" alt="{{ p.title }}" src="{{ p.uri }}">
<figcaption><b>{{ p.title }}.</b> {{ p.caption }}</figcaption></figure>
{% endif %}
{%- endmacro %}
{% macro capped(rows) -%}{% if rows|length > max_rows %}<p class="note">first {{ max_rows }} of {{ rows|length }} rows; all rows are in the JSON report.</p>{% endif %}{%- endmacro %}

<section id="findings">
<h2>Findings</h2>
{% if rep.findings %}
<ul class="findings">
{% for f in rep.findings %}<li class="{{ f.kind }}"><span class="kind">{{ f.kind }}</span> {{ f.text }}</li>
{% endfor %}
</ul>
{% else %}<p class="note">Nothing to report.</p>{% endif %}
</section>

{% set U = u.groups %}
<section id="groups">
<h2>1. Slow groups: who held them</h2>
{% set gr = rep.groups %}
<p class="explain">A group is the sessions of one task on one rank and step (GRPO samples, finalized together,
so every sample's time until finalize carries its slowest sibling's). The session that finished its own work
last <b>held</b> the group; every other session's time after its own end is <i>group wait</i>, caused by it.
Group wait in all: {{ gr.total_group_wait_s|s(U) }} ({{ gr.group_wait_share|pct }} of session time). Each row of
a timeline is a session: its phases (t<i>n</i>: turn index), queue wait, gaps between phases and group wait.</p>
{% for g in gr.groups %}
<h3>rank {{ g.rank }} step {{ g.step|step }} task {{ g.task_id }}: {{ g.sessions }} sessions, {{ g.span_s|s(U) }} — held by session {{ g.holder.session_id }}: {{ g.holder|why(U) }}</h3>
{{ plot("group_" ~ loop.index) }}
<details{% if loop.first %} open{% endif %}><summary>Sessions of this group ({{ g.members|length }})</summary>
<div class="scroll"><table><tr><th class="l">session</th><th>status</th><th>own time ({{ U }})</th><th>until finalize ({{ U }})</th><th>group wait ({{ U }})</th><th class="l">slowest segment</th><th class="l">time by bucket (adds up to 100%)</th></tr>
{% for m in g.members %}<tr{% if m.held %} class="flag"{% endif %}><td class="l">{{ m.session_id }}{% if m.held %} <b>(held it)</b>{% endif %}</td><td>{{ m.status }}</td><td>{{ m.own_s|t(U) }}</td><td>{{ m.total_s|t(U) }}</td><td>{{ m.group_wait_s|t(U) }}</td><td class="wrap">{{ m|why(U) }}</td><td class="wrap">{{ m|shares }}</td></tr>
{% endfor %}</table></div></details>
{% else %}<p class="note">No group with two or more sessions.</p>{% endfor %}
</section>

{% set U = u.longtail %}
<section id="longtail">
<h2>2. Long tail</h2>
<p class="explain">Session completion (the end of its own last phase, not its group's finalize) is measured from the step's start on the session's rank (the
<code>{{ rep.options.rollout_scope }}</code> scope inside <code>{{ rep.options.step_scope }}</code>, else the step
scope, else the step's first submitted session). The tail fraction is the share of the step's rollout
(start to last session) spent after 80% of its sessions had finished. Percentiles (P50, P90, …), in
every table of this report: <span class="pdef">{{ definition }}</span>; <code>rltrace top</code> computes
them the same way from its live files' 19%-wide duration buckets.</p>
{% set o = rep.longtail.overall %}
<table><tr><th class="l">sessions</th><th>P50 ({{ U }})</th><th>P90 ({{ U }})</th><th>P99 ({{ U }})</th><th>P99.9 ({{ U }})</th><th>max ({{ U }})</th><th>waiting for last 20%</th></tr>
<tr><td class="l">{{ o.count }}</td><td>{{ o.p50_s|t(U) }}</td><td>{{ o.p90_s|t(U) }}</td><td>{{ o.p99_s|t(U) }}</td><td>{{ o.p999_s|t(U) }}</td><td>{{ o.max_s|t(U) }}</td><td>{{ o.tail_fraction|pct }}</td></tr></table>
{{ plot("cdf") }}
{{ plot("step_tail") }}
<h3>Slowest sessions (by their own time: submit to their last phase's end)</h3>
<div class="scroll"><table>
<tr><th class="l">session</th><th>status</th><th>own time ({{ U }})</th><th>until finalize ({{ U }})</th><th>completion ({{ U }})</th><th>turns</th><th class="l">slowest segment</th><th class="l">time by bucket</th><th class="l">trace id</th></tr>
{% for b in rep.longtail.slowest_sessions %}
<tr><td class="wrap narrow">{{ b|session }}</td><td>{{ b.status }}</td><td>{{ b.own_s|t(U) }}</td><td>{{ b.total_s|t(U) }}</td><td>{{ b.completion_s|t(U) }}</td><td>{{ b.turns }}</td>
<td class="wrap">{{ b|why(U) }}</td><td class="wrap">{{ b|shares }}</td><td class="wrap id"><code>{{ b.trace_id }}</code></td></tr>
{% endfor %}
</table></div>
<details><summary>Per step ({{ rep.longtail.per_step|length }})</summary>{{ capped(rep.longtail.per_step) }}
<div class="scroll"><table><tr><th>step</th><th>sessions</th><th>P50 ({{ U }})</th><th>P90 ({{ U }})</th><th>P99 ({{ U }})</th><th>P99.9 ({{ U }})</th><th>max ({{ U }})</th><th>waiting for last 20%</th><th class="l">start from</th></tr>
{% for r in rep.longtail.per_step[:max_rows] %}
<tr><td>{{ r.step|step }}</td><td>{{ r.count }}</td><td>{{ r.p50_s|t(U) }}</td><td>{{ r.p90_s|t(U) }}</td><td>{{ r.p99_s|t(U) }}</td><td>{{ r.p999_s|t(U) }}</td><td>{{ r.max_s|t(U) }}</td><td>{{ r.tail_fraction|pct }}</td><td class="l">{{ r.start_source }}</td></tr>
{% endfor %}</table></div></details>
</section>

{% set U = u.stragglers %}
<section id="stragglers">
<h2>3. Stragglers</h2>
{% set sg = rep.stragglers %}
<p class="explain">Rollout time per rank and step (the rollout scope, else last session finished minus step
start). Barrier wait = slowest − fastest rank of the step. An outlier is a (rank, step) above
median {{ sg.median_s|s(U) }} + {{ sg.k }} × MAD {{ sg.mad_s|s(U) }} = {{ sg.threshold_s|s(U) }}{% if sg.noise.excess_limit is not none %}
and slower than its step's fastest rank by more than the run's own noise: {{ sg.noise.excess_limit|pct }}
(median excess over the fastest {{ sg.noise.excess_median|pct }} + {{ sg.k }} × spread {{ sg.noise.excess_spread|pct }},
the spread 1.4826 × MAD over every rank and step){% endif %}.
Total barrier wait {{ sg.total_barrier_wait_s|s(U) }} ({{ sg.barrier_wait_share|pct }} of step time); idle rank
time {{ sg.total_idle_rank_s|s(U) }}.</p>
{% if sg.outliers %}
<h3>Outliers</h3>
<div class="scroll"><table><tr><th>step</th><th>rank</th><th>rollout ({{ U }})</th><th>median ({{ U }})</th><th>+MADs</th><th class="l">last sessions to finish (slow phase)</th></tr>
{% for o in sg.outliers[:max_rows] %}
<tr class="flag"><td>{{ o.step }}</td><td>{{ o.rank }}</td><td>{{ o.rollout_s|t(U) }}</td><td>{{ o.median_s|t(U) }}</td><td>{{ o.excess_mads|num }}</td>
<td class="wrap">{% for b in o.sessions %}{{ b|session }}: done at {{ b.completion_s|s(U) }}, {{ b|why(U) }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td></tr>
{% endfor %}</table></div>{{ capped(sg.outliers) }}
{% else %}<p class="note">No outlier (rank, step).</p>{% endif %}
{{ plot("stragglers") }}
<h3>Per rank</h3>
<table><tr><th>rank</th><th>steps</th><th>mean rollout ({{ U }})</th><th>median × fastest</th><th>slowest in steps</th><th>outlier steps</th></tr>
{% macro rank_row(r) %}<tr><td>{{ r.rank }}</td><td>{{ r.steps }}</td><td>{{ r.mean_rollout_s|t(U) }}</td><td>{{ r.median_ratio_to_fastest|x }}</td><td>{{ r.slowest_in_steps }}</td><td>{{ r.outlier_steps }}</td></tr>
{% endmacro %}{% for r in rank_rows.top %}{{ rank_row(r) }}{% endfor %}{% if rank_rows.more %}<tr><td class="l" colspan="6">{{ rank_rows.text }}</td></tr>
{% for r in rank_rows.bottom %}{{ rank_row(r) }}{% endfor %}{% endif %}</table>
<details><summary>Per step ({{ sg.per_step|length }})</summary>{{ capped(sg.per_step) }}
<div class="scroll"><table><tr><th>step</th><th>fastest rank</th><th>fastest ({{ U }})</th><th>slowest rank</th><th>slowest ({{ U }})</th><th>barrier wait ({{ U }})</th><th>slowest × fastest</th><th class="l">held by (slowest rank's last session)</th></tr>
{% for r in sg.per_step[:max_rows] %}<tr><td>{{ r.step }}</td>{% if r.slowest_s is not defined %}<td>–</td><td>–</td><td>–</td><td>–</td><td>–</td><td>–</td><td class="l">no rollout time on any rank</td></tr>{% else %}<td>{{ r.fastest_rank }}</td><td>{{ r.fastest_s|t(U) }}</td><td>{{ r.slowest_rank }}</td><td>{{ r.slowest_s|t(U) }}</td><td>{{ r.barrier_wait_s|t(U) }}</td><td>{{ r.slowest_over_fastest|x }}</td><td class="wrap">{% if r.held_by %}session {{ r.held_by.session_id }} (task {{ r.held_by.task_id }}): {{ r.held_by|why(U) }}{% else %}–{% endif %}</td></tr>{% endif %}
{% endfor %}</table></div></details>
</section>

{% set U = u.session_phases %}
<section id="phases">
<h2>4. Time breakdown</h2>
{% set ps = rep.phases.session %}
<p class="explain">Session time, split into queue wait (submit to first phase), each phase, the gaps between
phases (named by what precedes and follows), group wait (done, waiting for the slowest sibling) and the time
before finalize; the shares add up to 100%. Sessions overlap, so this is where a session's time goes, not wall
time. Train-side scopes: the <code>{{ rep.options.train_prefix }}*</code> scopes directly under each step (its
<code>{{ rep.options.step_scope }}</code> scope; without one, a step runs from the first <code>{{ rep.options.train_prefix }}*</code>
scope carrying its number to the next step's), as a share of step wall time summed over ranks; <i>untracked</i> is
step time in no <code>{{ rep.options.train_prefix }}*</code> scope (such as <code>train_batch(batch)</code> called
beside <code>trace_scope("train.rollout")</code>).</p>
<h3>Session time by bucket</h3>
<table><tr><th class="l">bucket</th><th class="l">kind</th><th>total ({{ U }})</th><th>share</th><th>sessions</th><th>mean ({{ U }})</th><th>P50 ({{ U }})</th><th>P99 ({{ U }})</th></tr>
{% for r in ps.overall %}<tr><td class="l">{{ r.phase }}</td><td class="l">{{ r.kind }}</td><td>{{ r.total_s|t(U) }}</td><td>{{ r.share|pct }}</td><td>{{ r.sessions }}</td><td>{{ r.mean_s|t(U) }}</td><td>{{ r.p50_s|t(U) }}</td><td>{{ r.p99_s|t(U) }}</td></tr>
{% endfor %}</table>
{% if ps.anomalies %}<table><tr><th>step</th><th class="l">phase</th><th>share</th><th>median share</th></tr>
{% for a in ps.anomalies[:max_rows] %}<tr class="flag"><td>{{ a.step|step }}</td><td class="l">{{ a.phase }}</td><td>{{ a.share|pct }}</td><td>{{ a.median_share|pct }}</td></tr>
{% endfor %}</table>{% endif %}
{{ plot("session_phases") }}
{% set U = u.train_phases %}
{% set tr = rep.phases.train %}
{% if tr.overall %}
<h3>Train-side scopes</h3>
<table><tr><th class="l">scope</th><th>total ({{ U }})</th><th>share of step time</th></tr>
{% for r in tr.overall %}<tr><td class="l">{{ r.scope }}</td><td>{{ r.total_s|t(U) }}</td><td>{{ r.share|pct }}</td></tr>
{% endfor %}</table>
{{ plot("train_phases") }}
{% endif %}
{% set U = u.session_phases %}
<details><summary>Session phase shares per step ({{ ps.per_step|length }})</summary>{{ capped(ps.per_step) }}
<div class="scroll"><table><tr><th>step</th><th>session time ({{ U }})</th>{% for p in ps.phases %}<th>{{ p }}</th>{% endfor %}</tr>
{% for r in ps.per_step[:max_rows] %}<tr><td>{{ r.step|step }}</td><td>{{ r.total_s|t(U) }}</td>{% for p in ps.phases %}<td>{{ r.share[p]|pct }}</td>{% endfor %}</tr>
{% endfor %}</table></div></details>
</section>

{% set U = u.turns %}
<section id="turns">
<h2>5. Turns, tools and workers</h2>
{% set tu = rep.turns %}
<p class="explain">Mean turns per session: {{ tu.mean_turns|num }}. Session time by turns is own time (to the
last phase's end). Time by turn index: mean per execution of each phase at that turn (× executions).</p>
<div class="scroll" style="display:flex; gap:28px; flex-wrap:wrap">
<table><tr><th>turns</th><th>sessions</th><th>fraction</th><th>mean session time ({{ U }})</th></tr>
{% for r in tu.session_time_by_turns %}<tr><td>{{ r.turns }}</td><td>{{ r.sessions }}</td><td>{{ tu.distribution[loop.index0].fraction|pct }}</td><td>{{ r.mean_s|t(U) }}</td></tr>
{% endfor %}</table>
{% set pbt = tu.phase_by_turn %}
<table><tr><th>turn index</th>{% for p in pbt.phases %}<th>{{ p }}</th>{% endfor %}</tr>
{% for r in pbt.rows[:max_rows] %}<tr><td>{{ r.turn }}</td>{% for p in pbt.phases %}<td>{% if p in r.mean_s %}{{ r.mean_s[p]|s(U) }} ×{{ r.executions[p] }}{% else %}–{% endif %}</td>{% endfor %}</tr>
{% endfor %}</table></div>
{{ plot("turns") }}
{% if tu.tools %}<h3>Tool calls by tool</h3>
<table><tr><th class="l">tool</th><th>calls</th><th>total ({{ U }})</th><th>mean ({{ U }})</th><th>P50 ({{ U }})</th><th>P99 ({{ U }})</th><th>max ({{ U }})</th></tr>
{% for t in tu.tools[:max_rows] %}<tr><td class="l">{{ t.tool }}</td><td>{{ t.calls }}</td><td>{{ t.total_s|t(U) }}</td><td>{{ t.mean_s|t(U) }}</td><td>{{ t.p50_s|t(U) }}</td><td>{{ t.p99_s|t(U) }}</td><td>{{ t.max_s|t(U) }}</td></tr>
{% endfor %}</table>{% endif %}
<details><summary>By worker (rank) and step ({{ tu.workers|length }})</summary>{{ capped(tu.workers) }}
<div class="scroll"><table><tr><th>rank</th><th>step</th><th>sessions</th><th>mean own time ({{ U }})</th><th>max own time ({{ U }})</th><th>mean generate ({{ U }})</th><th>group wait ({{ U }})</th></tr>
{% for w in tu.workers[:max_rows] %}<tr><td>{{ w.rank }}</td><td>{{ w.step|step }}</td><td>{{ w.sessions }}</td><td>{{ w.mean_own_s|t(U) }}</td><td>{{ w.max_own_s|t(U) }}</td><td>{{ w.mean_generate_s|t(U) }}</td><td>{{ w.group_wait_s|t(U) }}</td></tr>
{% endfor %}</table></div></details>
</section>

<section id="status">
<h2>6. Status and staleness</h2>
{% set st = rep.status %}
<p class="explain">Acceptance rate {{ st.acceptance_rate|pct }} over {{ st.sessions }} sessions.</p>
<div class="scroll" style="display:flex; gap:28px; flex-wrap:wrap">
<table><tr><th class="l">status</th><th>sessions</th></tr>
{% for k, v in st.counts.items() %}<tr><td class="l">{{ k }}</td><td>{{ v }}</td></tr>{% endfor %}</table>
<table><tr><th class="l">status</th><th class="l">reason</th><th>sessions</th><th>share of status</th></tr>
{% for r in st.reasons[:30] %}<tr><td class="l">{{ r.status }}</td><td class="wrap">{{ r.reason }}</td><td>{{ r.sessions }}</td><td>{{ r.share_of_status|pct }}</td></tr>{% endfor %}</table>
</div>
{{ plot("status") }}
{% if st.tasks.tasks %}
<h3>Acceptance per task ({{ st.tasks.tasks }} tasks, mean {{ st.tasks.mean_acceptance_rate|pct }}; all accepted {{ st.tasks.all_accepted }}, none accepted {{ st.tasks.none_accepted }})</h3>
<div class="scroll" style="display:flex; gap:28px; flex-wrap:wrap">
<table><tr><th>acceptance rate</th><th>tasks</th></tr>
{% for h in st.tasks.acceptance_histogram %}<tr><td>{{ h.from|pct }} – {{ h.to|pct }}</td><td>{{ h.tasks }}</td></tr>{% endfor %}</table>
<table><tr><th>rank</th><th class="l">task</th><th>sessions</th><th>accepted</th><th>rate</th></tr>
{% for t in st.tasks.lowest %}<tr><td>{{ t.rank }}</td><td class="l">{{ t.task_id }}</td><td>{{ t.sessions }}</td><td>{{ t.accepted }}</td><td>{{ t.acceptance_rate|pct }}</td></tr>{% endfor %}</table>
</div>
{% endif %}
<details><summary>Per step ({{ st.per_step|length }})</summary>{{ capped(st.per_step) }}
<table><tr><th>step</th><th>sessions</th><th class="l">by status</th><th>acceptance</th></tr>
{% for r in st.per_step[:max_rows] %}<tr><td>{{ r.step|step }}</td><td>{{ r.sessions }}</td><td class="l">{% for k, v in r.counts.items() %}{{ k }} {{ v }}{% if not loop.last %}, {% endif %}{% endfor %}</td><td>{{ r.acceptance_rate|pct }}</td></tr>
{% endfor %}</table></details>
</section>

{% set U = u.goodput %}
<section id="goodput">
<h2>Goodput: where the step time and the tokens went</h2>
{% set gp = rep.goodput %}
<p class="explain">Each rank's step time split into buckets that add up to 100%, each framework section
classified by the waste taxonomy (the sections table shows each one's class): <b>productive</b> (train compute,
and the generation, tool and reward time of samples trained on with a gradient), <b>overhead</b> (weight sync,
validation, checkpoints, data loading, mode switches, and step time outside any train.* scope), <b>idle</b>
(waiting on the batch or on weights; rollout time with no session phase running) and <b>wasted</b> (generation,
tool and reward time of rejected, failed and dropped samples, and of zero-advantage samples: their group's
rewards had zero spread). Busy rollout time is shared between productive and wasted in proportion to their
sessions' phase time.</p>
{% if gp.by_step %}
<div class="scroll"><table><tr><th class="l">step</th><th>wall ({{ U }})</th>{% for b in gp.buckets %}<th>{{ b }}</th>{% endfor %}<th>generated tokens/s</th><th>accepted tokens/s</th></tr>
<tr class="flag"><td class="l">all</td><td>–</td>{% for b in gp.buckets %}<td>{{ gp.share[b]|pct }}</td>{% endfor %}<td>{{ gp.tokens.per_s.generated|num }}</td><td>{{ gp.tokens.per_s.accepted|num }}</td></tr>
{% for r in gp.by_step[:max_rows] %}<tr><td class="l">{{ r.step|step }}</td><td>{{ r.wall_s|t(U) }}</td>{% for b in gp.buckets %}<td>{{ r.share[b]|pct }}</td>{% endfor %}<td>{{ r.tokens_per_s.generated|num }}</td><td>{{ r.tokens_per_s.accepted|num }}</td></tr>
{% endfor %}</table></div>{{ capped(gp.by_step) }}
{% if gp.by_role|length > 1 %}<h3>By role</h3>
<div class="scroll"><table><tr><th class="l">role</th>{% for b in gp.buckets %}<th>{{ b }}</th>{% endfor %}</tr>
{% for role, v in gp.by_role.items() %}<tr><td class="l">{{ role }}</td>{% for b in gp.buckets %}<td>{{ v.share[b]|pct }}</td>{% endfor %}</tr>
{% endfor %}</table></div>{% endif %}
{% if gp.sections %}<h3>Sections and their class</h3>
<div class="scroll"><table><tr><th class="l">section</th><th class="l">class</th><th>own time ({{ U }})</th></tr>
{% for r in gp.sections[:max_rows] %}<tr><td class="l">{{ r.section }}</td><td class="l">{{ r["class"] }}</td><td>{{ r.seconds|t(U) }}</td></tr>
{% endfor %}</table></div>{{ capped(gp.sections) }}{% endif %}
<p>Tokens: {{ gp.tokens.generated|num }} generated, {{ gp.tokens.accepted|num }} trained on with a gradient, {{ gp.tokens.wasted|num }} wasted ({{ gp.tokens.wasted_share|pct }}).</p>
{% for line in gp|waste %}<p>{{ line }}</p>
{% endfor %}{% set st = gp.staleness %}
{% if st.trained %}<p>Policy version lag of trained samples (train step's version minus the generating version): {% for lag, n in st.lag.items() %}{{ lag }}: {{ n }}{% if not loop.last %}, {% endif %}{% endfor %} (mean {{ st.mean_lag|num }}, max {{ st.max_lag }}).</p>{% else %}<p class="note">No policy versions recorded (rltrace.set_policy_version): staleness is shown by the rejection reasons only.</p>{% endif %}
{% if st.thrown_away %}<div class="scroll"><table><tr><th class="l">wasted</th><th class="l">reason</th><th>sessions</th><th>phase time ({{ U }})</th><th>tokens</th></tr>
{% for r in st.thrown_away[:max_rows] %}<tr><td class="l">{{ r.status }}</td><td class="l">{{ r.reason }}</td><td>{{ r.sessions }}</td><td>{{ r.seconds|t(U) }}</td><td>{{ r.tokens|num }}</td></tr>
{% endfor %}</table></div>{% endif %}
{% else %}<p class="note">No step time to account: the run has no rltrace.step scopes and no session records.</p>{% endif %}
</section>

{% set U = u.critical %}
<section id="critical">
<h2>Critical path</h2>
{% set cp = rep.critical_path %}
<p class="explain">Per step, its length (measured within each rank: ranks started apart are no step time) and the chain that set it on its longest rank: its top-level train scopes in
order, its rollout's link being the session that finished last (on another rank when the rank only trains), named by
its slow segment. (+x): how much shorter the step would have been with that link at its median.</p>
{% if cp.steps %}
<div class="scroll"><table><tr><th class="l">step</th><th>length ({{ U }})</th><th>set by</th><th class="l">chain</th><th>what if ({{ U }})</th></tr>
{% for s in cp.steps[:max_rows] %}<tr><td class="l">{{ s.step|step }}</td><td>{{ s.length_s|t(U) }}</td><td>rank {{ s.ended_by_rank }}</td><td class="l wrap">{{ s|chain(U) }}</td><td>{{ s.what_if_s|t(U) }}</td></tr>
{% endfor %}</table></div>{{ capped(cp.steps) }}
{% if cp.top_links %}<p>Links that cost most over the run:</p><ul>{% for t in cp.top_links %}<li>{{ t|link }}: {{ t.what_if_s|s(U) }} over {{ t.steps }} step(s)</li>{% endfor %}</ul>{% endif %}
{% else %}<p class="note">No rltrace.step scopes: no step to follow.</p>{% endif %}
</section>

{% set U = u.summary %}
<section id="summary">
<h2>7. Run summary</h2>
{% set sm = rep.summary %}
<p class="explain">Every scope name in the trace files. Wall time {{ sm.wall_total_s|s(U) }} summed over ranks
({% if many.wall %}{{ many.wall }}{% else %}{% for r, w in sm.wall_s.items() %}rank {{ r }} {{ w|s(U) }}{% if not loop.last %}, {% endif %}{% endfor %}{% endif %}); concurrent
scopes can exceed 100%.</p>
<div class="scroll"><table><tr><th class="l">scope</th><th>count</th><th>total ({{ U }})</th><th>mean ({{ U }})</th><th>P50 ({{ U }})</th><th>P99 ({{ U }})</th><th>max ({{ U }})</th><th>wall share</th></tr>
{% for r in sm.scopes[:max_rows] %}<tr><td class="l">{{ r.name }}</td><td>{{ r.count }}</td><td>{{ r.total_s|t(U) }}</td><td>{{ r.mean_s|t(U) }}</td><td>{{ r.p50_s|t(U) }}</td><td>{{ r.p99_s|t(U) }}</td><td>{{ r.max_s|t(U) }}</td><td>{{ r.wall_share|pct }}</td></tr>
{% endfor %}</table></div>{{ capped(sm.scopes) }}
{% if sm.counters %}
<h3>Counters</h3>
<table><tr><th class="l">counter</th><th>total</th><th>per second</th><th class="l">per rank (total, /s)</th></tr>
{% for c in sm.counters %}<tr><td class="l">{{ c.name }}</td><td>{{ c.total|num }}</td><td>{{ c.rate_per_s|num }}</td>
<td class="l">{% if c.name in many.counters %}{{ many.counters[c.name] }}{% else %}{% for r, v in c.per_rank.items() %}rank {{ r }}: {{ v.total|num }}, {{ v.rate_per_s|num }}/s{% if not loop.last %}; {% endif %}{% endfor %}{% endif %}</td></tr>
{% endfor %}</table>
{% endif %}
{{ plot("scopes") }}
</section>

<section id="inputs">
<h2>Inputs</h2>
<p class="note">{{ rep.inputs.session_files|length }} session file(s), {{ rep.inputs.trace_files|length }} trace file(s);
{{ rep.inputs.sessions_outside_steps }} session(s) outside the selected steps; {{ rep.inputs.sessions_step_from_scopes }} session(s)
without a step took theirs from the trace scopes' <code>global_step</code>.</p>
{% if rep.inputs.skipped_lines or rep.inputs.skipped_fields %}<p class="note">{{ rep.inputs|skipped }}:</p>
<ul class="note">{% for m in rep.inputs.skipped %}<li>{{ m }}</li>{% endfor %}</ul>{% endif %}
</section>
</main>
<script>
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img.plot"), ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    var img = imgs[i];
    if (img.complete && img.naturalWidth > 0) { img.setAttribute("data-decoded", "1"); ok++; }
    else { console.error("rltrace report: plot did not load: " + img.getAttribute("data-plot")); }
  }
  document.body.setAttribute("data-plots-decoded", ok + "/" + imgs.length);
});
</script>
</body>
</html>
"""


#: ``rltrace diff -o diff.html``: the comparison of two runs, one table
DIFF_HTML = """<!doctype html><html><head><meta charset="utf-8"><title>rltrace diff</title>
<style>body{font:14px system-ui,sans-serif;margin:24px;max-width:1200px}table{border-collapse:collapse}
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}td.l,th.l{text-align:left}
tr.changed td{background:#fdecea}p.note{color:#666}</style></head><body>
<h1>rltrace diff</h1><p>A = {{ d.a }} ({{ d.a_steps }} steps) · B = {{ d.b }} ({{ d.b_steps }} steps)</p>
<p>A quantity changed when its difference is more than {{ d.z }} standard errors of the runs' own
step-to-step spread and more than {{ (d.min_share * 100)|round(1) }}% of A's step time.</p>
<table><tr><th class="l">quantity</th><th>A (mean per step)</th><th>B</th><th>B - A</th><th>relative</th><th>noise (s.e.)</th><th>changed</th></tr>
{% for r in rows %}<tr{% if r.changed %} class="changed"{% endif %}><td class="l">{{ r.quantity }}</td><td>{{ r.a_mean_s|s }}</td><td>{{ r.b_mean_s|s }}</td><td>{{ r.delta_s|s }}</td><td>{{ r.delta_rel|pct }}</td><td>{{ r.noise_s|s }}</td><td>{{ "yes" if r.changed else "–" }}</td></tr>
{% endfor %}</table>
{% if d.only_in_one %}<p class="note">Only in one run: {{ d.only_in_one|join(", ") }}</p>{% endif %}
</body></html>
"""
