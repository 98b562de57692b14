#!/usr/bin/python3
"""Reference values for tests/optim_test.cpp, computed with PyTorch's own optimizers (SGD, Adam,
AdamW), schedulers and clip_grad_norm_, written to tests/fixtures/optim_reference.json.

Run with Debian's torch (the `python3` first on PATH may not have it):
    /usr/bin/python3 scripts/make_optim_fixtures.py

The inputs are fixed numbers written here (not drawn from an RNG) so the fixture only changes when
this script does.
"""
import json
import math
import os

import torch

N = 7
P0 = [0.5, -1.25, 2.0, 0.0, -0.75, 3.5, -2.25]
GRADS = [  # one gradient per step
    [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7],
    [-0.3, 0.25, 0.0, 1.5, -0.05, 0.2, -0.9],
    [0.8, -0.1, -0.6, 0.35, 0.45, -1.2, 0.05],
    [0.0, 0.6, -0.25, -0.7, 0.9, 0.15, -0.4],
    [-1.1, 0.3, 0.55, 0.2, -0.35, 0.65, 1.3],
]
LRS = [0.1, 0.1, 0.05, 0.05, 0.01]  # the rate changes between steps, as a schedule would change it


def f32(xs):
    """Python floats holding exactly the float32 values torch computed."""
    return [float(x) for x in torch.tensor(xs, dtype=torch.float32).tolist()]


def sgd_trajectory(momentum, nesterov, weight_decay, decoupled):
    p = torch.tensor(P0, dtype=torch.float32, requires_grad=True)
    # torch 1.13 has no SGDW: decoupled decay is p *= 1 - lr * wd before a decay-free SGD step,
    # exactly the order AdamW uses.
    opt = torch.optim.SGD([p], lr=LRS[0], momentum=momentum, nesterov=nesterov,
                          weight_decay=0.0 if decoupled else weight_decay)
    params = []
    for g, lr in zip(GRADS, LRS):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = torch.tensor(g, dtype=torch.float32)
        if decoupled:
            with torch.no_grad():
                p.mul_(1 - lr * weight_decay)
        opt.step()
        params.append([float(x) for x in p.detach().tolist()])
    return {"momentum": momentum, "nesterov": nesterov, "weight_decay": weight_decay,
            "decoupled_weight_decay": decoupled, "params": params}


def adam_trajectory(decoupled, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """torch.optim.Adam (coupled L2 decay) or torch.optim.AdamW (decoupled) over GRADS and LRS."""
    p = torch.tensor(P0, dtype=torch.float32, requires_grad=True)
    make = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = make([p], lr=LRS[0], betas=betas, eps=eps, weight_decay=weight_decay)
    params, exp_avg, exp_avg_sq = [], [], []
    for g, lr in zip(GRADS, LRS):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        params.append([float(x) for x in p.detach().tolist()])
        state = opt.state[p]
        exp_avg.append([float(x) for x in state["exp_avg"].tolist()])
        exp_avg_sq.append([float(x) for x in state["exp_avg_sq"].tolist()])
    return {"decoupled_weight_decay": decoupled, "weight_decay": weight_decay, "beta1": betas[0],
            "beta2": betas[1], "eps": eps, "params": params, "exp_avg": exp_avg,
            "exp_avg_sq": exp_avg_sq}


def epoch_schedule(make, base_lr, steps_per_epoch, epochs):
    """LR per optimizer step for a scheduler stepped once per epoch."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    sched = make(opt)
    lrs = []
    for _ in range(epochs):
        lrs += [opt.param_groups[0]["lr"]] * steps_per_epoch
        opt.step()
        sched.step()
    return lrs


def step_schedule(make, base_lr, steps):
    """LR per optimizer step for a scheduler stepped once per step."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    sched = make(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def clip_case(grads, max_norm):
    p = torch.zeros(len(grads), requires_grad=True)
    p.grad = torch.tensor(grads, dtype=torch.float32)
    norm = torch.nn.utils.clip_grad_norm_([p], max_norm)
    return {"grads": f32(grads), "max_norm": max_norm, "norm": float(norm),
            "clipped": [float(x) for x in p.grad.tolist()]}


def main():
    sgd = [
        sgd_trajectory(0.0, False, 0.0, False),
        sgd_trajectory(0.9, False, 0.0, False),
        sgd_trajectory(0.9, True, 0.0, False),
        sgd_trajectory(0.9, False, 5e-2, False),
        sgd_trajectory(0.9, True, 5e-2, False),
        sgd_trajectory(0.0, False, 5e-2, False),
        sgd_trajectory(0.9, False, 5e-2, True),
        sgd_trajectory(0.9, True, 5e-2, True),
    ]
    adam = [
        adam_trajectory(False, 0.0),
        adam_trajectory(False, 5e-2),  # Adam: L2 decay enters both moments
        adam_trajectory(True, 5e-2),  # AdamW: decay shrinks the weights before the step
        adam_trajectory(True, 0.0),
        # Betas far from the defaults and an eps as large as sqrt(v), so that where eps enters
        # (after the bias correction) and how the betas are used show in every element.
        adam_trajectory(False, 1e-2, betas=(0.5, 0.75), eps=0.1),
        adam_trajectory(True, 1e-1, betas=(0.0, 0.9), eps=1e-3),
    ]
    spe = 3  # steps per epoch
    schedules = [
        {"kind": "multistep", "base_lr": 0.1, "milestones": [2, 4], "gamma": 0.1,
         "steps_per_epoch": spe, "total_steps": 6 * spe,
         "lrs": epoch_schedule(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 4], 0.1),
                               0.1, spe, 6)},
        {"kind": "multistep", "base_lr": 0.5, "milestones": [1, 3, 3], "gamma": 0.5,
         "steps_per_epoch": spe, "total_steps": 5 * spe,
         "lrs": epoch_schedule(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [1, 3, 3], 0.5),
                               0.5, spe, 5)},
        {"kind": "exponential", "base_lr": 0.1, "gamma": 1 / 1.01,
         "steps_per_epoch": spe, "total_steps": 6 * spe,
         "lrs": epoch_schedule(lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 1 / 1.01),
                               0.1, spe, 6)},
        {"kind": "cosine", "base_lr": 0.1, "min_lr": 0.001, "steps_per_epoch": spe,
         "total_steps": 20,
         "lrs": step_schedule(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 20, 0.001),
                              0.1, 21)},
        {"kind": "cosine", "base_lr": 0.05, "min_lr": 0.0, "steps_per_epoch": spe,
         "total_steps": 7,
         "lrs": step_schedule(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 7), 0.05, 8)},
        {"kind": "constant", "base_lr": 0.2, "steps_per_epoch": spe, "total_steps": 9,
         "lrs": step_schedule(lambda o: torch.optim.lr_scheduler.ConstantLR(o, 1.0, 1), 0.2, 9)},
    ]
    clip = [
        clip_case([3.0, -4.0, 0.5, 0.25, -1.5, 2.0, 0.0, 1.0], 1.0),  # clipped
        clip_case([0.1, -0.2, 0.05, 0.3], 5.0),  # below the limit: unchanged
        clip_case([1e-3, 2e-3, -4e-3], 1e-3),  # small values
    ]
    out = {"generator": "scripts/make_optim_fixtures.py", "torch": torch.__version__,
           "sgd": {"p0": f32(P0), "grads": [f32(g) for g in GRADS], "lrs": LRS, "cases": sgd},
           "adam": {"cases": adam},  # p0, grads and lrs as for sgd
           "schedules": schedules, "clip": clip}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                        "optim_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
