# Test scaffolding for SGLang on CPU: SGLang's FusedRMSNormGated (Qwen3-Next's gated norm) runs a
# Triton kernel unless the CPU has AMX and a CPU build of sgl-kernel (then its
# fused_rmsnorm_gated_cpu op); neither is here, and Triton has no CPU driver. Right after SGLang
# loads its module, the norm takes that CPU path, with sgl_kernel.mamba's PyTorch op.
import importlib.abc
import importlib.util
import sys

_MODULE = "sglang.kernels.ops.attention.fla.fused_norm_gate"


class _GatedNormFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # one module, once
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import sgl_kernel.mamba  # noqa: F401  (registers torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu)

            module._use_cpu = True

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _GatedNormFinder())
