"""The C kernel of --sound's noise on a CPU (kernels/sound_noise_cpu.c): the reference's inputs bit for bit
(images and normalized patch rows, any thread count), its lookup on hand-made tables whose thresholds sit on
and beside the drawn values and crowd into one bucket, NoiseSource's choice of it, a missing compiler, and its
cache: a library altered, truncated, without the kernel's symbol or replaced by a FIFO is never loaded but built
again, and where no build works the compiled torch ops run, said in one line and named in the start line."""

import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import rows_without

from dmae_fast.cli.certify import main as certify_main
from dmae_fast.kernels import sound_noise_cpu
from dmae_fast.noise.compiled import C_KERNEL, COMPILED, NoiseSource, sound_patches
from dmae_fast.noise.contract import key_words, uint32_stream
from dmae_fast.noise.patch_layout import PatchLayout
from dmae_fast.noise.sound import sound_rows
from dmae_fast.stats.rounded_gaussian import SoundTable, sound_table

CPU = torch.device("cpu")
CC = shutil.which(os.environ.get("CC", "cc"))
# the kernel's source with Z one too high on every row (WRONG) or on rows 5 and after of a call (LATE)
_DRAW = "noise[2 * i + lane] = z - (int32_t)K;"
WRONG, LATE = (sound_noise_cpu.SOURCE.read_text().replace(_DRAW, _DRAW.replace(";", f" + {plus};"))
               for plus in ("1", "(r >= 5)"))


@pytest.fixture(autouse=True, scope="module")
def _c_compiler() -> None:
    """Skip where no library can be built (after the suite's private cache is set: never the user's)."""
    if sound_noise_cpu.load() is None:
        pytest.skip(f"no C kernel ({sound_noise_cpu.load_failure() or 'no C compiler'})")


def _rows(count: int, slots: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Slots, images, phases and samples of ``count`` rows; indices near 2**32 among them."""
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 2**32, (count,), generator=g, dtype=torch.int64)
    sample = torch.randint(0, 2**32, (count,), generator=g, dtype=torch.int64)
    sample[0] = 2**32 - 1
    return torch.arange(count) % slots, image, torch.randint(0, 3, (count,), generator=g), sample


def _clean(shape: tuple[int, ...], grid: int, slots: int = 3) -> torch.Tensor:
    return torch.randint(0, grid + 1, (slots, *shape), generator=torch.Generator().manual_seed(1)).float() / grid


@pytest.mark.parametrize("sigma,grid,seed,shape,threads", [
    (0.25, 255, 0, (3, 8, 8), 1),
    (0.5, 255, 2**40 + 12345, (1, 5, 7), 3),  # an odd number of elements: the last pair's second value dropped
    (1.0, 255, 2**63 + 7, (3, 33, 31), 2),
    (0.25, 16, 5, (1, 9, 7), 4),
])
def test_the_kernel_draws_the_references_inputs_bit_for_bit(sigma, grid, seed, shape, threads):
    table, clean, rows = sound_table(sigma, grid), _clean(shape, grid), _rows(7, 3, seed)
    want = sound_rows(clean, rows[0], grid, torch.tensor(table.thresholds), table.K, torch.tensor(key_words(seed)),
                      *rows[1:])
    got = sound_noise_cpu.sound_rows(clean, rows[0], table, key_words(seed), *rows[1:], threads=threads)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_the_kernel_draws_the_references_patch_rows_bit_for_bit():
    layout = PatchLayout(3, 16, 8, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    table, seed = sound_table(0.5, 255), 2**40 + 3
    clean, rows = layout.arrange(_clean((3, 16, 16), 255)), _rows(9, 3, seed)
    mean, std = layout.normalization
    want = sound_patches(clean, rows[0], (torch.tensor(table.thresholds), None), torch.tensor(key_words(seed)),
                         *rows[1:], layout.counters, mean, std, grid=255, fused=False)
    order = sound_noise_cpu.PatchOrder.of(layout.counters, mean, std)
    got = sound_noise_cpu.sound_rows(clean, rows[0], table, key_words(seed), *rows[1:], order=order, threads=2)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def _signed_uniforms(seed: int, image: int, phase: int, sample: int, numel: int) -> list[int]:
    """V = U - 2**63 of each element, from the Philox words (the contract: (w0, w1) even, (w2, w3) odd)."""
    words = uint32_stream(seed, torch.tensor([image]), phase, torch.tensor([sample]), 2 * numel)[0].tolist()
    return [words[4 * (e // 2) + 2 * (e % 2)] * 2**32 + words[4 * (e // 2) + 2 * (e % 2) + 1] - 2**63
            for e in range(numel)]


def test_the_lookup_counts_exactly_on_hand_made_tables():
    """Thresholds equal to drawn values (Z goes up), one above others (Z stays), duplicated, 200 crowded into
    the one 2**48-wide bucket of a drawn value (the forward scan runs long), and at both ends of int64."""
    seed, image, phase, sample, numel, grid = 2**40 + 12345, 2**31 + 9, 1, 2**32 - 1, 99, 2**20
    values = _signed_uniforms(seed, image, phase, sample, numel)
    crowded = values[30] & ~(2**48 - 1)  # the lowest V of element 30's bucket
    ends = sorted([-(2**63), -(2**63), 2**63 - 1, *values[:12], *values[:2], *(v + 1 for v in values[12:20]),
                   *(crowded + i * 2**40 for i in range(200))])
    ends = ends if len(ends) % 2 == 0 else [-(2**63), *ends]
    K = len(ends) // 2
    table = SoundTable(grid, 1.0, K, np.array(ends, dtype=np.int64), 0.0)
    expected = [sum(t <= v for t in ends) - K for v in values]
    rows = (torch.tensor([0]), torch.tensor([image]), phase, torch.tensor([sample]))
    clean = torch.full((1, 1, 9, 11), 0.5)  # X = L / 2: every Z is on the grid's scale
    got = sound_noise_cpu.sound_rows(clean, rows[0], table, key_words(seed), *rows[1:])
    assert (torch.round(got * grid).to(torch.int64) - grid // 2).flatten().tolist() == expected
    want = sound_rows(clean, rows[0], grid, torch.tensor(table.thresholds), K, torch.tensor(key_words(seed)),
                      *rows[1:])
    assert torch.equal(got, want)


@pytest.mark.parametrize("patches", [False, True])
def test_noise_source_uses_the_kernel_on_a_cpu_and_the_compiled_ops_without_it(patches, monkeypatch):
    """With a compiler NoiseSource draws --sound's inputs with the C kernel; without one it compiles the torch
    ops, silently but named; both equal the reference on every row of a batch."""
    layout = PatchLayout(3, 8, 4, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)) if patches else None
    clean = _clean((3, 8, 8), 255)
    clean = layout.arrange(clean) if layout else clean
    rows = _rows(40, 3)
    reference = NoiseSource(CPU, compiled=False, layout=layout, grid=255)(clean, rows[0], 1.0, 2**40 + 3, *rows[1:])
    notices: list[str] = []
    kernel = NoiseSource(CPU, serial=patches, layout=layout, notice=notices.append, grid=255)
    assert kernel.description == "C kernel sound noise (1/255 grid)"
    assert torch.equal(kernel(clean, rows[0], 1.0, 2**40 + 3, *rows[1:]), reference) and not notices
    monkeypatch.setattr(sound_noise_cpu, "load", lambda: None)
    compiled = NoiseSource(CPU, serial=patches, layout=layout, notice=notices.append, grid=255)
    assert compiled.implementation == COMPILED and kernel.implementation == C_KERNEL
    assert torch.equal(compiled(clean, rows[0], 1.0, 2**40 + 3, *rows[1:]), reference) and not notices


def test_serial_calls_from_several_threads_at_once_draw_their_own_rows():
    """The CPU fast body's workers call the one-thread kernel at once (ctypes frees the GIL)."""
    table, clean = sound_table(0.25, 255), _clean((3, 32, 32), 255)
    batches = [_rows(16, 3, seed) for seed in range(4)]
    want = [sound_noise_cpu.sound_rows(clean, r[0], table, (1, 2), *r[1:], threads=1) for r in batches]
    got: list = [None] * len(batches)

    def work(i: int) -> None:
        got[i] = sound_noise_cpu.sound_rows(clean, batches[i][0], table, (1, 2), *batches[i][1:], threads=1)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_slot_outside_the_clean_images_is_refused():
    table, clean, rows = sound_table(0.25, 255), _clean((1, 4, 4), 255, slots=2), _rows(3, 3)
    with pytest.raises(IndexError, match=r"slot indices must lie in \[0, 2\)"):
        sound_noise_cpu.sound_rows(clean, rows[0], table, (0, 0), *rows[1:])


@pytest.mark.parametrize("compiler,failure", [("/nonexistent/cc", None), ("false", "exited with status 1")])
def test_no_working_compiler_means_no_kernel_and_nothing_half_written(compiler, failure, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path))
    handle, why = sound_noise_cpu._load.__wrapped__()
    assert handle is None and (why == failure if failure is None else failure in why)
    assert list(tmp_path.iterdir()) == []


def _draw_in_child(queue) -> None:
    table, clean, rows = sound_table(0.25, 255), _clean((3, 8, 8), 255), _rows(8, 3)
    queue.put(sound_noise_cpu.sound_rows(clean, rows[0], table, (1, 2), *rows[1:], threads=2).numpy())


def test_a_forked_child_draws_with_threads_of_its_own():
    """A pool of threads does not survive fork(): after the parent has used its own, a forked child still draws."""
    import multiprocessing

    table, clean, rows = sound_table(0.25, 255), _clean((3, 8, 8), 255), _rows(8, 3)
    want = sound_noise_cpu.sound_rows(clean, rows[0], table, (1, 2), *rows[1:], threads=2)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_draw_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=600)
    child.join(timeout=600)
    assert child.exitcode == 0 and np.array_equal(got, want.numpy())


# The cache: each test below builds into a cache folder of its own.

@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cold cache folder, and a fresh :func:`sound_noise_cpu.load` (NoiseSource's included) on it."""
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sound_noise_cpu, "_load", functools.lru_cache(maxsize=1)(sound_noise_cpu._load.__wrapped__))
    return tmp_path / "cache"


def _library(cache: Path) -> Path:
    return cache / f"sound_noise_cpu-{sound_noise_cpu._build_key(CC)[:16]}.so"


def _matches_its_digest(library: Path) -> bool:
    recorded = json.loads(library.with_name(library.name + ".sha256").read_text())
    return stat.S_ISREG(os.lstat(library).st_mode) and \
        recorded["library"] == hashlib.sha256(library.read_bytes()).hexdigest()


def _replace(path: Path, data: bytes) -> None:
    """Write ``path`` anew (a new file renamed over it: a library this process mapped is left intact)."""
    path.with_name("new").write_bytes(data)
    os.replace(path.with_name("new"), path)


def _compiled(folder: Path, source: str, *flags: str) -> Path:
    (folder / "other.c").write_text(source)
    out = folder / "other.so"
    subprocess.run([CC, *flags, "-shared", "-fPIC", str(folder / "other.c"), "-o", str(out)], check=True)
    return out


def _draws_the_reference(handle) -> bool:
    """Do 40 rows drawn by ``handle`` equal the reference's (rows 5 and after included)?"""
    table, clean, rows = sound_table(0.5, 255), _clean((3, 8, 8), 255), _rows(40, 3)
    want = sound_rows(clean, rows[0], 255, torch.tensor(table.thresholds), table.K, torch.tensor(key_words(9)),
                      *rows[1:])
    got = sound_noise_cpu._drawn(handle, clean, rows[0], table, key_words(9), *rows[1:], None, 1)
    return torch.equal(got.view(torch.int32), want.view(torch.int32))


def _fake_compiler(folder: Path, body: str) -> str:
    """A compiler that runs ``body`` with the file it is to write in $out."""
    script = folder / "fake-cc"
    script.write_text(f'#!/bin/sh\nout=""\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n{body}\n')
    script.chmod(0o755)
    return str(script)


def test_a_cached_library_that_matches_its_digest_is_loaded_without_compiling(cache, monkeypatch):
    handle, why = sound_noise_cpu._load.__wrapped__()
    assert handle is not None and why is None and _matches_its_digest(_library(cache))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("compiled again"))
    handle, why = sound_noise_cpu._load.__wrapped__()
    assert why is None and _draws_the_reference(handle)


def _counting_builds(monkeypatch) -> list:
    """The compiler runs made from now on (each one's command)."""
    runs, run = [], subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda command, **k: runs.append(command) or run(command, **k))
    return runs


@pytest.mark.parametrize("altered", ["appended", "other flags", "wrong after the checked rows", "digest edited"])
def test_a_library_altered_after_its_build_is_built_again(altered, cache, tmp_path, monkeypatch):
    """Bytes appended; a correct library built otherwise; one right on the rows the load checks, wrong after
    them (Z one too high from row 5 on): none matches the digest file, so each is built again, once, and draws
    the reference's rows. An edited digest file likewise."""
    assert sound_noise_cpu._load.__wrapped__()[0] is not None
    library = _library(cache)
    if altered == "appended":
        _replace(library, library.read_bytes() + b"\0" * 100)
    elif altered == "digest edited":
        digest = library.with_name(library.name + ".sha256")
        _replace(digest, digest.read_bytes().replace(b'"library": "', b'"library": "0'))
    else:
        source, flags = (sound_noise_cpu.SOURCE.read_text(), "-O1") if altered == "other flags" else (LATE, "-O3")
        other = _compiled(tmp_path, source, flags)
        # the load's own check passes both: only the digest tells them from the build
        assert _draws_the_reference(sound_noise_cpu._opened(other)) == (altered == "other flags")
        _replace(library, other.read_bytes())
    found = library.read_bytes()
    builds = _counting_builds(monkeypatch)
    handle, why = sound_noise_cpu._load.__wrapped__()
    assert why is None and _draws_the_reference(handle) and len(builds) == 1
    assert _matches_its_digest(library) and (altered == "digest edited" or library.read_bytes() != found)


def _load_in_a_child(cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A fresh process's load on ``cache``: it prints why it has no library (None: it has one)."""
    code = "from dmae_fast.kernels import sound_noise_cpu as s; h, why = s._load(); print(why); assert h is not None"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "DMAE_FAST_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=timeout)


def test_a_truncated_library_is_built_again_not_loaded(cache):
    """Loading it would map pages past its end (SIGBUS); it is never opened as a library: in a child, to be safe."""
    assert sound_noise_cpu._load.__wrapped__()[0] is not None
    library = _library(cache)
    _replace(library, library.read_bytes()[: library.stat().st_size // 2])
    child = _load_in_a_child(cache)
    assert child.returncode == 0 and child.stdout == "None\n", child.stderr
    assert _matches_its_digest(library)


def test_a_library_without_the_kernels_symbol_is_built_again(cache, tmp_path, monkeypatch):
    """Its digest file recomputed to match it: the load finds no sound_noise_rows and builds it again, once."""
    assert sound_noise_cpu._load.__wrapped__()[0] is not None
    library = _library(cache)
    _replace(library, _compiled(tmp_path, "int nothing(void) { return 0; }\n").read_bytes())
    record = {"build": sound_noise_cpu._build_key(CC), "library": hashlib.sha256(library.read_bytes()).hexdigest()}
    library.with_name(library.name + ".sha256").write_text(json.dumps(record))
    builds = _counting_builds(monkeypatch)
    handle, why = sound_noise_cpu._load.__wrapped__()
    assert why is None and len(builds) == 1 and _draws_the_reference(handle) and _matches_its_digest(library)


@pytest.mark.parametrize("made,failure", [
    ("printf 'not a library' > \"$out\"", "its library does not load: "),
    ("exec {cc} -shared -fPIC {folder}/nothing.c -o \"$out\"", "undefined symbol: sound_noise_rows"),
    ("exec {cc} -O3 -shared -fPIC {folder}/wrong.c -o \"$out\"", "its library does not reproduce the reference"),
])
def test_where_no_build_works_the_compiled_ops_run_said_in_one_line(made, failure, cache, tmp_path, monkeypatch,
                                                                    capsys):
    """A compiler that writes a bogus library, one without the symbol, one with other rows: each is built once and
    refused (nothing is left in the cache); NoiseSource runs the compiled torch ops, named so, and says why once."""
    (tmp_path / "nothing.c").write_text("int nothing(void) { return 0; }\n")
    (tmp_path / "wrong.c").write_text(WRONG)
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, made.format(cc=CC, folder=tmp_path)))
    notices: list[str] = []
    source = NoiseSource(CPU, notice=notices.append, grid=255)
    patches = NoiseSource(CPU, serial=True, layout=PatchLayout(3, 8, 4, (0.5,) * 3, (0.2,) * 3),
                          notice=notices.append, grid=255)
    assert source.implementation == patches.implementation == COMPILED
    assert source.description == "compiled sound noise (1/255 grid)"
    assert len(notices) == 2 and notices[0] == notices[1] and failure in notices[0]
    assert notices[0].startswith(f"{C_KERNEL} noise unavailable (") and "\n" not in notices[0]
    assert notices[0].endswith("; using the compiled torch ops (slower, same noise)")
    assert "Traceback" not in capsys.readouterr().err and not list(cache.glob("sound_noise_cpu-*"))
    with pytest.raises(RuntimeError, match="could not be built"):
        sound_noise_cpu.sound_rows(_clean((1, 4, 4), 255), torch.tensor([0]), sound_table(0.5, 255), (1, 2),
                                   torch.tensor([0]), 0, torch.tensor([0]))


def test_a_fifo_at_the_librarys_path_is_never_opened_and_is_replaced(cache, tmp_path):
    """A FIFO's reader waits for a writer (dlopen hung): one waits here, on a second name of the FIFO, and is never
    met; the child, which must end within the guard's time, builds the library in its place."""
    library = _library(cache)
    cache.mkdir()
    os.mkfifo(library)
    os.link(library, tmp_path / "fifo")
    met = threading.Event()

    def writer() -> None:
        with open(tmp_path / "fifo", "wb"):  # returns once a reader opens the FIFO
            met.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        child = _load_in_a_child(cache, timeout=600)
        opened = met.is_set()  # the child has ended: any open of the FIFO has met the writer by now
    finally:
        os.close(os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK))  # lets the writer go
        thread.join(timeout=600)
    assert child.returncode == 0 and child.stdout == "None\n", child.stderr
    assert not opened
    assert _matches_its_digest(library)


def test_a_folder_at_the_librarys_path_is_left_and_the_build_runs_uncached(cache):
    _library(cache).mkdir(parents=True)
    handle, why = sound_noise_cpu._load.__wrapped__()
    assert why is None and _draws_the_reference(handle) and _library(cache).is_dir()


def test_a_refused_kernel_is_not_named_in_the_start_line_nor_the_record(cache, tmp_path, monkeypatch, capsys):
    """A compiler whose library draws other rows (the load's check fails): the start line and the record name
    the compiled torch ops, one line says why, and the rows are the torch-op reference's."""
    (tmp_path / "wrong.c").write_text(WRONG)
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, f'exec {CC} -O3 -shared -fPIC {tmp_path}/wrong.c -o "$out"'))
    monkeypatch.setattr(torch, "compile", lambda function, **options: function)  # the ops as compiled, sooner
    args = ["--data", "demo", "--max", "3", "--n0", "20", "--n", "100", "--batch", "64", "--device", "cpu",
            "--seed", "0", "--sound", "--body", "plain"]
    assert certify_main([*args, "--out", str(tmp_path / "run.tsv")]) == 0
    err = capsys.readouterr().err.replace("\r", "\n").splitlines()
    said = [line for line in err if line.startswith("dmae-fast: ")]
    start = next(line for line in err if line.startswith("dmae-certify: 3 images"))
    record = json.loads((tmp_path / "run.tsv.json").read_text())
    assert said == [f"dmae-fast: {record['body_fallbacks'][0]}"] and len(record["body_fallbacks"]) == 1
    assert "does not reproduce the reference" in said[0]
    assert ", compiled sound noise (1/16 grid) (plain body" in start
    assert record["engine"].endswith(", compiled sound noise (1/16 grid)")
    assert certify_main([*args, "--noise", "reference", "--out", str(tmp_path / "reference.tsv")]) == 0
    assert rows_without(tmp_path / "run.tsv") == rows_without(tmp_path / "reference.tsv")
