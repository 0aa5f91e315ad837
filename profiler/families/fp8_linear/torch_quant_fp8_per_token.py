import torch

OUTPUTS = ("x_q", "x_scale")


def run(x):
    scale = x.abs().amax(dim=-1).float().clamp_min(1e-10) / torch.finfo(torch.float8_e4m3fn).max  # [M]
    return (x.float() / scale[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale
