"""Agent traces: the seed's forms, converters from OpenAI-compatible server logs (vLLM, SGLang),
clear errors, and the inspector page checked in a real headless Chromium."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fi_profile.agent_traces.load import TraceError, load_trace
from fi_profile.agent_traces.openai_format import normalize_completion, normalize_message
from fi_profile.schema.agent_trace import AgentTrace
from fi_profile.schema.benchmark_result import BenchmarkResult

HERE = Path(__file__).parent
TRACES = HERE / "fixtures" / "agent_traces"
SEEDS = HERE / "fixtures" / "seeds"
VLLM_LOG, SGLANG_LOG = TRACES / "vllm_openai_log.jsonl", TRACES / "sglang_openai_log.jsonl"
CONVERSATION, TYPED = SEEDS / "001_agent_conversation_2_tool_call.json", SEEDS / "001_agent_trace_3_multi_agent.json"
CHROMIUM = Path("/usr/bin/chromium")


def types(path: Path) -> list[str]:
    return [e.type for e in load_trace(path).trace.root]


def test_every_form_reads_into_the_typed_list():
    assert types(VLLM_LOG) == ["llm_request", "tool_call", "llm_request", "tool_call", "llm_request"]
    assert types(SGLANG_LOG) == ["llm_request", "tool_call", "llm_request"]
    assert types(CONVERSATION) == ["llm_request", "tool_call", "llm_request"]
    assert types(TYPED) == ["llm_request", "llm_request"]
    assert [load_trace(p).form for p in (VLLM_LOG, CONVERSATION, TYPED)] == ["request/response log", "conversation", "typed list"]


def test_typed_list_round_trips(tmp_path):
    for source in (VLLM_LOG, SGLANG_LOG, CONVERSATION, TYPED):
        trace = load_trace(source).trace
        again = tmp_path / f"{source.stem}.json"
        again.write_text(trace.model_dump_json())
        assert load_trace(again).trace == trace
        assert AgentTrace.model_validate(json.loads(again.read_text())) == trace
        compact = tmp_path / f"{source.stem}.compact.json"  # nulls left out, as convert-trace writes
        compact.write_text(trace.model_dump_json(exclude_none=True))
        assert load_trace(compact).trace.model_dump(exclude_none=True) == trace.model_dump(exclude_none=True)


def test_conversation_becomes_requests_and_tool_calls():
    first, tool, second = load_trace(CONVERSATION).trace.root
    assert [m.role for m in first.conversation] == ["user"]
    assert first.response.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert first.response.choices[0].finish_reason == "tool_calls" and first.model == "gpt-4o"
    assert tool.tool_name == "get_weather" and tool.arguments == {"location": "New York, NY"}
    assert tool.result.startswith("Current weather in New York")
    assert [m.role for m in second.conversation] == ["user", "assistant", "tool"]
    assert second.response.choices[0].message.content.startswith("The weather in New York")


def test_vllm_log_is_normalised_to_openai_form():
    first, write, second, bench, last = load_trace(VLLM_LOG).trace.root
    assert first.conversation[1].content == "Write an RMSNorm kernel for hidden size 4096 (bf16)."  # content parts joined
    message = first.response.choices[0].message
    assert message.content is None and message.tool_calls[0].id == "chatcmpl-tool-a1"
    assert message.model_extra["reasoning_content"] == "One warp per row; vectorized loads."  # vLLM's `reasoning`
    assert write.arguments["path"] == "rmsnorm_v1.cu" and write.result == "wrote rmsnorm_v1.cu (212 bytes)"
    assert bench.arguments == {"solution": "rmsnorm_v1", "definition": "rmsnorm_h4096"}
    assert last.response.choices[0].message.tool_calls is None  # vLLM's tool_calls: [] on a plain answer
    assert "reasoning_content" not in (last.response.choices[0].message.model_extra or {})  # null reasoning dropped


def test_sglang_log_is_normalised_to_openai_form():
    first, compile_call, second = load_trace(SGLANG_LOG).trace.root
    assert first.conversation[0].role == "system"  # "developer"
    call = first.response.choices[0].message.tool_calls[0]
    assert call.type == "function" and call.id  # SGLang gave neither type nor id
    assert json.loads(call.function.arguments) == {"solution": "silu_v2", "flags": ["-O3"]}  # object -> JSON string
    assert first.annotation == "kernel writer" and first.response.choices[0].model_extra["matched_stop"] is None
    # the client answered under its own id: matched by the assistant message that made the same call
    assert compile_call.tool_name == "compile" and "__hmul2" in compile_call.result
    assert second.response.choices[0].index == 0 and second.response.model == "deepseek-ai/DeepSeek-R1"


def test_normalisation_rules_one_by_one():
    m = normalize_message({"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": {"a": 1}}}, "m")
    assert m["tool_calls"] == [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    assert normalize_message({"role": "assistant", "content": None}, "m")["content"] == ""
    assert (
        normalize_message({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}, "m")["content"]
        == "a\n[image_url]"
    )
    completion = normalize_completion({"choices": [{"message": {"content": "x"}}]}, "r", "req-model", "c")
    assert completion["model"] == "req-model" and completion["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    "name, text, expected",
    [
        (
            "log.jsonl",
            '{"request": {"model": "m", "messages": "hi"}, "response": {}}',
            "log.jsonl:1: request.messages: the chat request's messages must be a list",
        ),
        (
            "log.jsonl",
            '{"request": {"model": "m", "messages": []}, "response": {"choices": []}}',
            "log.jsonl:1: response.choices: a chat completion needs at least one choice",
        ),
        (
            "log.jsonl",
            '{"request": {"messages": [{"role": "user", "content": "x"}]}, "response": {"choices": [{"message": {"content": "y"}}]}}',
            "log.jsonl:1: response.model: no model in the response nor in the request",
        ),
        (
            "log.jsonl",
            '{"request": {"model": "m", "messages": [{"role": "user"}]}, "response": {"choices": [{"message": {"content": "y"}}]}}',
            "log.jsonl:1: request.messages.0: content is required",
        ),
        ("trace.json", '[{"type": "tool_call", "tool_name": "t", "arguments": {}}]', "trace.json: 0.result: field required"),
        ("trace.json", '[{"type": "thought"}]', "trace.json: 0: Input tag 'thought'"),
        ("conv.json", '{"conversation": []}', "conv.json: model: field required"),
        ("conv.json", '{"model": "m", "conversation": [}', "conv.json: line 1 column 33: invalid JSON"),
        ("empty.jsonl", "", "empty.jsonl: empty file"),
    ],
)
def test_malformed_traces_name_file_and_field(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert expected in str(caught.value).replace(str(tmp_path) + "/", "")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from fi_profile.cli import main; main()", *args], capture_output=True, text=True, timeout=120
    )


def test_convert_trace_writes_the_typed_list(tmp_path):
    out = tmp_path / "typed.json"
    proc = run_cli("convert-trace", str(VLLM_LOG), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert load_trace(out).form == "typed list"
    assert load_trace(out).trace.model_dump(exclude_none=True) == load_trace(VLLM_LOG).trace.model_dump(exclude_none=True)
    bad = run_cli("convert-trace", str(SEEDS / "001_benchmark_result_1_success.json"), "--out", str(tmp_path / "x.json"))
    assert bad.returncode == 1 and "not an agent trace" in bad.stderr and not (tmp_path / "x.json").exists()


def write_results(path: Path) -> None:
    rows = [
        {
            "device": {"name": "NVIDIA H200"},
            "kernel_id": "rmsnorm_h4096",
            "source": "rmsnorm_v1",
            "compiled": True,
            "time": 0.011,
            "speedup": 1.8,
            "max_diff": 0.0078,
            "status": "passed",
            "workload": "w0",
        },
        {
            "device": {"name": "NVIDIA H200"},
            "kernel_id": "rmsnorm_h4096",
            "source": "reference",
            "compiled": True,
            "time": 0.02,
            "speedup": 1.0,
            "max_diff": 0.0,
            "status": "passed",
            "workload": "w0",
        },
        {
            "device": {"name": "NVIDIA H200"},
            "kernel_id": "silu_and_mul_i14336",
            "source": "silu_v2",
            "compiled": False,
            "compile_error": "identifier __hmul2 is undefined",
            "status": "compile_error",
            "workload": "w1",
        },
    ]
    for row in rows:
        BenchmarkResult.model_validate(row)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_inspect_rejects_bad_traces_and_results_naming_file_line_and_field(tmp_path):
    results, trace = tmp_path / "results.jsonl", tmp_path / "trace.json"
    results.write_text('{"device": {"name": "x"}, "kernel_id": "k", "source": "s", "compiled": true}\n')
    trace.write_text('[{"type": "llm_request", "conversation": [], "response": {"model": "m", "choices": []}, "model": "m"}]')
    proc = run_cli("inspect", str(VLLM_LOG), str(trace), "--results", str(results), "--out", str(tmp_path / "p.html"))
    assert proc.returncode == 1 and f"{results}:1: time: required when compiled is true" in proc.stderr
    assert f"{trace}: 0.response.choices: List should have at least 1 item" in proc.stderr
    assert not (tmp_path / "p.html").exists() and "Traceback" not in proc.stderr


def test_page_folds_what_it_already_showed():
    """Each request repeats the history: the previous response and the tool results already on the
    page as entries are folded, only what is new stays open."""
    from fi_profile.agent_traces.page import render_page

    html = render_page([load_trace(VLLM_LOG)])
    assert html.count("2 message(s) shown above (response, tool results)") == 2  # requests #2 and #4
    assert html.count("earlier message(s)") == 2 and html.count('class="entry ') == 5


def browser_or_skip():
    if not CHROMIUM.is_file() or not _playwright():
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI must install Debian's chromium and playwright (.ci/setup)")
        pytest.skip("no /usr/bin/chromium or playwright")


def _playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def test_inspector_page_in_headless_chromium(tmp_path):
    """The page loads from a file with no console errors and no network request, shows every entry,
    links tool calls to their results, filters by search, shows benchmark results inline."""
    browser_or_skip()
    from playwright.sync_api import sync_playwright

    results, page_file = tmp_path / "results.jsonl", tmp_path / "traces.html"
    write_results(results)
    traces = [VLLM_LOG, SGLANG_LOG, CONVERSATION, TYPED]
    proc = run_cli("inspect", *map(str, traces), "--results", str(results), "--out", str(page_file))
    assert proc.returncode == 0, proc.stderr
    total = sum(len(load_trace(t).trace.root) for t in traces)
    problems, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: requests.append(r.url) if not r.url.startswith("file://") else None)
        page.goto(page_file.as_uri())
        assert page.evaluate("document.body.dataset.entries") == str(total)
        assert page.locator(".entry").count() == total == 13
        assert page.locator("#count").inner_text() == f"{total} of {total} entries"
        # a response's tool call links to the entry that ran it, and back
        page.locator("#t0-e0 a.link").first.click()
        assert page.evaluate("location.hash") == "#t0-e1"
        assert page.locator("#t0-e1 a.link").get_attribute("href") == "#t0-e0"
        # benchmark results of the solutions a trace names, inline
        rms = page.locator("#t0-e3 table.results tr.ok")
        assert rms.count() == 1 and "1/1 passed" in rms.inner_text() and "1.80×" in rms.inner_text()
        assert "0/1 compile_error" in page.locator("#t1-e0 table.results tr.bad").inner_text()
        # search: only the entries that mention silu_v2 (the SGLang trace's three) stay visible
        page.fill("#search", "silu_v2")
        assert page.locator("#count").inner_text() == f"3 of {total} entries"
        assert page.locator(".entry:visible").count() == 3
        page.fill("#search", "")
        page.screenshot(path=str(tmp_path / "traces.png"), full_page=True)
        browser.close()
    assert problems == [] and requests == []
    shot = tmp_path / "traces.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("FI_PROFILE_ARTIFACTS"):
        shutil.copy(shot, Path(os.environ["FI_PROFILE_ARTIFACTS"]) / "agent-traces.png")
