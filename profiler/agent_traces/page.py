"""One self-contained HTML page (no network) showing agent traces as timelines.

Server-side rendered: every entry is in the HTML, so the page reads without JavaScript; a small
script adds the search box (filters entries, opens the folded parts that match) and counts.
Conversations repeat their whole history on every request, so an ``llm_request`` shows only the
messages new since the previous request, the rest folded, and folds too the new ones the page
already showed (the previous response, tool results shown as ``tool_call`` entries). Long contents are folded too. A
response's tool calls link to the ``tool_call`` entries that ran them (the following ones, by
tool name, in order) and back.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Optional

from fi_profile.agent_traces.load import LoadedTrace
from fi_profile.agent_traces.results import SolutionSummary, named_in
from fi_profile.schema.agent_trace import LLMRequestEntry, Message, ToolCallEntry

FOLD_CHARS, FOLD_LINES = 800, 16


def render_page(traces: list[LoadedTrace], solutions: Optional[dict[str, SolutionSummary]] = None) -> str:
    solutions = solutions or {}
    sections = "\n".join(_trace(i, t, solutions) for i, t in enumerate(traces))
    total = sum(len(t.trace.root) for t in traces)
    return _PAGE.format(style=_STYLE, script=_SCRIPT, sections=sections, total=total, traces=len(traces))


def _trace(t: int, loaded: LoadedTrace, solutions: dict[str, SolutionSummary]) -> str:
    entries = loaded.trace.root
    models = sorted({e.model for e in entries if isinstance(e, LLMRequestEntry)})
    annotations = sorted({e.annotation for e in entries if isinstance(e, LLMRequestEntry) and e.annotation})
    links = _tool_links(entries)
    back = {target: source for source, targets in links.items() for target in targets}
    items, seen, shown = [], 0, set()
    for i, entry in enumerate(entries):
        anchor = f"t{t}-e{i}"
        if isinstance(entry, LLMRequestEntry):
            body = _llm_request(entry, seen, shown, [f"t{t}-e{j}" for j in links.get(i, [])])
            seen = len(entry.conversation)
            shown.update(_said(c.message) for c in entry.response.choices)
            kind, title = "llm", f"LLM request · {escape(entry.model)}" + (f" · <i>{escape(entry.annotation)}</i>" if entry.annotation else "")
        elif isinstance(entry, ToolCallEntry):
            shown.add(("tool", entry.result))
            caller = f' <a class="link" href="#t{t}-e{back[i]}">← called in #{back[i]}</a>' if i in back else ""
            body = _tool_call(entry)
            kind, title = "tool", f"tool call · <b>{escape(entry.tool_name)}</b>{caller}"
        else:
            body = _block("entry", json.dumps(entry.model_dump(mode="json"), indent=2))
            kind, title = "mcp", "MCP"
        body += _solutions(_entry_text(entry), solutions)
        items.append(f'<li class="entry {kind}" id="{anchor}"><div class="head"><span class="n">#{i}</span> {title}</div>{body}</li>')
    meta = f"{escape(loaded.form)} · {len(entries)} entries · models: {escape(', '.join(models) or '—')}"
    if annotations:
        meta += f" · annotations: {escape(', '.join(annotations))}"
    return (f'<section class="trace" id="t{t}"><h2>{escape(loaded.path.name)}</h2><p class="meta">{meta}</p>'
            f'<ol class="timeline">{"".join(items)}</ol></section>')


def _tool_links(entries: list[Any]) -> dict[int, list[int]]:
    """llm_request index -> indices of the tool_call entries after it that ran its tool calls."""
    links: dict[int, list[int]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, LLMRequestEntry):
            continue
        wanted = [c.function.name for c in (entry.response.choices[0].message.tool_calls or [])]
        for j in range(i + 1, len(entries)):
            if not wanted or not isinstance(entries[j], ToolCallEntry):
                break
            if entries[j].tool_name in wanted:
                wanted.remove(entries[j].tool_name)
                links.setdefault(i, []).append(j)
    return links


def _said(message: Message) -> tuple:
    """What identifies a message the page already showed: its role, text and the calls it made."""
    if message.role == "tool":
        return ("tool", message.content)
    return (message.role, message.content or "", tuple((c.function.name, c.function.arguments) for c in message.tool_calls or []))


def _llm_request(entry: LLMRequestEntry, seen: int, shown: set, tool_targets: list[str]) -> str:
    conversation = entry.conversation
    earlier, new = conversation[: min(seen, len(conversation))], conversation[min(seen, len(conversation)) :]
    repeated = [m for m in new if _said(m) in shown]
    out = ""
    if earlier:
        out += (f'<details class="history"><summary>{len(earlier)} earlier message(s)</summary>'
                f'{"".join(_message(m) for m in earlier)}</details>')
    if repeated:
        out += (f'<details class="history"><summary>{len(repeated)} message(s) shown above (response, tool results)'
                f'</summary>{"".join(_message(m) for m in repeated)}</details>')
    out += "".join(_message(m) for m in new if _said(m) not in shown)
    for choice in entry.response.choices:
        finish = f" · finish: {escape(choice.finish_reason)}" if choice.finish_reason else ""
        out += f'<div class="response"><div class="label">response · {escape(entry.response.model)}{finish}</div>'
        out += _message(choice.message, tool_targets)
        out += "</div>"
    return out


def _message(message: Message, tool_targets: Optional[list[str]] = None) -> str:
    extra = message.model_extra or {}
    out = f'<div class="msg {escape(message.role)}"><span class="role">{escape(message.role)}</span>'
    if message.tool_call_id:
        out += f' <span class="dim">answers {escape(message.tool_call_id)}</span>'
    if extra.get("reasoning_content"):
        out += _block("reasoning", str(extra["reasoning_content"]), fold=True)
    if message.content:
        out += _block("content", message.content)
    for k, call in enumerate(message.tool_calls or []):
        target = (tool_targets or [])[k] if tool_targets and k < len(tool_targets) else None
        link = f' <a class="link" href="#{target}">→ result</a>' if target else ""
        out += (f'<div class="call"><span class="dim">calls</span> <b>{escape(call.function.name)}</b> '
                f'<span class="dim">{escape(call.id)}</span>{link}{_block("arguments", _pretty(call.function.arguments))}</div>')
    return out + "</div>"


def _tool_call(entry: ToolCallEntry) -> str:
    out = _block("arguments", json.dumps(entry.arguments, indent=2, ensure_ascii=False))
    out += _block("result", _pretty(entry.result))
    if entry.cli_output:
        out += _block("cli output", entry.cli_output, fold=True)
    return out


def _solutions(text: str, solutions: dict[str, SolutionSummary]) -> str:
    rows = []
    for name in named_in(text, solutions):
        s = solutions[name]
        status = "passed" if s.passed == s.results else ", ".join(s.statuses)
        cls = "ok" if s.passed == s.results else ("mixed" if s.passed else "bad")
        speedup = f"{s.median_speedup:.2f}×" if s.median_speedup is not None else "—"
        diff = f"{s.worst_max_diff:.3g}" if s.worst_max_diff is not None else "—"
        rows.append(f'<tr class="{cls}"><td>{escape(name)}</td><td>{escape(", ".join(s.kernel_ids))}</td>'
                    f"<td>{s.passed}/{s.results} {escape(status)}</td><td>{speedup}</td><td>{diff}</td></tr>")
    if not rows:
        return ""
    return ('<table class="results"><tr><th>solution</th><th>kernel</th><th>passed</th>'
            f'<th>median speedup</th><th>max diff</th></tr>{"".join(rows)}</table>')


def _entry_text(entry: Any) -> str:
    if isinstance(entry, LLMRequestEntry):
        return entry.response.model_dump_json()  # what the agent said and called, not the history
    return entry.model_dump_json()


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return text


def _block(label: str, text: str, fold: bool = False) -> str:
    long = fold or len(text) > FOLD_CHARS or text.count("\n") >= FOLD_LINES
    body = f"<pre>{escape(text)}</pre>"
    if not long:
        return f'<div class="block"><div class="label">{escape(label)}</div>{body}</div>'
    first = escape(text.strip().splitlines()[0][:120]) if text.strip() else ""
    return (f'<details class="block"><summary><span class="label">{escape(label)}</span> {first} '
            f'<span class="dim">({len(text)} chars, {text.count(chr(10)) + 1} lines)</span></summary>{body}</details>')


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
header{position:sticky;top:0;background:#1d232b;color:#fff;padding:8px 16px;display:flex;gap:12px;align-items:center;z-index:1}
header input{flex:0 1 360px;padding:4px 8px;border-radius:4px;border:0}
header button{background:#39424e;color:#fff;border:0;border-radius:4px;padding:4px 8px;cursor:pointer}
main{padding:8px 16px;max-width:1100px}
.meta{color:#5b6573;margin-top:-8px}
.timeline{list-style:none;padding:0}
.entry{background:#fff;border-left:4px solid #8a94a3;border-radius:4px;margin:8px 0;padding:6px 10px;box-shadow:0 1px 2px #0001}
.entry.llm{border-color:#3b7dd8}.entry.tool{border-color:#2e9d62}.entry.mcp{border-color:#a05ad0}
.entry.hit{outline:2px solid #f0b400}
.head{font-weight:600;margin-bottom:4px}.n{color:#8a94a3;font-weight:400}
.msg{border-top:1px dashed #dde1e6;padding:4px 0}.role{font-size:12px;text-transform:uppercase;color:#5b6573}
.msg.assistant .role{color:#3b7dd8}.msg.tool .role{color:#2e9d62}.msg.system .role{color:#a05ad0}
.response{background:#f1f6fd;border-radius:4px;padding:2px 8px;margin-top:4px}
.label{font-size:12px;color:#5b6573}.dim{color:#8a94a3;font-size:12px}
.call{margin:4px 0 4px 12px}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;font:12.5px/1.4 ui-monospace,monospace;background:#f8f9fb;padding:4px 6px;border-radius:3px}
details>summary{cursor:pointer}
a.link{font-weight:400;font-size:12px}
table.results{border-collapse:collapse;margin-top:6px;font-size:12.5px}
table.results td,table.results th{border:1px solid #dde1e6;padding:2px 6px;text-align:left}
tr.ok td:nth-child(3){color:#2e9d62}tr.bad td:nth-child(3){color:#c0392b}tr.mixed td:nth-child(3){color:#b07a00}
[hidden]{display:none!important}
"""

_SCRIPT = """
(function () {
  const entries = Array.from(document.querySelectorAll('.entry'));
  const count = document.getElementById('count');
  const box = document.getElementById('search');
  function show(n) { count.textContent = n + ' of ' + entries.length + ' entries'; }
  function filter() {
    const q = box.value.trim().toLowerCase();
    let n = 0;
    for (const e of entries) {
      const hit = !q || e.textContent.toLowerCase().includes(q);
      e.hidden = !hit;
      e.classList.toggle('hit', hit && q.length > 0);
      if (hit) n++;
      if (hit && q) for (const d of e.querySelectorAll('details')) {
        if (d.textContent.toLowerCase().includes(q)) d.open = true;
      }
    }
    show(n);
  }
  box.addEventListener('input', filter);
  document.getElementById('expand').addEventListener('click', () => document.querySelectorAll('details').forEach(d => d.open = true));
  document.getElementById('collapse').addEventListener('click', () => document.querySelectorAll('details').forEach(d => d.open = false));
  show(entries.length);
  document.body.dataset.entries = String(entries.length);
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>fi-profile · agent traces</title><style>{style}</style></head>
<body><header><b>agent traces</b><input id="search" type="search" placeholder="search messages, tools, arguments, results…" autocomplete="off">
<span id="count">{total} entries</span><button id="expand">expand all</button><button id="collapse">collapse all</button>
<span class="dim">{traces} trace(s)</span></header>
<main>{sections}</main><script>{script}</script></body></html>
"""
