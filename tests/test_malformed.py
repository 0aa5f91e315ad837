"""Bad input of every kind: a clear ``file: field.path: message``, exit 1, never a traceback."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fi_profile.cli import app
from fi_profile.validate import validate_paths

RMSNORM = json.loads((Path(__file__).parents[1] / "definitions/rmsnorm/rmsnorm_h4096.json").read_text())


def with_changes(base, **changes):
    doc = json.loads(json.dumps(base))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = doc
        for key in parents:
            target = target[key]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return doc


DELETE = object()
#: seed 001's code schema: ``run`` takes the inputs, then the pre-allocated outputs, returns nothing
LEGACY_DP = json.loads((Path(__file__).parent / "fixtures/seed_fragments/001_kernel_destination_passing.json").read_text())
TRACE = {
    "definition": "rmsnorm_h4096", "solution": None, "evaluation": None,
    "workload": {"uuid": "a", "axes": {"batch_size": 3},
                 "inputs": {"hidden_states": {"type": "random"}, "weight": {"type": "random"}}},
}
SOLUTION = {
    "name": "s", "definition": "rmsnorm_h4096", "author": "me",
    "spec": {"language": "Triton", "entry_point": "main.py::run"},
    "sources": [{"path": "main.py", "content": "def run(hidden_states, weight):\n    return hidden_states\n"}],
}
RESULT = {"device": {"name": "H100"}, "kernel_id": "k", "source": "s", "compiled": True, "time": 1.0, "speedup": 1.0, "max_diff": 0.0}
RECORD = {"model": "m", "framework": "vLLM", "kernels": [{"id": "rmsnorm_h4096", "count": 3}]}
AGENT = {"model": "gpt", "conversation": [{"role": "user", "content": "hi"}]}

CASES = [
    # (name, document, expected "path: message" fragment)
    ("definition unknown axis", with_changes(RMSNORM, inputs__weight__shape=["hidden"]), "inputs.weight.shape.0: unknown axis 'hidden'"),
    ("definition bad dtype", with_changes(RMSNORM, outputs__output__dtype="float9"), "outputs.output.dtype: Input should be"),
    ("definition missing reference", with_changes(RMSNORM, reference=DELETE), "reference: field required"),
    ("definition reference without run", with_changes(RMSNORM, reference="import torch\n"), "reference: defines no top-level function 'run'"),
    ("definition reference syntax", with_changes(RMSNORM, reference="def run(:\n"), "reference: does not parse: line 1"),
    ("definition run params", with_changes(RMSNORM, reference="def run(x, weight):\n    pass\n"), "reference: run('x', 'weight') takes neither the inputs ('hidden_states', 'weight') (returning the outputs) nor the inputs then the outputs"),
    ("definition name clash", with_changes(RMSNORM, outputs__weight={"shape": ["hidden_size"], "dtype": "bfloat16"}), "outputs.weight: 'weight' is also an input name"),
    ("definition constraint code", with_changes(RMSNORM, constraints=["__import__('os')"]), "constraints.0: call of '__import__' is not allowed"),
    ("definition constraint unknown", with_changes(RMSNORM, constraints=["batch == 1"]), "constraints.0: unknown names ['batch']"),
    ("definition const value", with_changes(RMSNORM, axes__hidden_size__value=-1), "axes.hidden_size.value: Input should be greater than or equal to 0"),
    ("definition typo field", with_changes(RMSNORM, refrence="x"), "refrence: unknown field"),
    ("legacy run params", with_changes(LEGACY_DP, reference_code="def run(x, eps, out):\n    pass\n"), "reference_code: run('x', 'eps', 'out') takes neither"),
    ("legacy code run params", with_changes(LEGACY_DP, reference_code=DELETE, code="def run(x):\n    pass\n"), "code: run('x',) takes neither"),
    ("legacy assumption", with_changes(LEGACY_DP, assumptions=["batch > 0"]), "assumptions.0: unknown names ['batch']"),
    ("legacy fills a scalar", with_changes(LEGACY_DP, outputs__result__shape=[]), "reference_code: run('x', 'eps', 'result') fills its outputs in place, but result is a Python scalar"),
    ("legacy both ids", {"id": "a", "name": "b", "axes": {}, "inputs": {}, "outputs": {}, "code": "def run():\n    pass\n"}, "give either 'id' or 'name', not both"),
    ("solution entry format", with_changes(SOLUTION, spec__entry_point="main.py:run"), "spec.entry_point: Value error, must be 'file_path::function_name'".replace("Value error, ", "")),
    ("solution entry file", with_changes(SOLUTION, spec__entry_point="kernel.py::run"), "spec.entry_point: no source file 'kernel.py'"),
    ("solution entry function", with_changes(SOLUTION, spec__entry_point="main.py::launch"), "spec.entry_point: main.py defines no top-level function 'launch'"),
    ("solution path escape", with_changes(SOLUTION, sources=[{"path": "../x.py", "content": ""}]), "sources.0.path: must be a relative path"),
    ("solution language", with_changes(SOLUTION, spec__language="fortran"), "spec.language: Input should be 'python', 'triton', 'cuda' or 'torch_compile'"),
    ("solution signature", with_changes(SOLUTION, sources=[{"path": "main.py", "content": "def run(x):\n    pass\n"}]), "spec.entry_point: run('x',) does not take ('hidden_states', 'weight') by name"),
    ("record framework", with_changes(RECORD, framework="vllm"), "framework: Input should be 'SGLang', 'vLLM', 'MLC-LLM' or 'TRT-LLM'"),
    ("record count", with_changes(RECORD, kernels=[{"id": "a", "count": -2}]), "kernels.0.count: Input should be greater than or equal to 0"),
    ("record duplicate", with_changes(RECORD, kernels=[{"id": "a", "count": 1}, {"id": "a", "count": 2}]), "kernels.1.id: 'a' already listed at kernels.0"),
    ("trace unknown axis", with_changes(TRACE, workload__axes={"batch_size": 3, "hidden_size": 4096}), "workload.axes.hidden_size: is a const axis"),
    ("trace missing axis", with_changes(TRACE, workload__axes={}), "workload.axes: var axis 'batch_size' has no value"),
    ("trace unknown input", with_changes(TRACE, workload__inputs__eps={"type": "scalar", "value": 1e-5}), "workload.inputs.eps: rmsnorm_h4096 has no input 'eps'"),
    ("trace missing input", with_changes(TRACE, workload__inputs={"weight": {"type": "random"}}), "workload.inputs: input 'hidden_states' has no source"),
    ("trace input type", with_changes(TRACE, workload__inputs__weight={"type": "zeros"}), "workload.inputs.weight: Input tag 'zeros' found using 'type' does not match"),
    ("trace safetensors key", with_changes(TRACE, workload__inputs__weight={"type": "safetensors", "path": "x"}), "workload.inputs.weight.tensor_key: field required"),
    ("trace unknown definition", with_changes(TRACE, definition="nope"), "definition: no Definition named 'nope' is known"),
    ("trace negative axis", with_changes(TRACE, workload__axes={"batch_size": -1}), "workload.axes.batch_size: Input should be greater than or equal to 0"),
    ("result compiled without time", with_changes(RESULT, time=DELETE), "time: required when compiled is true"),
    ("result failure without error", {"device": {"name": "H100"}, "kernel_id": "k", "source": "s", "compiled": False}, "compile_error: required when compiled is false"),
    ("result failure with time", {"device": {"name": "H100"}, "kernel_id": "k", "source": "s", "compiled": False, "compile_error": "x", "time": 1.0}, "time: must be absent when compiled is false"),
    ("agent message without content", with_changes(AGENT, conversation=[{"role": "user"}]), "conversation.0: content is required"),
    ("agent bad role", with_changes(AGENT, conversation=[{"role": "robot", "content": "x"}]), "conversation.0.role: Input should be 'system', 'user', 'assistant' or 'tool'"),
    ("agent entry type", [{"type": "thought", "text": "x"}], "0: Input tag 'thought' found using 'type' does not match"),
    ("agent tool_call arguments", [{"type": "tool_call", "tool_name": "t", "arguments": "x", "result": ""}], "0.arguments: Input should be a valid dictionary"),
    ("unknown document", {"hello": 1}, "cannot tell what this document is"),
]


@pytest.mark.parametrize("name, document, expected", CASES, ids=[c[0] for c in CASES])
def test_problem_names_file_and_field(tmp_path, name, document, expected):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))
    before = path.read_bytes()
    report = validate_paths([path])
    messages = [str(p) for p in report.errors]
    assert any(m.startswith(f"{path}: ") and expected in m for m in messages), messages
    assert path.read_bytes() == before, "validation never changes the file"


def test_broken_json_gives_line_and_column(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "model": "m",\n  "framework": "vLLM",\n}\n')
    (problem,) = validate_paths([path]).errors
    assert str(problem) == f"{path}: line 4 column 1: invalid JSON: Expecting property name enclosed in double quotes"


def test_jsonl_names_the_line(tmp_path):
    path = tmp_path / "w.jsonl"
    bad = with_changes(TRACE, workload__axes={})
    path.write_text(json.dumps(TRACE) + "\n" + json.dumps(bad) + "\n{oops\n")
    messages = [str(p) for p in validate_paths([path]).errors]
    assert messages[0].startswith(f"{path}:3: line 1 column 2: invalid JSON")
    assert f"{path}:2: workload.axes: var axis 'batch_size' has no value" in messages


def test_duplicate_uuid_and_definition(tmp_path):
    (tmp_path / "definitions" / "rmsnorm").mkdir(parents=True)
    for name in ("a.json", "b.json"):
        (tmp_path / "definitions" / "rmsnorm" / name).write_text(json.dumps(RMSNORM))
    (tmp_path / "w.jsonl").write_text(json.dumps(TRACE) + "\n" + json.dumps(TRACE) + "\n")
    messages = [str(p) for p in validate_paths([tmp_path]).errors]
    assert any("b.json: name: 'rmsnorm_h4096' is also defined in" in m for m in messages)
    assert any("w.jsonl:2: workload.uuid: a repeats" in m for m in messages)


def test_cli_exit_codes_and_no_traceback(tmp_path):
    runner = CliRunner()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RMSNORM))
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "0 error(s)" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(with_changes(RMSNORM, reference=DELETE)))
    result = runner.invoke(app, ["validate", str(bad), str(tmp_path / "missing.json")])
    assert result.exit_code == 1
    assert f"{bad}: reference: field required" in result.output
    assert f"{tmp_path / 'missing.json'}: no such file or folder" in result.output
    assert "Traceback" not in result.output


def test_seed_001_destination_passing_description_is_valid(tmp_path):
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(LEGACY_DP))
    report = validate_paths([path])
    assert report.problems == [] and [d.kind.value for d in report.documents] == ["legacy kernel description"]
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0 and "Traceback" not in result.output


@pytest.mark.parametrize("content", [b"[" * 100000 + b"]" * 100000, b"\xff\xfe\x00", b"", b"NaN", b'{"id": 1}'],
                         ids=["nested too deep", "binary", "empty", "NaN", "legacy wrong types"])
def test_any_file_gives_problems_not_a_traceback(tmp_path, content):
    path = tmp_path / "odd.json"
    path.write_bytes(content)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1 and (result.exception is None or isinstance(result.exception, SystemExit))
    assert f"{path}: " in result.output and "Traceback" not in result.output
