#!/usr/bin/env python3
"""Makes the CUDA backend's kernels runnable on the host (run.sh drives it).

usage: emulate.py SOURCE_DIR OUT_DIR

- Every models/cuda/*.cu (and .cuh) is rewritten into OUT_DIR/models/cuda as C++ (.cpp, .cuh):
  each `kernel<<<grid, block, shared, stream>>>(args)` becomes `emulated_launch(whole_grid, grid,
  block, kernel, args)` (cuda_runtime.h here). whole_grid is false for the kernels that stride over
  the grid (their body reads gridDim.x or calls grid_stride()), so they run on a few blocks only.
- OUT_DIR/emulated_backend.cpp defines cuda::cuda_backend(): the CUDA backend's own methods that
  launch our kernels, copied from models/cuda/cuda_backend.cpp (so its wiring is what runs), our
  batch norm op (models/cuda/batch_norm.cu) for channels-last activations. It is a
  ForwardingBackend over the CPU backend, so the CPU's ops do the rest (cuDNN's and cuBLAS's:
  convolution, pooling, the LSTM, GEMM, copies; batch norm in the CPU's blocked layouts), over host
  memory that says it is not host memory (is_host() false). Each emulated method notes its calls
  (written at exit under $CUDA_EMULATION_CALLS), and OUT_DIR/emulated_methods.txt lists them, for
  check_coverage.py.
  The emulated methods are an explicit list (`emulated`); generation fails when a CudaBackend
  method calls a kernel without being listed, or a .cu file's kernels are reached from nothing
  emulated and not listed as run elsewhere (`not_emulated`).
"""
import glob
import os
import re
import sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(out, "models", "cuda"), exist_ok=True)


def split_top(text):
    """Splits a launch configuration at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "(["
        depth -= ch in ")]"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()]


def grid_striding(text):
    """The names of the __global__ functions whose body strides over the grid."""
    names = set()
    for m in re.finditer(r"__global__\s+void\s+(\w+)\s*\(", text):
        body_start = text.index("{", m.end())
        depth, i = 0, body_start
        while True:
            depth += text[i] == "{"
            depth -= text[i] == "}"
            i += 1
            if depth == 0:
                break
        body = text[body_start:i]
        if "grid_stride()" in body or "gridDim.x" in body:
            names.add(m.group(1))
    return names


def convert(text, striding):
    result, i = "", 0
    while True:
        j = text.find("<<<", i)
        if j < 0:
            return result + text[i:]
        k = text.find(">>>", j)
        m = re.search(r"([A-Za-z_]\w*(?:<[^<>;]*>)?)\s*$", text[i:j])
        name = m.group(1)
        config = split_top(text[j + 3:k])
        assert text[k + 3] == "(", "a launch without arguments: " + text[j:k + 10]
        whole = "false" if name.split("<")[0] in striding else "true"
        result += text[i:i + m.start(1)] + "emulated_launch(%s, %s, %s, %s, " % (whole, config[0], config[1], name)
        i = k + 4


sources = sorted(glob.glob(os.path.join(src, "models/cuda/*.cu")) + glob.glob(os.path.join(src, "models/cuda/*.cuh")))
texts = {path: open(path).read() for path in sources}
striding = set().union(*(grid_striding(t) for t in texts.values()))
for path, text in texts.items():
    name = os.path.basename(path)
    target = name[:-3] + ".cpp" if name.endswith(".cu") else name
    with open(os.path.join(out, "models", "cuda", target), "w") as f:
        f.write(convert(text, striding))


# ---- The backend: CudaBackend's kernel-launching methods, the CPU's ops for everything else.
backend_cpp = open(os.path.join(src, "models/cuda/cuda_backend.cpp")).read()
helpers = backend_cpp[backend_cpp.index("namespace {") + len("namespace {"):backend_cpp.index("class CudaBackend")]
cls = backend_cpp[backend_cpp.index("class CudaBackend"):]
cls = cls[:cls.index("\n};\n")]


def members(text):
    """(name, source) of each member function defined at the class's top level."""
    found, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"  (?:[\w:<>,*& ]+?)\b(\w+)\((.*)", lines[i])
        if m and not lines[i].startswith("   ") and "(" in lines[i]:
            depth, body = 0, []
            while True:
                code = lines[i].split("//")[0].rstrip()  # a trailing comment is not code
                depth += code.count("{") - code.count("}")
                body.append(lines[i])
                i += 1
                if depth == 0 and (code.endswith("}") or code.endswith(";")):
                    break
            found.append((m.group(1), "\n".join(body)))
        else:
            i += 1
    return found


# The methods that launch our kernels, and their scratch and result helpers. The layout choice stays
# the CPU's: its convolutions (which stand in for cuDNN's) pick their own layouts, and the kernels
# take any layout (ActivationDims).
own = {"scratch", "read_result", "read_count"}
# Methods that launch our kernels around a cuBLAS call (the bf16 layer GEMM's copies): the CPU's
# product stands in for the whole method, as it does for cuBLAS.
library = {"layer_gemm"}
# The emulated launching methods, by name: a list rather than a search for "launch_" in the bodies,
# so that a method that launches some other way cannot fall back to the CPU's op unseen (its parity
# test would then compare the CPU with itself). The checks below fail the generation when a method
# calls a launch_ function without being listed, when a listed one calls none, and when a kernel
# (any launch_ function the .cu files define) is reached neither from here nor from not_emulated.
emulated = {
    "accumulate_moments", "adam_update", "add", "attention_backward", "attention_forward",
    "batchnorm_update_running", "broadcast_rows", "ctc_loss", "dequantize_blocks", "embedding_backward",
    "embedding_forward", "from_half", "from_nchw", "gather_rows", "hardtanh_backward", "hardtanh_forward",
    "image_to_sequence", "lerp", "lookahead_backward", "lookahead_forward", "lstm_cell_backward",
    "lstm_cell_forward", "magnitude_histogram", "mask_width", "momentum_correction",
    "orthonormalize_columns", "pack_sequences", "quantize_blocks", "relu_backward", "relu_forward", "scale",
    "scatter_fill", "scatter_rows", "select_at_least", "select_tokens", "sequence_gather",
    "sequence_to_image", "sgd_update", "shortcut_a_backward", "shortcut_a_forward", "softmax_cross_entropy",
    "sparse_to_dense", "subtract", "sum_of_squares", "sum_of_squares_into", "sum_quantized_blocks",
    "sum_rows", "swap_axes", "to_half", "to_nchw", "transpose", "unpack_sequences",
}
# The launch_ functions no emulated method calls, and where they run instead.
not_emulated = {
    "launch_begin_step": "cuda_step_capture.cpp (runtime.cuda_graph needs a GPU)",
    "launch_end_step": "cuda_step_capture.cpp (runtime.cuda_graph needs a GPU)",
    "launch_clip_decide": "cuda_step_capture.cpp (runtime.cuda_graph needs a GPU)",
    "launch_copy_if_skipped": "cuda_step_capture.cpp (runtime.cuda_graph needs a GPU)",
    "launch_poison_if_nonfinite": "cuda_step_capture.cpp (runtime.cuda_graph needs a GPU)",
    "launch_scale_by_control": "cuda_step_capture.cpp (runtime.cuda_graph needs a GPU)",
    "launch_filter_to_channels_last": "cudnn_conv.cpp (the CPU's convolutions stand in for cuDNN's)",
    "launch_filter_from_channels_last": "cudnn_conv.cpp (the CPU's convolutions stand in for cuDNN's)",
    "launch_to_bf16": "cudnn_conv.cpp (the CPU's convolutions stand in for cuDNN's)",
    "launch_from_bf16": "cudnn_conv.cpp (the CPU's convolutions stand in for cuDNN's)",
    "launch_to_bf16_2d": "layer_gemm (the CPU's product stands in for cuBLAS's)",
    "launch_fill": "cuda_device.cpp (the emulation's memory is host memory)",
}
# Kernels launched by an op class rather than a launch_ function: emulated through the class.
op_files = {"batch_norm.cu": "make_batchnorm_op (channels-last batch norm)"}

methods = members(cls)
problems = []
for name, body in methods:
    calls = "launch_" in body
    if calls and name not in emulated and name not in library:
        problems.append("%s calls a kernel but is not listed in emulate.py's `emulated`" % name)
    if name in emulated and not calls:
        problems.append("%s is listed as emulated but calls no launch_ function" % name)
problems += ["%s is listed as emulated but CudaBackend has no such method" % n
             for n in sorted(emulated - {name for name, _ in methods})]
reached = set()
for name, body in methods:
    if name in emulated:
        reached |= set(re.findall(r"\b(launch_\w+)\(", body))
for path, text in texts.items():
    if not path.endswith(".cu") or "<<<" not in text:
        continue
    defined = set(re.findall(r"^cudaError_t\s+(launch_\w+)\(", text, re.M))
    if not defined and os.path.basename(path) not in op_files:
        problems.append("%s launches kernels outside any launch_ function" % os.path.basename(path))
    for launch in sorted(defined - reached - set(not_emulated)):
        problems.append("%s (%s) is reached from no emulated method and not listed in `not_emulated`"
                        % (launch, os.path.basename(path)))
if problems:
    sys.exit("emulate.py:\n  " + "\n  ".join(problems))


def noting(name, body):
    """The method's body with a first statement that notes its call (the suite's coverage check)."""
    m = re.search(r"\)\s*(?:const\s*)?override\s*\{", body)
    if not m:
        sys.exit("emulate.py: %s: no `override {` to put its call's note after" % name)
    return body[:m.end()] + "\n    note_call(\"%s\");" % name + body[m.end():]


launching = [(name, noting(name, body) if name in emulated else body)
             for name, body in methods if name in emulated or name in own]
# The list the coverage check (check_coverage.py) holds the noted calls against.
with open(os.path.join(out, "emulated_methods.txt"), "w") as f:
    f.write("".join(name + "\n" for name in sorted(emulated)))

with open(os.path.join(out, "emulated_backend.cpp"), "w") as f:
    f.write("""// Generated by scripts/cuda_emulation/emulate.py from models/cuda/cuda_backend.cpp.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "models/backend.h"
#include "models/cuda/cuda_backend.h"
#include "models/forwarding_backend.h"
#include "models/cuda/host_ints.h"
#include "models/cuda/kernels.h"

namespace trainer::models::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA (emulated): ") + what);
}

// Which emulated methods this process called, written at exit to $CUDA_EMULATION_CALLS/<pid> when
// that is set: scripts/cuda_emulation/check_coverage.py checks that the tests call every one (a
// listed method no test reaches is a kernel no test compares with the CPU).
class CallNotes {
 public:
  void note(const char* method) { called_.insert(method); }
  ~CallNotes() {
    const char* dir = std::getenv("CUDA_EMULATION_CALLS");
    if (!dir) return;
    std::filesystem::create_directories(dir);
    std::ofstream out(std::filesystem::path(dir) / std::to_string(::getpid()));
    for (const std::string& name : called_) out << name << "\\n";
  }

 private:
  std::set<std::string> called_;
};
CallNotes& call_notes() {
  static CallNotes notes;
  return notes;
}
void note_call(const char* method) { call_notes().note(method); }
""" + helpers + """
// A ForwardingBackend over the CPU backend: what is not overridden here (cuDNN's and cuBLAS's ops,
// the layout choice) is the CPU's, and whatever op families backend.h grows are forwarded without
// this generator knowing them.
class EmulatedCudaBackend final : public ForwardingBackend {
 public:
  EmulatedCudaBackend() : ForwardingBackend(cpu_backend()) {}
  std::string name() const override { return "cuda"; }
  std::string describe() const override { return "cuda (emulated on the host: scripts/cuda_emulation)"; }
  bool is_host() const override { return false; }
  void* allocate(size_t bytes) override { return host_memory().allocate(bytes); }
  void free(void* p) override { host_memory().free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { if (bytes) std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { if (bytes) std::memcpy(dst, src, bytes); }
  void fill(int64_t n, float value, float* y) override { std::fill(y, y + n, value); }
  void synchronize() override {}
  // Launches run to completion in issue order: a second stream is the same memory, marks need no wait.
  std::unique_ptr<DeviceStream> make_stream() override { return make_synchronous_stream(*this); }
  // scratch()'s growth (cuda_backend.cpp's grows stream-ordered once a second stream exists; here
  // every call has finished when it returns).
  void grow_scratch(size_t bytes) {
    if (scratch_) host_memory().free(scratch_);
    scratch_ = host_memory().allocate(bytes);
    scratch_bytes_ = bytes;
  }

  // ---- Launching our kernels: models/cuda/cuda_backend.cpp's own methods.
""" + "\n".join(body for _, body in launching) + """

  // Our batch norm kernels take channels-last activations only (the CUDA backend's layout); the
  // CPU's convolutions, which stand in for cuDNN's, may hand the model's layers blocked ones
  // (TRAINER_ACTIVATION_LAYOUT=nhwc keeps them channels-last: CMakeLists.txt here sets it for
  // emulated_cuda_backend_test, so its model steps run our kernels too).
  std::unique_ptr<BatchNormOp> make_batchnorm(const BatchNormGeometry& g) override {
    if (g.layout == Layout::kChannelsLast) return make_batchnorm_op(g, memory_, stream_);
    return ForwardingBackend::make_batchnorm(g);
  }
  // ---- The rest (cuDNN, cuBLAS, the layout choice): the CPU backend's ops (ForwardingBackend).

 private:
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  double host_result_[2] = {0, 0};
  // No step capture here (runtime.cuda_graph needs a GPU): the launching methods' checks see none.
  struct NoCapture {
    bool deferred_loss() const { return false; }
    StepControl* control() const { return nullptr; }
  };
  std::unique_ptr<NoCapture> capture_;
  DeviceMemory& memory_ = host_memory();
};

}  // namespace

// One backend whatever the settings: they choose among cuDNN's and cuBLAS's modes (TF32, bf16,
// deterministic algorithms), and the CPU's fp32 ops stand in for all of those here.
Backend& cuda_backend(int, const BackendSettings&) {
  static EmulatedCudaBackend* backend = new EmulatedCudaBackend;
  return *backend;
}
int64_t convolution_searches() { return 0; }  // the CPU's convolutions stand in for cuDNN's: no search

}  // namespace trainer::models::cuda
""")
