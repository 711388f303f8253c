"""The qosflow view as one HTML page: no script, inline style, every XCom value escaped.

XCom values are data anyone allowed to write XComs could have set, so every one goes through
:func:`html.escape`, and the app serves the page with a Content-Security-Policy that allows no
script at all (:data:`CSP`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import quote

from qosflow_airflow.plugin.view import Decision, JobView, Progress, seconds

CSP = (
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
"""The page's Content-Security-Policy: its own images and inline style, nothing else."""
STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px;color:#1f2933}
h1{font-size:18px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
h3{font-size:14px;margin:16px 0 6px;color:#52606d}
.sub{color:#616e7c;margin-bottom:12px} .job{border:1px solid #d9e2ec;border-radius:8px;
padding:12px 16px;margin:14px 0} table{border-collapse:collapse;width:100%;margin:4px 0}
th,td{border-bottom:1px solid #e4e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f7fa;font-weight:600} td.n{text-align:right;white-space:nowrap}
td.w{white-space:nowrap}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;color:#fff}
.met{background:#2f9e44} .missed,.failed{background:#c92a2a} .running{background:#1c7ed6}
.other{background:#868e96} .behind{color:#c92a2a} .ahead{color:#2f9e44}
img.report{max-width:100%;border:1px solid #d9e2ec;border-radius:6px;margin-top:6px}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:4px 0}
dt{color:#616e7c} dd{margin:0}
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _when(t: float | None) -> str:
    if t is None:
        return "—"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _t(t: float | None) -> str:
    return "—" if t is None else f"t+{seconds(t)}"


def page(dag_id: str, run_id: str, run_state: str, jobs: Sequence[JobView]) -> str:
    """The whole page for a run's jobs."""
    body = "".join(_job(job, run_id) for job in jobs) or (
        "<p>This run has no qosflow training job (no <code>deadline_training</code> group).</p>"
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>qosflow: {_e(dag_id)} / {_e(run_id)}</title><style>{STYLE}</style></head><body>"
        f"<h1>qosflow: deadline training</h1><div class='sub'>DAG <b>{_e(dag_id)}</b>, run "
        f"<b>{_e(run_id)}</b> ({_e(run_state)})</div>{body}</body></html>"
    )


def _job(job: JobView, run_id: str) -> str:
    verdict = job.verdict
    css = verdict if verdict in ("met", "missed", "failed", "running") else "other"
    return (
        f"<section class='job' id='job-{_e(job.group)}'><h2>{_e(job.job)} "
        f"<span class='badge {css}' data-verdict='{_e(verdict)}'>{_e(verdict)}</span></h2>"
        f"<div class='sub'>task group <code>{_e(job.group)}</code></div>"
        f"{_verdict(job)}{_plan(job)}{_progress(job)}{_decisions(job)}{_image(job, run_id)}"
        "</section>"
    )


def _verdict(job: JobView) -> str:
    f = job.finish
    if not f:
        return "<h3>Verdict</h3><p id='verdict'>not decided yet: the job has not finished.</p>"
    late, margin = f.get("lateness_s"), f.get("margin_s")
    if job.verdict == "met":
        words = f"deadline met, {seconds(margin)} early" if margin is not None else "finished"
    elif job.verdict == "missed":
        words = f"deadline missed, {seconds(late)} late"
    else:
        words = str(f.get("verdict", "failed"))
    return (
        f"<h3>Verdict</h3><p id='verdict'><b>{_e(words)}</b></p><dl>"
        f"<dt>deadline</dt><dd>{_e(_when(f.get('deadline') or job.deadline))}</dd>"
        f"<dt>finished</dt><dd>{_e(_when(f.get('finished_at')))}</dd>"
        f"<dt>lateness</dt><dd data-lateness='{_e(late)}'>{_e(_signed(late))}</dd>"
        f"<dt>margin</dt><dd data-margin='{_e(margin)}'>{_e(_signed(margin))}</dd></dl>"
    )


def _signed(value: object) -> str:
    if not isinstance(value, int | float):
        return "—"
    return f"{'-' if value < 0 else ''}{seconds(float(value))}"


def _plan(job: JobView) -> str:
    p = job.plan
    if not p:
        state = job.states.get("plan") or "not run"
        return f"<h3>Plan</h3><p>The plan step pushed no plan ({_e(state)}): see its log.</p>"
    offer = p.get("counter_offer")
    rows = [
        ("verdict", p.get("verdict")),
        ("size", f"{p.get('units')} {job.unit}"),
        ("priority", f"{p.get('priority_class')} (spec.priority {p.get('priority')})"),
        ("deadline", _when(job.deadline)),
        ("steps", job.total_steps),
        ("planned at", _when(p.get("planned_at"))),
        ("reason", p.get("reason")),
    ]
    if offer:
        rows.append(("counter-offer", f"earliest deadline it could guarantee: {_when(offer)}"))
    items = "".join(f"<dt>{_e(k)}</dt><dd class='plan-{_e(k)}'>{_e(v)}</dd>" for k, v in rows)
    return f"<h3>Plan</h3><dl id='plan'>{items}</dl>"


def _progress(job: JobView) -> str:
    if not job.progress:
        return "<h3>Progress against the plan</h3><p>No progress observed yet.</p>"
    rows = "".join(_progress_row(p, job) for p in job.progress)
    return (
        "<h3>Progress against the plan</h3><table id='progress'><tr><th>round</th><th>when</th>"
        f"<th>steps done</th><th>planned by then</th><th>against the plan</th><th>size</th></tr>"
        f"{rows}</table>"
    )


def _progress_row(p: Progress, job: JobView) -> str:
    delta = p.delta
    if delta is None:
        where = "<td>no planned schedule (speed unknown at planning)</td>"
    elif delta == 0:
        where = "<td class='ahead'>on the planned schedule</td>"
    else:
        css, word = ("ahead", "ahead by") if delta > 0 else ("behind", "behind by")
        where = f"<td class='{css}'>{word} {abs(delta)} steps</td>"
    total = job.total_steps
    done = f"{p.steps} / {total}" if total else str(p.steps)
    planned = "—" if p.planned is None else str(p.planned)
    return (
        f"<tr><td class='n'>{p.round}</td><td class='w'>{_e(_t(p.t))}</td><td class='n'>{_e(done)}</td>"
        f"<td class='n'>{_e(planned)}</td>{where}<td class='n'>{p.units} {_e(job.unit)}</td></tr>"
    )


def _decisions(job: JobView) -> str:
    if not job.decisions:
        return "<h3>Decisions</h3><p>No decision yet (a round fires only on an action).</p>"
    rows = "".join(_decision_row(d, job.unit) for d in job.decisions)
    return (
        "<h3>Decisions</h3><table id='decisions'><tr><th>round</th><th>when</th>"
        "<th>decided</th><th>size</th><th>reason</th><th>action taken</th></tr>"
        f"{rows}</table>"
    )


def _decision_row(d: Decision, unit: str) -> str:
    size = f"{'?' if d.before is None else d.before} → {'?' if d.units is None else d.units} {unit}"
    when = "after the rounds" if d.round == 0 else str(d.round)
    taken = d.taken + (f": {d.outcome}" if d.outcome and d.outcome != d.reason else "")
    return (
        f"<tr class='decision'><td>{_e(when)}</td><td class='w'>{_e(_t(d.t))}</td>"
        f"<td class='action'>{_e(d.action)}</td><td class='w'>{_e(size)}</td>"
        f"<td class='reason'>{_e(d.reason)}</td><td class='taken'>{_e(taken)}</td></tr>"
    )


def _image(job: JobView, run_id: str) -> str:
    if not job.finish.get("report_url"):
        return "<h3>Report</h3><p>The report is written when the job ends.</p>"
    src = f"{quote(run_id, safe='')}/report.png?group={quote(job.group, safe='')}"
    return (
        f"<h3>Report</h3><img class='report' src='{_e(src)}' alt='qosflow report of {_e(job.job)}'>"
    )
