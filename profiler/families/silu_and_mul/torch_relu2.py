import torch


def run(input):
    return torch.square(torch.relu(input))
