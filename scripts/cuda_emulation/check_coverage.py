#!/usr/bin/env python3
"""Checks that the emulated tests called every emulated launching method.

usage: check_coverage.py METHODS_FILE CALLS_DIR

METHODS_FILE is emulate.py's list (one method a line); CALLS_DIR holds one file per test process,
the methods it called (emulated_backend.cpp writes them at exit when $CUDA_EMULATION_CALLS is set).
A listed method that no test calls is a kernel that no parity test compares with the CPU: the
method's CPU op would not be reached either, so nothing would fail unless this does.
"""
import os
import sys

methods_file, calls_dir = sys.argv[1], sys.argv[2]
listed = {line.strip() for line in open(methods_file) if line.strip()}
called = set()
files = sorted(os.listdir(calls_dir)) if os.path.isdir(calls_dir) else []
for name in files:
    called |= {line.strip() for line in open(os.path.join(calls_dir, name)) if line.strip()}
missing = sorted(listed - called)
if missing:
    sys.exit("emulated methods no test called (%d test processes noted calls): %s"
             % (len(files), ", ".join(missing)))
print("all %d emulated methods called, by %d test processes" % (len(listed), len(files)))
