#!/usr/bin/env python3
"""The CUDA sources compile where the toolkit is installed (CI has no GPU, but has CUDA 13).

The normal build is CPU-only (TRAINER_CUDA=OFF); a second full build with CUDA would add minutes
to the suite. This test compiles just what TRAINER_CUDA adds or switches on: models/cuda/*.cu with
nvcc, models/cuda/*.cpp and every C++ file that has a TRAINER_HAS_CUDA branch with the host
compiler (syntax and types, with the flags the build uses for them, plus the CUDA define and
headers); likewise comm/cuda/*.cpp (NCCL, pinned memory; nccl.h lives with the toolkit's headers).
Exit 77 (ctest's skip) when no nvcc is found.

usage: cuda_compile_test.py SOURCE_DIR BUILD_DIR
"""
import concurrent.futures
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

src, build = (os.path.realpath(p) for p in sys.argv[1:3])


def toolkit_root():
    """The CUDA toolkit's root: the folder holding bin/nvcc and include/cuda_runtime.h.

    The nvcc first on PATH is not always inside the toolkit: some machines put a small shell
    wrapper in /usr/local/bin (and CI's PATH may not have /usr/local/cuda/bin), so its folder says
    nothing about where the headers are. Look in the usual places and take the first whole toolkit.
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(on_path))))
    for root in filter(None, candidates):
        if os.access(os.path.join(root, "bin", "nvcc"), os.X_OK) and os.path.isfile(
                os.path.join(root, "include", "cuda_runtime.h")):
            return root
    return None


cuda_root = toolkit_root()
if cuda_root is None:
    print("skip: no CUDA toolkit (bin/nvcc with include/cuda_runtime.h) is installed here")
    sys.exit(77)
nvcc = os.path.join(cuda_root, "bin", "nvcc")
cuda_include = os.path.join(cuda_root, "include")
print("toolkit: " + cuda_root)

commands = {os.path.realpath(e["file"]): e for e in json.load(open(os.path.join(build, "compile_commands.json")))}


def host_flags():
    # Any C++ source of trainer_models carries the include paths and options the CUDA sources need.
    entry = commands[os.path.realpath(os.path.join(src, "models", "tensor.cpp"))]
    return entry


def syntax_check(path, template):
    args = shlex.split(template["command"]) if "command" in template else list(template["arguments"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-MD", "-MMD") or a.endswith((".cpp", ".cc")):
            continue
        if a == "-Werror":  # the CPU build's; the CUDA build is not held to it (CMakeLists.txt, TRAINER_WERROR)
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-DTRAINER_HAS_CUDA", "-I" + cuda_include, path]


failures = []
with tempfile.TemporaryDirectory() as tmp:
    cu = sorted(glob.glob(os.path.join(src, "models", "cuda", "*.cu")))
    cpp = sorted(glob.glob(os.path.join(src, "models", "cuda", "*.cpp")))
    comm_cpp = sorted(glob.glob(os.path.join(src, "comm", "cuda", "*.cpp")))
    switched = []
    for pattern in ("trainer/**/*.cpp", "models/**/*.cpp", "comm/**/*.cpp", "tests/*.cpp"):
        for f in glob.glob(os.path.join(src, pattern), recursive=True):
            if "/cuda/" not in f and "TRAINER_HAS_CUDA" in open(f, errors="replace").read():
                switched.append(f)
    if not cu or not cpp:
        print("models/cuda/ has no sources: nothing to check")
        sys.exit(1)
    # One job per file, as many at once as there are cores: the models/cuda kernels are a dozen
    # nvcc runs of several seconds each.
    jobs = []
    for i, f in enumerate(cu):
        cmd = [nvcc, "-std=c++17", "-arch=sm_90", "-I" + src, "-c", f, "-o", os.path.join(tmp, "%d.o" % i)]
        jobs.append(("nvcc", f, cmd, None))
    for f in cpp + comm_cpp + sorted(switched):
        template = commands.get(os.path.realpath(f), host_flags())
        jobs.append(("c++ ", f, syntax_check(f, template), template["directory"]))

    def run(job):
        return subprocess.run(job[2], capture_output=True, text=True, cwd=job[3])

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for (kind, f, _, _), r in zip(jobs, pool.map(run, jobs)):
            print(("ok  " if r.returncode == 0 else "FAIL") + " " + kind.strip() + " " + os.path.relpath(f, src))
            if r.returncode:
                failures.append(r.stderr)
for text in failures:
    print(text)
sys.exit(1 if failures else 0)
