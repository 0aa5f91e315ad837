import torch


def run(logits):
    return torch.argmax(logits, dim=-1)
