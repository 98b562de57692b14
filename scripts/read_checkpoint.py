#!/usr/bin/python3
"""Reads a checkpoint's model.safetensors with NumPy alone (no safetensors package): proof that the
trainer writes the standard format (trainer/checkpoint/checkpoint.h).

    scripts/read_checkpoint.py runs/quickstart/checkpoints/step_400/model.safetensors

Prints the metadata, then one line per tensor: name, dtype, shape, and a checksum (float64 sum of
the values and CRC-32 of the raw bytes). When the file's folder has the trainer's manifest.json,
also checks the file's size and CRC-32 against it and prints the number of processes that wrote
the checkpoint and its global batch (what an elastic resume on another number keeps). Also reads a
rank<R>.state file (its metadata holds that rank's data position). Exits 1 with one line on a
malformed file.
"""
import json
import os
import struct
import sys
import zlib

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "U8": "u1", "F16": "<f2"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"header length {n} runs past the end of the file")
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    covered = 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = info["data_offsets"]
        if begin != covered:
            raise ValueError(f"tensor {name}: data does not follow the previous tensor")
        dtype = np.dtype(DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise ValueError(f"tensor {name}: {end - begin} bytes do not fit {info['dtype']} {list(shape)}")
        tensors[name] = (info["dtype"], np.frombuffer(data, dtype=dtype, count=(end - begin) // dtype.itemsize,
                                                      offset=begin).reshape(shape))
        covered = end
    if covered != len(data):
        raise ValueError(f"{len(data) - covered} bytes after the last tensor")
    return metadata, tensors, raw


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = sys.argv[1]
    try:
        metadata, tensors, raw = read_safetensors(path)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"read_checkpoint: {path}: {e}", file=sys.stderr)
        return 1
    print("metadata:", json.dumps(metadata, sort_keys=True))
    total = 0
    for name, (dtype, a) in tensors.items():
        total += a.size
        print(f"{name} {dtype} {list(a.shape)} sum={a.astype(np.float64).sum():.9g} "
              f"crc32={zlib.crc32(a.tobytes()):08x}")
    print(f"{len(tensors)} tensors, {total} values")

    manifest_path = os.path.join(os.path.dirname(os.path.abspath(path)), "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        entry = manifest.get("files", {}).get(os.path.basename(path))
        if "world_size" in manifest:
            batch = manifest.get("global_batch", 0)
            print(f"checkpoint: step {manifest.get('step')}, written by {manifest['world_size']} processes, global batch "
                  f"{batch if batch else 'data.batch_size x processes'}")
        if entry is not None:
            crc = f"{zlib.crc32(raw):08x}"
            if entry["bytes"] != len(raw) or entry["crc32"] != crc:
                print(f"read_checkpoint: {path}: {len(raw)} bytes, CRC-32 {crc}; the manifest says "
                      f"{entry['bytes']} bytes, CRC-32 {entry['crc32']}", file=sys.stderr)
                return 1
            print(f"manifest: {os.path.basename(path)} size and CRC-32 match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
