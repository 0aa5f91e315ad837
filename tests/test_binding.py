import pytest
import torch

from fi_profile.binding import BindingError, bind_axes, failed_constraints
from fi_profile.catalog import shipped_definition
from fi_profile.schema import Definition


def decode():
    return shipped_definition("gqa_paged_decode_h32_kv8_d128_ps16")


def decode_inputs(batch=3, pages=10, per_seq=(2, 1, 4)):
    indptr = torch.tensor([0, *torch.tensor(per_seq).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "q": torch.zeros(batch, 32, 128, dtype=torch.bfloat16),
        "k_cache": torch.zeros(pages, 16, 8, 128, dtype=torch.bfloat16),
        "v_cache": torch.zeros(pages, 16, 8, 128, dtype=torch.bfloat16),
        "kv_indptr": indptr,
        "kv_indices": torch.arange(int(indptr[-1]), dtype=torch.int32),
        "kv_last_page_len": torch.ones(batch, dtype=torch.int32),
        "sm_scale": 0.1,
    }


def test_binds_var_axes_and_checks_constraints():
    inputs = decode_inputs()
    axes = bind_axes(decode(), inputs)
    assert axes == {"batch_size": 3, "num_pages": 10, "len_indptr": 4, "num_kv_indices": 7}
    assert failed_constraints(decode(), axes, inputs) == []
    inputs["kv_indices"] = inputs["kv_indices"][:5]
    axes = bind_axes(decode(), inputs)
    assert failed_constraints(decode(), axes, inputs) == ["num_kv_indices == kv_indptr[-1].item()"]


def test_const_axis_mismatch_names_tensor_and_dim():
    inputs = decode_inputs()
    inputs["q"] = torch.zeros(3, 16, 128, dtype=torch.bfloat16)
    with pytest.raises(BindingError, match=r"q.shape\[1\] is 16, but const axis num_qo_heads is 32"):
        bind_axes(decode(), inputs)


def test_inconsistent_var_axis():
    inputs = decode_inputs()
    inputs["v_cache"] = torch.zeros(11, 16, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(BindingError, match="num_pages is 10 from k_cache.shape.0. but 11 from v_cache.shape.0."):
        bind_axes(decode(), inputs)


def test_dtype_rank_and_missing():
    inputs = decode_inputs()
    inputs["q"] = inputs["q"].float()
    with pytest.raises(BindingError, match="q has dtype torch.float32, expected bfloat16"):
        bind_axes(decode(), inputs)
    assert bind_axes(decode(), inputs, check_dtype=False)["batch_size"] == 3
    inputs = decode_inputs()
    inputs["kv_indptr"] = inputs["kv_indptr"][None]
    with pytest.raises(BindingError, match="rank 2, expected 1"):
        bind_axes(decode(), inputs)
    inputs = decode_inputs()
    del inputs["k_cache"]
    with pytest.raises(BindingError, match="input 'k_cache' is missing"):
        bind_axes(decode(), inputs)


def test_fp4_counts_two_values_per_stored_element():
    definition = Definition.model_validate(
        {
            "name": "fp4_copy",
            "op_type": "copy",
            "axes": {"M": {"type": "var"}, "K": {"type": "const", "value": 8}},
            "inputs": {"x": {"shape": ["M", "K"], "dtype": "float4_e2m1"}},
            "outputs": {"y": {"shape": ["M", "K"], "dtype": "float4_e2m1"}},
            "reference": "def run(x):\n    return x.clone()\n",
        }
    )
    packed = torch.zeros(5, 4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert bind_axes(definition, {"x": packed}) == {"M": 5}
