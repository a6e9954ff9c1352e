"""HDF5 files that point into other files (virtual datasets, external links), and
datasets that are not a plain numeric array (empty, null, compound, plugin-filtered)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import fsspec
import h5py
import numpy as np
import pytest

import pipeline
from pipeline.errors import FormatMismatchError, LoaderError, UnwrittenChunksWarning


def _virtual(path, source, shape, fill):
    """A virtual dataset ``x`` of ``path`` mapping all of ``source``'s ``x``."""
    layout = h5py.VirtualLayout(shape=shape, dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(source), "x", shape=shape)
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("x", layout, fillvalue=fill)


def _h5py_reads(path, name="x"):
    with h5py.File(path, "r") as f:
        return f[name][()]


def test_virtual_datasets_read_what_h5py_reads(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "elsewhere").mkdir()
    with h5py.File(tmp_path / "src" / "part.h5", "w") as f:
        f["x"] = np.arange(40, dtype=np.float32).reshape(10, 4)
    _virtual(tmp_path / "src" / "abs.h5", tmp_path / "src" / "part.h5", (10, 4), -1)
    _virtual(tmp_path / "src" / "rel.h5", "part.h5", (10, 4), -1)  # beside the virtual file
    _virtual(tmp_path / "src" / "gone.h5", tmp_path / "missing.h5", (10, 4), np.nan)
    names = ("abs", "rel", "gone")
    # A child process: reading a virtual dataset through a Python file object crashed
    # the interpreter (SIGSEGV), which would take the test run with it.
    code = textwrap.dedent(f"""
        import numpy as np, pipeline
        for name in {names!r}:
            x = pipeline.load({str(tmp_path / "src")!r} + f"/{{name}}.h5", combine="concat", chunk_rows=3)
            np.save({str(tmp_path)!r} + f"/{{name}}.npy", x.compute())
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "elsewhere", capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in names:
        expected = _h5py_reads(tmp_path / "src" / f"{name}.h5")
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), expected)
    assert np.isnan(expected).all()  # h5py reads a missing source as the fill value


def test_external_links_are_followed_in_local_files(tmp_path):
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f["x"] = np.arange(12.0).reshape(4, 3)
        f["grp/y"] = np.ones((2, 3))
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f["x"] = h5py.ExternalLink(str(tmp_path / "src.h5"), "x")
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "ext.h5"), combine="concat").compute(),
                                  _h5py_reads(tmp_path / "ext.h5"))
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "ext.h5"), dataset="x", combine="concat").compute(),
                                  _h5py_reads(tmp_path / "ext.h5"))
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f["own"] = np.zeros(2)
        f["linked"] = h5py.ExternalLink("src.h5", "grp")  # a relative name, looked up beside the file
    with pytest.raises(LoaderError, match=r"two\.h5: holds datasets \['own', 'linked/y'\]"):
        pipeline.load(str(tmp_path / "two.h5"))
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "two.h5"), dataset="linked/y").compute()[0],
                                  _h5py_reads(tmp_path / "two.h5", "linked/y"))


def test_an_external_link_to_a_missing_file_is_named(tmp_path):
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f["x"] = h5py.ExternalLink("nowhere.h5", "x")
    with h5py.File(tmp_path / "ext.h5", "r") as f, pytest.raises(KeyError):
        f["x"]  # h5py cannot follow it either
    with pytest.raises(LoaderError, match=r"ext\.h5: 'x' is an external link to '/?x' in nowhere\.h5, which "
                                          r"cannot be opened"):
        pipeline.load(str(tmp_path / "ext.h5"), combine="concat")


@pytest.fixture
def memory_fs():
    fs = fsspec.filesystem("memory")
    yield fs
    fs.rm("/h5", recursive=True)


def test_links_and_virtual_datasets_over_a_url_are_refused_not_crashed(tmp_path, memory_fs):
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f["x"] = np.arange(8, dtype=np.float32).reshape(2, 4)
    _virtual(tmp_path / "vds.h5", tmp_path / "src.h5", (2, 4), -1)
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f["x"] = h5py.ExternalLink(str(tmp_path / "src.h5"), "x")
    for name in ("vds", "ext"):
        memory_fs.pipe(f"/h5/{name}.h5", (tmp_path / f"{name}.h5").read_bytes())
    with pytest.raises(LoaderError, match=r"memory:///?h5/vds\.h5: dataset 'x' is a virtual dataset .* read only "
                                          r"from a local file"):
        pipeline.load("memory://h5/vds.h5", combine="concat")
    with pytest.raises(LoaderError, match=r"memory:///?h5/ext\.h5: 'x' is an external link \(to '/?x' in .*src\.h5\), "
                                          r"which is followed only in a local file"):
        pipeline.load("memory://h5/ext.h5", combine="concat")


def test_an_empty_dataset_joins_like_an_empty_npy(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", shape=(0, 4), dtype="f4")
    np.save(tmp_path / "a.npy", np.zeros((0, 4), np.float32))
    for name in ("a.h5", "a.npy"):
        got = pipeline.load(str(tmp_path / name), combine="concat").compute()
        assert got.shape == (0, 4) and got.dtype == np.float32
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "*.h5"), combine="concat").compute(),
                                  np.concatenate([_h5py_reads(tmp_path / "a.h5"), _h5py_reads(tmp_path / "b.h5")]))


def test_a_null_dataspace_is_refused_naming_file_and_dataset(tmp_path):
    with h5py.File(tmp_path / "null.h5", "w") as f:
        f.create_dataset("grp/x", data=h5py.Empty("f"))
    with h5py.File(tmp_path / "null.h5", "r") as f:
        assert f["grp/x"].shape is None
    with pytest.raises(LoaderError, match=r"null\.h5: dataset 'grp/x' has a null dataspace \(h5py\.Empty\)"):
        pipeline.load(str(tmp_path / "null.h5"), combine="concat")


def test_a_compound_dataset_is_refused_naming_its_fields(tmp_path):
    records = np.zeros(5, dtype=[("index", "i8"), ("values_block_0", "f8", (3,))])  # pandas' format="table"
    with h5py.File(tmp_path / "table.h5", "w") as f:
        f["df/table"] = records
    assert _h5py_reads(tmp_path / "table.h5", "df/table").dtype.names == ("index", "values_block_0")
    with pytest.raises(LoaderError, match=r"table\.h5: dataset 'df/table' holds records of fields 'index' \(int64\), "
                                          r"'values_block_0' \(float64\[3\]\) .*pandas\.read_hdf"):
        pipeline.load(str(tmp_path / "table.h5"), combine="concat")


@pytest.mark.parametrize("combine", ["concat", "stack"])
def test_an_array_type_dataset_reads_as_h5py_reads_it(tmp_path, combine):
    """An HDF5 array type (``('<f4', (3,))``) reads as its base dtype with the element's
    axes last; its lazy shape was (5,) and compute then said the file had changed."""
    with h5py.File(tmp_path / "arr.h5", "w") as f:
        ds = f.create_dataset("a", shape=(5,), dtype=np.dtype(("<f4", (3,))), chunks=(2,))
        ds[...] = np.arange(15, dtype=np.float32).reshape(5, 3)
    ref = _h5py_reads(tmp_path / "arr.h5", "a")
    assert ref.shape == (5, 3) and ref.dtype == np.float32
    got = pipeline.load(str(tmp_path / "arr.h5"), combine=combine, chunk_rows=2 if combine == "concat" else None)
    expected = ref if combine == "concat" else ref[None]
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got.compute(), expected)


def test_an_opaque_dataset_is_refused_naming_file_and_dataset(tmp_path):
    with h5py.File(tmp_path / "o.h5", "w") as f:
        f["grp/o"] = np.frombuffer(bytes(range(40)), dtype="V8")
    with pytest.raises(LoaderError, match=r"o\.h5: dataset 'grp/o' holds opaque values \(8-byte HDF5 opaque type"):
        pipeline.load(str(tmp_path / "o.h5"), combine="concat")


def test_a_filter_without_its_plugin_is_named_when_the_array_is_built(tmp_path):
    if h5py.h5z.filter_avail(32001):
        pytest.skip("the blosc filter is registered here (hdf5plugin installed)")
    with h5py.File(tmp_path / "blosc.h5", "w") as f:  # as PyTables writes with complib="blosc"
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 3))
        dcpl.set_filter(32001, h5py.h5z.FLAG_OPTIONAL, (2, 2, 8, 96, 5, 1, 0))
        space = h5py.h5s.create_simple((4, 3))
        ds = h5py.h5d.create(f.id, b"values", h5py.h5t.IEEE_F64LE, space, dcpl=dcpl)
        ds.write_direct_chunk((0, 0), b"\0" * 64, filter_mask=0)  # a chunk blosc is needed to decode
    with pytest.raises(OSError):
        _h5py_reads(tmp_path / "blosc.h5", "values")  # h5py fails inside HDF5, naming a plugin directory
    with pytest.raises(LoaderError, match=r"blosc\.h5: dataset 'values' is compressed with the HDF5 filter blosc "
                                          r"\(id 32001\), whose plugin .*hdf5plugin"):
        pipeline.load(str(tmp_path / "blosc.h5"), combine="concat")


@pytest.mark.parametrize("name, kind", [
    ("names", "variable-length strings"),
    ("ragged", r"variable-length \(ragged\) arrays of float32"),
    ("refs", "object references"),
])
def test_datasets_h5py_reads_as_objects_are_refused_when_the_array_is_built(tmp_path, name, kind):
    with h5py.File(tmp_path / "events.h5", "w") as f:
        f.create_dataset("names", data=["ab", "cde"], dtype=h5py.string_dtype())
        rag = f.create_dataset("ragged", (2,), dtype=h5py.vlen_dtype("f4"))
        rag[0], rag[1] = np.arange(3, dtype="f4"), np.arange(5, dtype="f4")
        f.create_dataset("refs", data=np.array([f.ref, f.ref], dtype=h5py.ref_dtype))
    with h5py.File(tmp_path / "events.h5", "r") as f:
        assert f[name].dtype == object  # what would reach zarr, which cannot store it
    with pytest.raises(LoaderError, match=rf"events\.h5: dataset '{name}' holds {kind}, which h5py reads as Python "
                       r"objects \(dtype=object\)"):
        pipeline.load(str(tmp_path / "events.h5"), combine="concat", dataset=name)


def _writer(path, *, swmr):
    """A child process that holds ``path`` open for writing (in SWMR mode or not), with
    3,000 rows of ``x`` flushed, until it is killed (or its stdin closes)."""
    code = textwrap.dedent(f"""
        import h5py, numpy as np, sys
        f = h5py.File({str(path)!r}, "w", libver="latest")
        ds = f.create_dataset("x", shape=(0, 4), maxshape=(None, 4), chunks=(100, 4), dtype="f8")
        if {swmr}:
            f.swmr_mode = True
        ds.resize((3000, 4)); ds[:] = np.arange(12000.0).reshape(3000, 4); ds.flush(); f.flush()
        print("ready", flush=True); sys.stdin.read()  # held until the test closes stdin or kills it
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_file_an_swmr_writer_holds_is_named_and_read_with_swmr(tmp_path):
    from pipeline.loaders.blocks import concat_array
    from pipeline.loaders.hdf5 import probe_hdf5, read_hdf5

    path = tmp_path / "live.h5"
    proc = _writer(path, swmr=True)
    try:
        with pytest.raises(LoaderError, match=r"live\.h5: another process has the file open for writing .* read it "
                                              r"with swmr=True"):
            pipeline.load(str(path), combine="concat", dataset="x")
        with h5py.File(path, "r", swmr=True) as f:
            expected = f["x"][()]
        shape, dtype = probe_hdf5(str(path), {}, dataset="x", swmr=True)
        assert shape == expected.shape == (3000, 4)
        x = concat_array([str(path)], [shape[0]], shape[1:], dtype, rows_per_chunk=700,
                         read_rows=lambda p, lo, hi: read_hdf5(p, {}, dataset="x", rows=slice(lo, hi), swmr=True))
        np.testing.assert_array_equal(x.compute(scheduler="sync"), expected)
    finally:
        proc.kill()
        proc.wait()


def test_a_file_a_plain_writer_holds_is_named(tmp_path):
    path = tmp_path / "held.h5"
    proc = _writer(path, swmr=False)
    try:
        with pytest.raises(OSError, match="lock|open for write"):
            h5py.File(path, "r")  # what HDF5 says
        with pytest.raises(LoaderError, match=r"held\.h5: another process has the file open for writing"):
            pipeline.load(str(path), combine="concat", dataset="x")
    finally:
        proc.kill()
        proc.wait()


def test_rows_whose_chunks_were_never_written_are_warned_of(tmp_path):
    import warnings

    killed = tmp_path / "killed.h5"
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import h5py, os
        f = h5py.File({str(killed)!r}, "w", libver="earliest")
        ds = f.create_dataset("x", shape=(10000, 8), dtype="f4", chunks=(500, 8))
        f.flush()
        for lo in range(0, 4000, 500):
            ds[lo:lo + 500] = 1.0
        os._exit(1)  # killed mid-write: the chunk index was never written
    """)], check=False, timeout=60)
    with h5py.File(tmp_path / "sparse.h5", "w") as f:
        ds = f.create_dataset("x", shape=(10000, 8), dtype="f4", chunks=(500, 4), fillvalue=-1)
        ds[:4000] = 1.0
        ds[9000:9500, :4] = 2.0  # one chunk of a band: the band's rows still read -1 in half their columns
    with h5py.File(tmp_path / "full.h5", "w") as f:
        f.create_dataset("x", data=np.ones((10000, 8), "f4"), chunks=(500, 8))
    for name, fill, chunks in (("killed", 0.0, "0 of the 20"), ("sparse", -1.0, "17 of the 40")):
        with h5py.File(tmp_path / f"{name}.h5", "r") as f:
            expected = f["x"][()]
        filled = int((expected == fill).any(axis=1).sum())  # rows holding the fill value, as h5py reads them
        with pytest.warns(UnwrittenChunksWarning, match=rf"{name}\.h5: dataset 'x' has {chunks} chunks its shape \(10000, 8\) "
                          rf"needs written: {filled} of its 10000 rows read as the fill value {fill}"):
            x = pipeline.load(str(tmp_path / f"{name}.h5"), combine="concat")
        np.testing.assert_array_equal(x.compute(scheduler="sync"), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.load(str(tmp_path / "full.h5"), combine="concat")


def test_default_row_blocks_of_a_gzip_chunked_dataset_start_on_its_chunk_edges(tmp_path):
    # Rows of 8 KiB: a default block is 4096 rows (32 MiB), which would cut through the
    # 3,000-row chunks, decoding each cut chunk twice; aligned, a block is one chunk.
    data = (np.arange(5000, dtype="f8")[:, None] + np.arange(1024) % 7)
    with h5py.File(tmp_path / "g.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(3000, 256), compression="gzip", compression_opts=1)
    with h5py.File(tmp_path / "g.h5", "r") as f:
        expected, chunk_rows = f["x"][()], f["x"].chunks[0]
    x = pipeline.load(str(tmp_path / "g.h5"), combine="concat")
    starts = np.cumsum((0,) + x.chunks[0][:-1])
    assert x.chunks[0] == (3000, 2000) and all(s % chunk_rows == 0 for s in starts)
    np.testing.assert_array_equal(x.compute(scheduler="sync"), expected)
    assert pipeline.load(str(tmp_path / "g.h5"), combine="concat", chunk_rows=700).chunks[0][:2] == (700, 700)


def test_pipeline_load_reads_a_file_an_swmr_writer_holds_with_swmr(tmp_path):
    path = tmp_path / "live.h5"
    proc = _writer(path, swmr=True)
    try:
        with pytest.raises(LoaderError, match=r"live\.h5: another process has the file open for writing .* read it "
                                              r"with swmr=True"):
            pipeline.load(str(path), combine="concat")  # the dataset is found in the file: opened there too
        with h5py.File(path, "r", swmr=True) as f:
            expected = f["x"][()]
        x = pipeline.load(str(path), combine="concat", swmr=True, chunk_rows=700)
        assert x.shape == expected.shape == (3000, 4)
        np.testing.assert_array_equal(x.compute(scheduler="sync"), expected)
        stacked = pipeline.load([str(path)], dataset="x", swmr=True).compute(scheduler="sync")
        np.testing.assert_array_equal(stacked, expected[None])
    finally:
        proc.kill()
        proc.wait()
    np.save(tmp_path / "a.npy", np.zeros(3))
    with pytest.raises(FormatMismatchError, match=r"swmr=True opens HDF5 files in SWMR read mode.*npy files take no "
                                                  r"swmr="):
        pipeline.load(str(tmp_path / "a.npy"), swmr=True)
