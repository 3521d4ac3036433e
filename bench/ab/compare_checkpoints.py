#!/usr/bin/env python3
"""Compares the tensors of two safetensors files byte for byte (#44: the fp32 cpu backend's
training is unchanged). Prints one line per tensor that differs and a summary; exit 1 if any
tensor of the first file differs or is missing from the second. Metadata is not compared (it
records options and versions). Usage: compare_checkpoints.py A.safetensors B.safetensors"""
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def main():
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    differ = [k for k in sorted(a) if a[k] != b.get(k)]
    for k in differ:
        print(f"differs: {k}")
    print(f"{len(a) - len(differ)} of {len(a)} tensors bitwise equal"
          + (f"; {len(set(b) - set(a))} only in the second" if set(b) - set(a) else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
