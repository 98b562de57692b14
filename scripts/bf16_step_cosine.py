#!/usr/bin/env python3
"""How far one training step under PyTorch's bf16 autocast is from the fp32 step, per image model:
the loss and the cosine between the two gradients, at initialization on random images. The
reference for tests/precision_test.cpp's thresholds (our bf16 step against our fp32 step).

    python3 scripts/bf16_step_cosine.py      # needs torch (a venv's is fine)

Measured with PyTorch 2.15 on a Sapphire Rapids CPU: resnet20 b32 0.995, resnet18 b16 0.956,
vgg16 b16 0.887: the deeper networks' gradients at initialization move that much under bf16."""
import os
import sys

import torch

sys.argv = sys.argv[:1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch  # noqa: E402  (the same model definitions as the benchmarks)


def main():
    torch.manual_seed(0)
    for name, batch in [("resnet20", 32), ("resnet18", 16), ("vgg16", 16)]:
        model = bench_torch.build(name).train()
        x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

        def step(autocast):
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss.item(), torch.cat([p.grad.flatten().float() for p in model.parameters()])

        loss32, g32 = step(False)
        loss16, g16 = step(True)
        cosine = torch.nn.functional.cosine_similarity(g32, g16, dim=0).item()
        print(f"{name} batch {batch}: loss fp32 {loss32:.5f} bf16 {loss16:.5f}, gradient cosine {cosine:.4f}")


if __name__ == "__main__":
    main()
