# Test scaffolding for SGLang on CPU: two of Qwen3-Next's kernels are Triton launches that SGLang
# makes on CPU too, where Triton has no driver:
# - its gated norm (FusedRMSNormGated), which takes sgl-kernel's fused_rmsnorm_gated_cpu op on a
#   CPU with AMX and a CPU build of sgl-kernel (neither is here): that path is taken, with
#   sgl_kernel.mamba's PyTorch op;
# - the MoE block's shared-expert gate (fused_gate_sigmoid_mul_add), whose launcher computes the
#   same in PyTorch here.
# Each is set right after SGLang loads its module; the engine's calls to them are unchanged.
import importlib.abc
import importlib.util
import sys


def _gated_norm(module):
    import sgl_kernel.mamba  # noqa: F401  (sets torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu)

    module._use_cpu = True


def _gate_sigmoid_mul(module):
    def launch(hidden_states, gate_weight, shared_output, output, *, do_add):
        gate = (hidden_states.float() @ gate_weight.float()).sigmoid()[:, None]
        result = gate * shared_output.float() + (output.float() if do_add else 0.0)
        output.copy_(result.to(output.dtype))

    module._launch_fused_gate_sigmoid_mul = launch


_PATCHES = {
    "sglang.kernels.ops.attention.fla.fused_norm_gate": _gated_norm,
    "sglang.kernels.ops.elementwise.elementwise": _gate_sigmoid_mul,
}


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
