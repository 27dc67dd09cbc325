"""Could the noise kernel load from disk instead of being traced by Dynamo at every start?

Two ways of keeping ``dmae_fast.noise.compiled.noisy_rows`` compiled on disk, each tried on 7 clean
224x224 images and 64 rows: an AOTInductor package (``torch._inductor.aoti_compile_and_package``
/ ``aoti_load_package``) and Dynamo's precompiled function (``torch.compile(...).aot_compile`` /
``torch.compiler.load_compiled_function``), against today's kernel (``jit``: ``torch.compile``,
traced at the first call, its code from Inductor's disk cache). ``compile`` writes the file; ``load``, in a fresh
process, times the load and the first call, checks the values against the torch-op reference,
and times 5 calls on one thread against 5 calls on each of 2 threads (the CPU fast body's
workers need a kernel that frees the GIL: the Dynamo-compiled kernel scales 2.1x there).

    python bench/experiments/2026-11-26-startup/noise_loaders.py {aoti,precompile} compile
    python bench/experiments/2026-11-26-startup/noise_loaders.py {aoti,precompile,jit} load
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from dmae_fast.noise.compiled import SERIAL_OPTIONS, noisy_rows
from dmae_fast.noise.contract import gaussian_noise, key_words

FILES = {"aoti": "/tmp/noise_aoti.pt2", "precompile": "/tmp/noise_precompile.bin", "jit": None}


def inputs(slots: int = 7, rows: int = 64) -> tuple[torch.Tensor, ...]:
    clean = torch.rand(slots, 3, 224, 224)
    index = torch.arange(rows)
    key = torch.tensor(key_words(1), dtype=torch.int64)
    return clean, index % slots, torch.tensor(0.25), key, index, index % 2, index * 3


class Noise(torch.nn.Module):
    def forward(self, clean, slot, sigma, key, image, phase, sample):
        return noisy_rows(clean, slot, sigma, key, image, phase, sample)


def compile_file(kind: str, args: tuple[torch.Tensor, ...]) -> None:
    if kind == "jit":  # today's kernel: nothing to write (Inductor's own disk cache is filled by a first "load")
        return
    if kind == "aoti":
        rows, slots = torch.export.Dim("rows", min=2), torch.export.Dim("slots", min=2)
        shapes = ({0: slots}, {0: rows}, None, None, {0: rows}, {0: rows}, {0: rows})
        program = torch.export.export(Noise(), args, dynamic_shapes=shapes)
        torch._inductor.aoti_compile_and_package(program, package_path=FILES[kind], inductor_configs={"cpp.threads": 1})
        return
    for i in (0, 1, 4, 5, 6):
        torch._dynamo.mark_dynamic(args[i], 0)
    with torch.inference_mode():
        compiled = torch.compile(noisy_rows, fullgraph=True, options=SERIAL_OPTIONS).aot_compile((args, {}))
        compiled.save_compiled_function(FILES[kind])


def load_and_time(kind: str, args: tuple[torch.Tensor, ...]) -> None:
    start = time.perf_counter()
    if kind == "jit":  # what NoiseSource(serial=True) compiles; traced by Dynamo at the first call
        for i in (0, 1, 4, 5, 6):
            torch._dynamo.mark_dynamic(args[i], 0)
        functions = [torch.compile(noisy_rows, options=SERIAL_OPTIONS)] * 2
    elif kind == "aoti":
        functions = [torch._inductor.aoti_load_package(FILES[kind]) for _ in range(2)]  # one runner per thread
    else:
        with open(FILES[kind], "rb") as file:
            functions = [torch.compiler.load_compiled_function(file)] * 2
    loaded = time.perf_counter()
    with torch.inference_mode():
        out = functions[0](*args)
    first = time.perf_counter()
    clean, slot, sigma, _, image, phase, sample = args
    reference = clean[slot] + float(sigma) * gaussian_noise(1, image, phase, sample, tuple(clean.shape[1:]))
    print(f"{kind}: load {loaded - start:.3f} s, first call {first - loaded:.3f} s, "
          f"max |difference| from the reference {(out - reference).abs().max().item():.2e}")

    def work(i: int) -> None:
        torch.set_num_threads(1)
        with torch.inference_mode():
            for _ in range(5):
                functions[i](*args)

    start = time.perf_counter()
    work(0)
    one = time.perf_counter() - start
    with ThreadPoolExecutor(2) as pool:
        start = time.perf_counter()
        list(pool.map(work, (0, 1)))
        two = time.perf_counter() - start
    print(f"{kind}: 5 calls on 1 thread {one:.3f} s; 5 on each of 2 threads {two:.3f} s: scaling {2 * one / two:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(FILES))
    parser.add_argument("step", choices=("compile", "load"))
    options = parser.parse_args()
    torch.set_num_threads(1)
    (compile_file if options.step == "compile" else load_and_time)(options.kind, inputs())
