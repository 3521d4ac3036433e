"""Helpers the bench scripts share: Wikipedia-like sequence lengths and the CPU they ran on."""
import os
import platform
import random
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def histogram(name):
    """[(length, count)] from data/<name>.hist (`length count` lines, # comments)."""
    hist = []
    with open(os.path.join(ROOT, "data", name + ".hist")) as f:
        for line in f:
            line = line.split("#")[0].split()
            if len(line) == 2:
                hist.append((int(line[0]), int(line[1])))
    return hist


def wiki_lengths(n, seed):
    """n sequence lengths drawn (seeded) from data/wikipedia_512.hist."""
    hist = histogram("wikipedia_512")
    rng = random.Random(seed)
    return rng.choices([l for l, _ in hist], weights=[c for _, c in hist], k=n)


def cpu():
    """(model name, the SIMD instruction sets present) from /proc/cpuinfo."""
    model, flags = platform.processor(), ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model in ("", "x86_64"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    isa = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {x}" in flags]
    return model, "+".join(isa)


def write_atomic(path, text):
    """Writes text to path through a temporary file renamed over it (a reader never sees half)."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def demo_data(build, data):
    """(packbert, the demo corpus's .seqs, its .packs): made by `packbert demo --max-steps 0` in
    `data` when absent."""
    exe = os.path.join(build, "packbert")
    seqs, packs = os.path.join(data, "gcide.seqs"), os.path.join(data, "gcide.packs")
    if not (os.path.exists(seqs) and os.path.exists(packs)):
        subprocess.run([exe, "demo", "--max-steps", "0", "--workdir", data], check=True,
                       stdout=subprocess.DEVNULL)
    return exe, seqs, packs
