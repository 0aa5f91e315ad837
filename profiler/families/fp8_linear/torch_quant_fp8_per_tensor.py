import torch

OUTPUTS = ("x_q", "x_scale")


def run(x):
    scale = x.abs().amax().float().clamp_min(1e-10) / torch.finfo(torch.float8_e4m3fn).max  # 0-D
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale
