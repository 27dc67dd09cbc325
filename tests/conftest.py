"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from helpers import tiny_engine_of

from dmae_fast.engines.torch_engine import TorchEngine, ieee_fp32_convolutions

if torch.cuda.is_available():  # fp32 comparisons with the CPU (tests/test_kernels.py) need IEEE convolutions
    ieee_fp32_convolutions()


def _with_torch_threads(count: int) -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    """Every test runs with one torch thread unless it asks for two: the tests' models are tiny, one thread is
    as fast, and each of the two pytest workers has a core of its own (two threads each spin against the other)."""
    yield from _with_torch_threads(1)


@pytest.fixture(scope="module")
def tiny_engine() -> TorchEngine:
    """A small seeded random ViT on the CPU (3x8x8 inputs, 10 classes): the scheduler's tests share it."""
    return tiny_engine_of(input_size=8)


@pytest.fixture(scope="module")
def two_torch_threads() -> Iterator[None]:
    """Exports and engine runs: two threads (CI has two cores)."""
    yield from _with_torch_threads(2)


@pytest.fixture(autouse=True, scope="session")
def plain_body_by_default() -> Iterator[None]:
    """Commands run the plain body unless a test asks for another (or unsets DMAE_FAST_BODY to test
    the default, the fast body): most tests check behaviour, not speed, and a fast start costs
    an export per checkpoint."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DMAE_FAST_BODY", "plain")
        yield


@pytest.fixture(autouse=True, scope="session")
def private_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The whole suite uses a model cache of its own (dmae_fast.batching.cpu.cache_keys), never the user's;
    modules that need a cold cache per test point DMAE_FAST_CACHE elsewhere themselves."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DMAE_FAST_CACHE", str(tmp_path_factory.mktemp("model-cache")))
        yield
