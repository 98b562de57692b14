#!/usr/bin/python3
"""PyTorch reference fixtures for the C++ tests (tests/fixtures/*.safetensors).

Run with Debian's Python, which has python3-torch and python3-numpy (the `python3` first on PATH may
not have them):

    /usr/bin/python3 scripts/make_torch_fixtures.py            # writes into tests/fixtures/

The fixtures are committed, so building and running the tests never needs torch; rerun this script
only to change a fixture. Output is deterministic (fixed seeds, one CPU thread): a rerun rewrites
byte-identical files. No safetensors Python package is needed: the small writer below produces the
standard format the way the reference writer does (header "__metadata__" first, tensors ordered by
alignment then name, header padded with spaces to a multiple of 8).

Conventions inside the fixtures (also written into each file's __metadata__):
- tensors are in PyTorch's own layouts: activations NCHW, conv weights OIHW, linear weights [out, in];
- "param.<state_dict name>": parameter values the forward used; "buffer.<name>": batch-norm buffers
  after the one training-mode forward (momentum 0.1, running_var uses the unbiased batch variance);
- "input", "target" (I64 class indices), "output" (logits), "loss" (scalar, shape []),
  "grad.input", "grad.param.<name>": results of a float32 computation, like the C++ engine's;
- "f64.<name>": the same result from a float64 copy of the model and input (same values, promoted),
  for comparisons against more exact values; stored as F64.
"""

import argparse
import copy
import json
import os
import struct

# One thread: reductions happen in a fixed order, so reruns give identical bytes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MAX_FIXTURE_BYTES = 200 * 1024

_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
           np.dtype(np.int64): "I64", np.dtype(np.int32): "I32"}


def write_safetensors(path, tensors, metadata):
    """tensors: {name: numpy array}; metadata: {str: str}. Little-endian, reference ordering."""
    arrays = {}
    for name, a in tensors.items():
        a = np.asarray(a)
        if a.dtype not in _DTYPES:
            raise ValueError(f"{name}: unsupported dtype {a.dtype}")
        # np.array, not np.ascontiguousarray: the latter turns a scalar (shape []) into shape [1].
        arrays[name] = np.array(a, dtype=a.dtype.newbyteorder("<"), order="C", copy=True)
    # Largest alignment first, then by name: every tensor is naturally aligned in the data section.
    order = sorted(arrays, key=lambda n: (-arrays[n].dtype.itemsize, n))
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in order:
        a = arrays[name]
        header[name] = {"dtype": _DTYPES[a.dtype.newbyteorder("=")], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in order:
            f.write(arrays[name].tobytes())
    size = os.path.getsize(path)
    if size > MAX_FIXTURE_BYTES:
        raise SystemExit(f"{path}: {size} bytes, over the {MAX_FIXTURE_BYTES}-byte fixture limit")
    return size


def np_of(t):
    return t.detach().cpu().contiguous().numpy().copy()


def randomize_bn(module, gen):
    """BN affine parameters away from PyTorch's 1/0 init, so the fixtures exercise them."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


def train_step(net, x, target, label_smoothing=0.0):
    """One training-mode forward + backward on a copy; returns (net, output, loss, grad_input)."""
    x = x.clone().requires_grad_(True)
    net.train()
    out = net(x)
    loss = F.cross_entropy(out, target, label_smoothing=label_smoothing)
    loss.backward()
    return out, loss, x.grad


def put_results(store, prefix, net, out, loss, grad_input, names=None, out_name="output",
                loss_name="loss", grad_prefix="grad", with_buffers=True):
    """Adds output/loss/grads/buffers of one run under `prefix` ("" or "f64.")."""
    store[prefix + out_name] = np_of(out)
    store[prefix + loss_name] = np_of(loss)
    store[prefix + grad_prefix + ".input"] = np_of(grad_input)
    for n, p in net.named_parameters():
        if names is None or n in names:
            store[f"{prefix}{grad_prefix}.param.{n}"] = np_of(p.grad)
    if with_buffers:
        for n, b in net.named_buffers():
            store[f"{prefix}buffer.{n}"] = np_of(b)


COMMON_META = {
    "generator": "scripts/make_torch_fixtures.py",
    "torch_version": torch.__version__,
    "layouts": "activations NCHW, conv weights OIHW, linear weights [out, in] (PyTorch layouts)",
    "naming": ("param.<state_dict name> = values used; buffer.<name> = BN buffers after one train-mode "
               "forward; input, target, output, loss, grad.input, grad.param.<name> = float32 run; "
               "f64.<name> = same result from a float64 copy"),
    "batchnorm": "train mode, eps 1e-5, momentum 0.1, running_var updated with the unbiased batch variance",
}


# ---------------------------------------------------------------------------------------------------
# (a) small CNN: conv(bias) -> BN -> ReLU -> max-pool -> flatten -> linear -> cross-entropy

def small_cnn():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=True),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )
    randomize_bn(net, gen)
    x = torch.randn(4, 3, 8, 8, generator=gen)
    target = torch.randint(0, 10, (4,), generator=gen)

    store = {"input": np_of(x), "target": np_of(target)}
    for n, p in net.named_parameters():
        store["param." + n] = np_of(p)

    for prefix, dtype in (("", torch.float32), ("f64.", torch.float64)):
        xx = x.to(dtype)
        # Plain cross-entropy: outputs, grads, BN buffers after the forward, then eval with them.
        m = copy.deepcopy(net).to(dtype)
        out, loss, gin = train_step(m, xx, target)
        put_results(store, prefix, m, out, loss, gin)
        m.eval()
        with torch.no_grad():
            store[prefix + "output_eval"] = np_of(m(xx))
        # Label smoothing 0.1 on a fresh copy (its buffers would equal the ones above).
        m = copy.deepcopy(net).to(dtype)
        out, loss, gin = train_step(m, xx, target, label_smoothing=0.1)
        store[prefix + "loss_ls"] = np_of(loss)
        store[prefix + "grad_ls.input"] = np_of(gin)
        for n, p in m.named_parameters():
            store[f"{prefix}grad_ls.param.{n}"] = np_of(p.grad)

    meta = dict(COMMON_META)
    meta.update({
        "architecture": ("nn.Sequential(0: Conv2d(3, 8, 3, padding=1, bias=True), 1: BatchNorm2d(8), "
                         "2: ReLU, 3: MaxPool2d(2), 4: Flatten, 5: Linear(128, 10)); "
                         "loss CrossEntropyLoss(mean)"),
        "state_dict": ("0.weight [8,3,3,3], 0.bias [8], 1.weight [8], 1.bias [8], 1.running_mean [8], "
                       "1.running_var [8], 1.num_batches_tracked [] (I64), 5.weight [10,128], 5.bias [10]"),
        "init": "torch.manual_seed(0) default init; BN weight U(0.5,1.5), bias N(0,0.1^2)",
        "note": ("the conv bias feeds a train-mode BN, which removes it: grad.param.0.bias is zero up to "
                 "rounding (~1e-7 in float32); compare it with an absolute tolerance"),
        "extra": ("output_eval = eval-mode forward with the running stats after the training forward; "
                  "loss_ls, grad_ls.input, grad_ls.param.* = CrossEntropyLoss(label_smoothing=0.1) "
                  "from a fresh copy of the same model"),
    })
    return {"small_cnn.safetensors": (store, meta)}


# ---------------------------------------------------------------------------------------------------
# (b) two CIFAR ResNet basic blocks (He et al. 2016; akamaster/pytorch_resnet_cifar10)

class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        # Option A: subsample, zero-pad planes//4 channels on each side; no parameters.
        self.pad = planes // 4 if (stride != 1 or in_planes != planes) else None

    def shortcut(self, x):
        if self.pad is None:
            return x
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad), "constant", 0)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class TwoBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.A = BasicBlock(16, 32, stride=2)
        self.B = BasicBlock(32, 32, stride=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        self.out_A = self.A(x)
        self.out_B = self.B(self.out_A)
        return self.fc(self.out_B.mean(dim=(2, 3)))


def resnet_block():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2)
    net = TwoBlocks()
    for m in net.modules():  # akamaster's _weights_init
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight)
    randomize_bn(net, gen)
    x = torch.randn(2, 16, 8, 8, generator=gen)
    target = torch.randint(0, 10, (2,), generator=gen)

    # All of it does not fit in one 200 KB file (parameters alone are 131 KB in F32): the forward
    # pass goes in resnet_block.safetensors, the backward in resnet_block_grads.safetensors, and the
    # float64 conv-weight gradients (258 KB) are left out.
    fwd = {"input": np_of(x), "target": np_of(target)}
    bwd = {}
    for n, p in net.named_parameters():
        fwd["param." + n] = np_of(p)
    small = [n for n, _ in net.named_parameters() if "conv" not in n]

    for prefix, dtype in (("", torch.float32), ("f64.", torch.float64)):
        m = copy.deepcopy(net).to(dtype)
        out, loss, gin = train_step(m, x.to(dtype), target)
        fwd[prefix + "output.A"] = np_of(m.out_A)
        fwd[prefix + "output.B"] = np_of(m.out_B)
        fwd[prefix + "output"] = np_of(out)
        fwd[prefix + "loss"] = np_of(loss)
        for n, b in m.named_buffers():
            fwd[f"{prefix}buffer.{n}"] = np_of(b)
        bwd[prefix + "grad.input"] = np_of(gin)
        for n, p in m.named_parameters():
            if prefix == "" or n in small:
                bwd[f"{prefix}grad.param.{n}"] = np_of(p.grad)

    meta = dict(COMMON_META)
    meta.update({
        "architecture": (
            "x [2,16,8,8] -> A = BasicBlock(16->32, stride 2, option-A shortcut: "
            "F.pad(x[:, :, ::2, ::2], (0,0,0,0,8,8))) -> B = BasicBlock(32->32, stride 1, identity) "
            "-> global average pool -> fc = Linear(32, 10) -> CrossEntropyLoss(mean). "
            "BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); conv 3x3 padding 1, no bias"),
        "state_dict": ("A.conv1.weight [32,16,3,3], A.bn1.{weight,bias,running_mean,running_var} [32], "
                       "A.bn1.num_batches_tracked [], A.conv2.weight [32,32,3,3], A.bn2.*, "
                       "B.conv1.weight [32,32,3,3], B.bn1.*, B.conv2.weight [32,32,3,3], B.bn2.*, "
                       "fc.weight [10,32], fc.bias [10]"),
        "init": "kaiming_normal_ conv and linear weights (seed 0); BN weight U(0.5,1.5), bias N(0,0.1^2)",
        "files": ("resnet_block.safetensors: input, target, param.*, output.A, output.B, output, loss, "
                  "buffer.* (float32 and f64.); resnet_block_grads.safetensors: grad.input, grad.param.* "
                  "(float32), f64.grad.input and f64.grad.param.* of the BN and fc parameters only "
                  "(float64 conv-weight gradients would exceed the 200 KB fixture limit)"),
    })
    return {"resnet_block.safetensors": (fwd, meta), "resnet_block_grads.safetensors": (bwd, meta)}


# ---------------------------------------------------------------------------------------------------
# (c) a plain numpy-written file for the reader's interoperability test

def safetensors_numpy():
    store = {
        "f32_matrix": (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) / 4,
        "f64_vector": np.array([1.0, -2.5, 1e-300, np.pi], dtype=np.float64),
        "i64_labels": np.array([-1, 0, 7, 2**40 + 3], dtype=np.int64),
        "i32_grid": np.array([[1, -2], [2**31 - 1, -2**31]], dtype=np.int32),
        "scalar": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    meta = {"writer": "numpy " + np.__version__, "purpose": "safetensors reader interoperability test"}
    return {"safetensors_numpy.safetensors": (store, meta)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for make in (small_cnn, resnet_block, safetensors_numpy):
        for fname, (store, meta) in make().items():
            path = os.path.join(args.out, fname)
            size = write_safetensors(path, store, meta)
            print(f"{os.path.relpath(path)}: {len(store)} tensors, {size} bytes")


if __name__ == "__main__":
    main()
