"""SGLang's Triton ``fused_gate_sigmoid_mul_add``, as its Qwen2-MoE block finishes a gated shared
expert on CUDA: the gate's logit per token, its sigmoid times the shared expert's output, added in
place to the routed experts' output (which holds the result afterwards)."""

try:  # SGLang 0.5.2x
    from sglang.kernels.ops.elementwise.elementwise import fused_gate_sigmoid_mul_add
except ImportError:  # SGLang 0.5.1x
    from sglang.kernels.ops.layernorm.elementwise import fused_gate_sigmoid_mul_add


def run(hidden_states, gate_weight, shared_output, routed_output):
    fused_gate_sigmoid_mul_add(hidden_states, gate_weight, shared_output, routed_output)
