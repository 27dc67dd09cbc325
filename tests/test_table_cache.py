"""The exact test's tables on disk (dmae_fast.stats.table_cache): computed once, read back equal, and an entry
that is damaged, edited or made by other code is recomputed, never used."""

from __future__ import annotations

import numpy as np
import pytest

from dmae_fast.base.disk_cache import DiskCache
from dmae_fast.stats import boundary_dp, table_cache
from dmae_fast.stats.group_sequential import GroupSequentialCertifier, GroupSequentialConfig
from dmae_fast.stats.sequential_radius import RadiusFamily

LOOKS = tuple(range(100, 2_001, 100))
DESIGN = dict(looks=LOOKS, z=(0.5, 1.5, 2.5), alpha=0.01, caps=(2_000,) * 3, spending=(1.0, 2.0), final_shift=0.0)


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path))
    return tmp_path


def counting(tables):
    calls = []

    def build():
        calls.append(1)
        return tables

    return build, calls


def test_a_table_is_built_once_and_read_back_equal_and_read_only(cache_folder):
    build, calls = counting((np.arange(6, dtype=np.int64).reshape(2, 3), np.array([0.5, np.nan])))
    first = table_cache.cached_tables("t", build, lambda tables: True, a=1)
    second = table_cache.cached_tables("t", build, lambda tables: True, a=1)
    assert len(calls) == 1 and len(list(cache_folder.iterdir())) == 1
    for got, want in zip(second, first):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and not got.flags.writeable
    table_cache.cached_tables("t", build, lambda tables: True, a=2)  # other inputs: another entry
    assert len(calls) == 2


def test_an_entry_failing_its_check_or_not_an_archive_is_rebuilt(cache_folder):
    key = table_cache.table_key("t", a=1)
    DiskCache.open().write(key, b"not an npz")  # a valid digest over a payload that is no archive
    build, calls = counting((np.zeros(3, dtype=np.int64),))
    table_cache.cached_tables("t", build, lambda tables: True, a=1)
    assert len(calls) == 1
    table_cache.cached_tables("t", build, lambda tables: False, a=1)  # read back, refused by its check
    assert len(calls) == 2


def test_without_a_cache_every_table_is_built(monkeypatch):
    monkeypatch.setenv("DMAE_FAST_CACHE", "off")
    build, calls = counting((np.zeros(1),))
    for _ in range(2):
        table_cache.cached_tables("t", build, lambda tables: True)
    assert len(calls) == 2


def test_keys_cover_the_inputs_and_the_stats_code(monkeypatch, tmp_path):
    key = table_cache.table_key("t", looks=(1, 2), alpha=0.01)
    assert key == table_cache.table_key("t", alpha=0.01, looks=(1, 2))
    assert key != table_cache.table_key("t", looks=(1, 2), alpha=0.001)
    assert key != table_cache.table_key("u", looks=(1, 2), alpha=0.01)
    (tmp_path / "boundary_dp.py").write_text("# another computation\n")
    monkeypatch.setattr(table_cache, "STATS_SOURCES", tmp_path)
    assert key != table_cache.table_key("t", looks=(1, 2), alpha=0.01)


def edited(key: str, tables: tuple[np.ndarray, ...]) -> None:
    """Replace the entry ``key`` with ``tables``, under a digest that matches (an edit, not damage)."""
    DiskCache.open().write(key, table_cache._dumped(tables))


def test_a_boundary_table_read_back_equals_the_computed_one_and_an_edited_one_is_recomputed(cache_folder):
    computed = boundary_dp._boundary_table(**DESIGN)
    first = boundary_dp.boundary_table.__wrapped__(**DESIGN)  # past the in-memory cache: computed and stored
    read = boundary_dp.boundary_table.__wrapped__(**DESIGN)
    for table in (first, read):
        np.testing.assert_array_equal(table[0], computed[0])
        np.testing.assert_array_equal(table[1], computed[1])
    key = table_cache.table_key("boundary table", **DESIGN)
    raised = computed[0].copy()
    raised[1, 0] = raised[0, 0] + 1  # level 1 rejected where level 0 is not: not nested
    for tables in ((raised, computed[1]), (computed[0], np.array([0.5, 1.0, 2.0])), (computed[0][:2], computed[1])):
        edited(key, tables)
        again = boundary_dp.boundary_table.__wrapped__(**DESIGN)
        np.testing.assert_array_equal(again[0], computed[0])
        np.testing.assert_array_equal(again[1], computed[1])


def family() -> RadiusFamily:
    c = GroupSequentialCertifier(GroupSequentialConfig(100, 2_000, 0.01, 0.5, tuple(0.25 * i for i in range(1, 9)),
                                                       LOOKS))
    f = c.radius_family
    return RadiusFamily(f.looks, f.z, f.failures, f.rhos, f.caps, f.target, f.alpha)  # a fresh in-memory cache


def test_a_radius_interval_read_back_equals_the_computed_one_and_an_edited_one_is_recomputed(cache_folder):
    level = 0
    z_values, bounds = family().interval(level)
    assert len(list(cache_folder.iterdir())) >= 1
    read_z, read_bounds = family().interval(level)
    np.testing.assert_array_equal(read_z, z_values)
    np.testing.assert_array_equal(read_bounds, bounds)
    f = family()
    design = {"looks": f.looks, "z": f.z.tolist(), "failures": f.failures.tolist(), "rhos": f.rhos.tolist(),
              "caps": f.caps.tolist(), "target": f.target, "alpha": f.alpha}
    key = table_cache.table_key("radius family interval", step=0.02, level=level, **design)
    assert table_cache.DiskCache.open().read(key) is not None, "the entry's key is the one the family uses"
    looser = bounds.copy()
    looser[-1] = bounds[0] + 1  # the top test of the interval rejecting more than those below it: not nested
    for tables in ((looser,), (bounds[:-1],), (bounds.astype(np.int32),)):
        edited(key, tables)
        np.testing.assert_array_equal(family().interval(level)[1], bounds)
