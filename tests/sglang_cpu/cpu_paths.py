# Test scaffolding for SGLang on CPU: two of Qwen3-Next's kernels are Triton launches that SGLang
# makes on CPU too, where Triton has no driver:
# - its gated norm (FusedRMSNormGated), which takes sgl-kernel's fused_rmsnorm_gated_cpu op on a
#   CPU with AMX and a CPU build of sgl-kernel (neither is here): that path is taken, with
#   sgl_kernel.mamba's PyTorch op;
# - the MoE block's shared-expert gate (fused_gate_sigmoid_mul_add), whose launcher computes the
#   same in PyTorch here.
# - Mamba-2's mixer (Nemotron-H), which binds no conv1d on CPU (its module imports one on CUDA, NPU
#   and XPU) and launches Triton for its chunked scan and state update: sgl_kernel.mamba's PyTorch
#   ops are bound in their place, under the names the mixer calls.
# Each is set right after SGLang loads its module; the engine's calls to them are unchanged.
#
# With FI_PROFILE_TEST_FUSE_SHARED_EXPERT=1, Qwen2-MoE's block fuses its shared expert into the
# experts as it does on CUDA (Qwen3-Next's default there): it is built as if on CUDA (the one place
# its constructor reads that; its gate a torch nn.Linear as on CUDA, also on a CPU with AMX), and
# the Triton kernel that appends the shared slot to each token's top-k is computed in PyTorch.
import importlib
import importlib.abc
import importlib.util
import os
import sys


def _gated_norm(module):
    import sgl_kernel.mamba  # noqa: F401  (sets torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu)

    module._use_cpu = True


def _mamba2_mixer(module):
    mamba = importlib.import_module("sgl_kernel.mamba")  # the submodule (the stub's attributes raise)

    module.causal_conv1d_fn = module.causal_conv1d_fn_triton = mamba.causal_conv1d_fn_cpu
    module.causal_conv1d_update = module.causal_conv1d_update_triton = mamba.causal_conv1d_update_cpu
    module.mamba_chunk_scan_combined = mamba.mamba_chunk_scan_combined_cpu
    module.selective_state_update = mamba.selective_state_update_cpu


def _gate_sigmoid_mul(module):
    def launch(hidden_states, gate_weight, shared_output, output, *, do_add):
        gate = (hidden_states.float() @ gate_weight.float()).sigmoid()[:, None]
        result = gate * shared_output.float() + (output.float() if do_add else 0.0)
        output.copy_(result.to(output.dtype))

    module._launch_fused_gate_sigmoid_mul = launch


def _fused_on_cuda(module):
    build = module.Qwen2MoeSparseMoeBlock.__init__

    def __init__(self, *args, **kwargs):
        # its gate too: a torch nn.Linear, not the ReplicatedLinear (packed for AMX) of CPUs with AMX
        was = module._is_cuda, module._is_cpu_amx_available
        module._is_cuda, module._is_cpu_amx_available = True, False
        try:
            build(self, *args, **kwargs)
        finally:
            module._is_cuda, module._is_cpu_amx_available = was

    module.Qwen2MoeSparseMoeBlock.__init__ = __init__


def _append_shared(module):
    import torch

    def append(topk_ids, topk_weights, shared_weights, num_fused_shared_experts, N=None, apply_sigmoid=False,
               scale=1.0, **fused):
        assert not apply_sigmoid and not fused, "only SGLang's CUDA path is written here"
        m, s = topk_ids.shape[0], int(num_fused_shared_experts)
        weights = shared_weights.to(topk_weights.dtype).reshape(m, -1).expand(m, s) * scale
        ids = (N + torch.arange(s, device=topk_ids.device, dtype=topk_ids.dtype)).expand(m, s)
        return torch.cat([topk_ids, ids], dim=1), torch.cat([topk_weights, weights], dim=1)

    module.fused_append_shared_experts_with_weights = append


_PATCHES = {
    "sglang.kernels.ops.attention.fla.fused_norm_gate": _gated_norm,
    "sglang.kernels.ops.elementwise.elementwise": _gate_sigmoid_mul,
    "sglang.srt.layers.attention.mamba.mamba": _mamba2_mixer,
}
if os.environ.get("FI_PROFILE_TEST_FUSE_SHARED_EXPERT") == "1":
    _PATCHES["sglang.srt.models.qwen2_moe"] = _fused_on_cuda
    _PATCHES["sglang.kernels.ops.moe.fused_moe_triton_kernels"] = _append_shared


class _CpuPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.pop(name, None)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if _PATCHES:
                sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CpuPathFinder())
