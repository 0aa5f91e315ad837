"""Every example of both seed documents validates (fixtures: tests/fixtures/README.md)."""

import json

import pytest
from conftest import FIXTURES

from fi_profile.documents import Kind
from fi_profile.entry_points import run_reference
from fi_profile.schema import Definition, LegacyKernelDescription, Solution
from fi_profile.schema.agent_trace import ChatCompletion
from fi_profile.synthesis import small_axes, synthesize_inputs
from fi_profile.validate import validate_paths

SEEDS = FIXTURES / "seeds"
EXPECTED_KINDS = {
    "001_kernel_": Kind.legacy_definition,
    "001_calling_record_": Kind.calling_record,
    "001_benchmark_result_": Kind.benchmark_result,
    "001_agent_conversation_": Kind.agent_conversation,
    "001_agent_trace_": Kind.agent_trace,
    "002_definition_": Kind.definition,
}


def test_all_seed_examples_validate():
    report = validate_paths([SEEDS])
    assert report.errors == []
    kinds = {d.label.rsplit("/", 1)[-1]: d.kind for d in report.documents}
    assert len(kinds) == len(list(SEEDS.glob("*.json"))) == 18
    for file, kind in kinds.items():
        assert kind is next(k for prefix, k in EXPECTED_KINDS.items() if file.startswith(prefix)), file


def definitions_from_seeds() -> list[Definition]:
    found = []
    for path in sorted(SEEDS.glob("00*_*.json")):
        if path.name.startswith("001_kernel_"):
            found.append(LegacyKernelDescription.model_validate_json(path.read_text()).to_definition())
        elif path.name.startswith("002_definition_"):
            found.append(Definition.model_validate_json(path.read_text()))
    return found


@pytest.mark.parametrize("definition", definitions_from_seeds(), ids=lambda d: d.name)
def test_seed_definitions_run(definition):
    axes = small_axes(definition)
    outputs = run_reference(definition, synthesize_inputs(definition, axes))
    assert set(outputs) == set(definition.outputs)


def test_legacy_conversion():
    legacy = LegacyKernelDescription.model_validate_json((SEEDS / "001_kernel_5_rmsnorm.json").read_text())
    definition = legacy.to_definition()
    assert definition.name == "rmsnorm" and definition.op_type == "rmsnorm"
    assert definition.inputs["eps"].shape is None, "seed-001 [] means a scalar"
    assert definition.inputs["input"].dtype.value == "float16"
    quantized = LegacyKernelDescription.model_validate_json((SEEDS / "001_kernel_2_quantized_gemm.json").read_text())
    assert quantized.to_definition().inputs["A"].dtype.value == "float8_e4m3fn"
    gqa = LegacyKernelDescription.model_validate_json((SEEDS / "001_kernel_6_attention_gqa4.json").read_text())
    converted = gqa.to_definition()
    assert converted.constraints == ["H_qo == H_kv * H_r"] and converted.axes["Q"].parent == "B"


def test_dtype_defaults_to_float16_in_legacy():
    legacy = LegacyKernelDescription.model_validate(
        {"id": "k", "axes": {"M": {"type": "var"}}, "inputs": {"a": {"shape": ["M"]}},
         "outputs": {"b": {"shape": ["M"]}}, "reference_code": "def run(a):\n    return a\n"}
    )
    assert legacy.to_definition().outputs["b"].dtype.value == "float16"


def test_response_fragment_is_an_openai_chat_completion():
    data = json.loads((FIXTURES / "seed_fragments" / "001_chat_completion_response.json").read_text())
    completion = ChatCompletion.model_validate(data)
    assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_code_schema_example_is_a_destination_passing_solution():
    source = (FIXTURES / "seed_fragments" / "001_code_example.py").read_text()
    solution = Solution.model_validate(
        {"name": "seed_code_example", "definition": "rms", "author": "seed 001",
         "spec": {"language": "torch_compile", "entry_point": "main.py::run"},
         "sources": [{"path": "main.py", "content": source}]}
    )
    assert solution.is_destination_passing(["x", "eps"], ["result"])
    assert solution.entry_signature().params == ("x", "eps", "result")
