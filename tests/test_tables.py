"""The tables shipped computed (:mod:`sharnn.tables`) are the ones :mod:`decimal` computes."""

from __future__ import annotations

import numpy as np

from sharnn import tables
from sharnn.coding import bitwise, matching, mixing
from sharnn.models import exact


def test_every_shipped_table_is_the_one_decimal_computes_entry_for_entry():
    """What ``tables.npz`` holds and what each definition computes now: the same names,
    dtypes, shapes and every entry (:func:`sharnn.tables.write` writes the file again)."""
    computed = tables.computed()
    with np.load(tables.SHIPPED, allow_pickle=False) as shipped:
        assert sorted(shipped.files) == sorted(computed)
        for name, table in computed.items():
            assert shipped[name].dtype == table.dtype and np.array_equal(shipped[name], table), name


def test_the_coders_read_the_shipped_tables():
    """The tables the integer step and the mixers read are the shipped ones."""
    with np.load(tables.SHIPPED, allow_pickle=False) as shipped:
        for name, table in {
            "sharnn.models.exact._sigmoid_values": exact.sigmoid_table().numpy(),
            "sharnn.models.exact._tanh_values": exact.tanh_table().numpy(),
            "sharnn.models.exact._exp_values": exact.exp_table().numpy(),
            "sharnn.coding.mixing._log_mantissas": mixing._log_mantissas(),
            "sharnn.coding.matching._stretch": matching._stretch(),
            "sharnn.coding.bitwise._squash_table": bitwise._squash_table(),
        }.items():
            assert np.array_equal(shipped[name], table), name


def test_a_table_the_file_does_not_hold_is_computed(tmp_path, monkeypatch):
    """Without the file (a table defined after it was written, say) each table is computed."""
    monkeypatch.setattr(tables, "SHIPPED", tmp_path / "missing.npz")
    tables._shipped.cache_clear()
    matching._stretch.cache_clear()
    try:
        assert tables._shipped() == {}
        assert np.array_equal(matching._stretch(), tables.DEFINITIONS["sharnn.coding.matching._stretch"]())
    finally:
        tables._shipped.cache_clear()
        matching._stretch.cache_clear()
