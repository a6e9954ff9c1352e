"""Config parsing: typed values, key-path errors, overrides and fingerprints."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import (
    Config,
    apply_overrides,
    config_fingerprint,
    load_config,
    parse_config,
)
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "orderbook.yaml"


def base() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_config_parses_into_frozen_dataclasses():
    cfg = load_config(EXAMPLE)
    assert isinstance(cfg, Config)
    assert cfg.windows.size == 32 and cfg.windows.scales == (1, 4)
    assert cfg.output.splits == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert cfg.cluster.address is None
    with pytest.raises(AttributeError):
        cfg.windows.size = 3  # frozen


def test_splits_null_is_the_default_as_when_left_out():
    data = base()
    data["output"]["splits"] = None  # it was refused ("expected a mapping"), as no other optional key is
    left_out = base()
    del left_out["output"]["splits"]
    assert parse_config(data).output.splits == parse_config(left_out).output.splits == {"train": 1.0}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["windows"].update(size="abc"), "windows.size: expected a positive integer, got 'abc'"),
        (lambda d: d["windows"].update(size=0), "windows.size: expected a positive integer, got 0"),
        (lambda d: d["windows"].update(stride=1.5), "windows.stride: expected a positive integer, got 1.5"),
        (lambda d: d["windows"].update(sizee=3), "windows.sizee: unknown key"),
        (lambda d: d.update(extra={}), "extra: unknown section"),
        (lambda d: d["windows"].pop("size"), "windows.size: missing required key"),
        (lambda d: d.pop("output"), "output: missing required section"),
        (lambda d: d["cluster"].update(n_workers=True), "cluster.n_workers: expected a positive integer, got True"),
        (lambda d: d["source"].update(nan="ignore"), "source.nan: expected one of 'raise', 'drop', 'fill', got 'ignore'"),
        (lambda d: d["source"].update(timestamp_unit="min"),
         "source.timestamp_unit: expected one of 's', 'ms', 'us', 'ns' or null, got 'min'"),
        (lambda d: d["output"].update(splits={"train": 0.9, "val": 0.2}), "output.splits: expected fractions that sum to at most 1"),
        (lambda d: d["output"].update(splits={"train": -1}), "output.splits.train: expected a fraction in (0, 1]"),
        (lambda d: d["windows"].update(scales=[1, "x"]), "windows.scales.1: expected a positive integer, got 'x'"),
        (lambda d: d["windows"].update(scales=[]), "windows.scales: expected a non-empty list"),
        # A key with a control character is shown escaped: the error stays one line.
        (lambda d: d["labels"].update({"\n": None}), "labels.\\n: unknown key"),
        (lambda d: d["labels"].update(kind="smoothed", alpha=-1),
         "labels.alpha: expected a non-negative number, got -1"),
        (lambda d: d["labels"].update(horizons=[10, 20]), "labels.horizons: give either horizon (one) or horizons"),
        (lambda d: d.update(labels={"kind": "column"}), "labels.column: missing required key for kind: column"),
        (lambda d: d["features"].update(steps=[{"name": "book", "levels": -1}]),
         "features.steps.0.levels: expected a positive integer, got -1"),
        (lambda d: d.update({"a\tb": {}}), "a\\tb: unknown section"),
        (lambda d: d["source"].update(header="yes"), "source.header: expected true or false or 'auto', got 'yes'"),
    ],
)
def test_errors_name_the_key_path_what_was_expected_and_what_arrived(mutate, message):
    data = base()
    mutate(data)
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_deeplob_setup_parses():
    """DeepLOB's setup: the raw book of 10 levels, smoothed labels at several horizons."""
    data = base()
    data["features"]["steps"] = [{"name": "book", "levels": 10}]
    data["labels"] = {"kind": "smoothed", "horizons": [10, 20, 50, 100], "reference": "past_mean", "alpha": 0.002}
    cfg = parse_config(data)
    (book,) = cfg.features.steps
    assert book.width == 40 and book.labels[:4] == ("ask_price_1", "ask_size_1", "bid_price_1", "bid_size_1")
    assert cfg.labels.horizon_list == (10, 20, 50, 100) and cfg.labels.multi
    assert cfg.labels.reach == (99, 100) and cfg.labels.class_names == ("down", "stationary", "up")


def test_overrides_parse_values_as_yaml_and_reach_any_key():
    data = apply_overrides(
        base(),
        ["windows.size=128", "windows.scales=[1, 2, 8]", "cluster.address=null", "features.steps.2.levels=3"],
    )
    cfg = parse_config(data)
    assert cfg.windows.size == 128
    assert cfg.windows.scales == (1, 2, 8)
    assert cfg.features.steps[2] == parse_config(base()).features.steps[2].__class__.from_mapping(
        {"name": "imbalance", "levels": 3}, "x"
    )


def test_override_errors_name_the_path():
    with pytest.raises(ConfigError, match=r"^features\.steps\.99: expected a list index below"):
        apply_overrides(base(), ["features.steps.99.window=3"])
    with pytest.raises(ConfigError, match=r"^--set: expected key.path=value"):
        apply_overrides(base(), ["windows.size"])


def test_the_timestamp_unit_reaches_the_loader():
    from pipeline.job import _source_kwargs

    assert _source_kwargs(parse_config(base())).get("timestamp_unit") is None
    cfg = parse_config(apply_overrides(base(), ["source.timestamp_unit=ms"]))
    assert cfg.source.timestamp_unit == "ms" and _source_kwargs(cfg)["timestamp_unit"] == "ms"


def test_scheduler_replaces_the_cluster_address():
    cfg = load_config(EXAMPLE, scheduler="tcp://127.0.0.1:8786")
    assert cfg.cluster.address == "tcp://127.0.0.1:8786"


def test_unreadable_and_invalid_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("windows: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(bad)
    code = tmp_path / "code.yaml"
    code.write_text("source: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):  # safe_load refuses python tags
        load_config(code)


def test_fingerprint_ignores_cluster_and_stream_but_not_data_keys():
    a = parse_config(base())
    other_cluster = base()
    other_cluster["cluster"]["n_workers"] = 7
    other_cluster["stream"]["batch_size"] = 3
    assert config_fingerprint(parse_config(other_cluster)) == config_fingerprint(a)
    other_data = base()
    other_data["windows"]["size"] = 33
    assert config_fingerprint(parse_config(other_data)) != config_fingerprint(a)


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=5),
    st.lists(st.integers(-2, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(
    section=st.sampled_from(["cluster", "source", "features", "windows", "labels", "output", "stream"]),
    key=st.text(min_size=1, max_size=12),
    value=_values,
)
def test_any_single_bad_value_gives_a_config_error_or_a_valid_config(section, key, value):
    data = copy.deepcopy(base())
    target = data[section]
    if isinstance(target, dict):
        keys = list(target)
        key = keys[hash(key) % len(keys)] if keys and not key.startswith("new") else key
        target[key] = value
    try:
        cfg = parse_config(data)
    except ConfigError as exc:
        assert str(exc).startswith(section), str(exc)
    else:
        assert isinstance(cfg, Config)


def test_print_config_output_parses_back_to_the_same_config():
    """``--print-config`` shows every default; fed back to ``pipeline run`` it is the same
    config (specs render as the YAML values they were parsed from)."""
    import dataclasses

    from pipeline.job import config_as_yaml

    overrides = ["output.splits={train: {until: 2026-01-08}, val: {until: 2026-01-09}, test: {}}",
                 "source.sessions={gap: 90min}", "source.instrument={column: symbol}",
                 "features.normalize={kind: trailing, sessions: 2}", "output.folds={kind: rolling, train_sessions: 4}",
                 "labels={kind: smoothed, horizons: [10, 20], alpha: 0.001, reference: past_mean}",
                 "features.steps=[{name: book, levels: 3}, mid_price, {name: rolling_std, window: 5, of: spread}]"]
    config = load_config(EXAMPLE, overrides=overrides)
    again = parse_config(yaml.safe_load(config_as_yaml(config)))
    for f in dataclasses.fields(config):
        if f.name != "raw_yaml":
            assert getattr(again, f.name) == getattr(config, f.name), f.name
    assert yaml.safe_load(config_as_yaml(config))["source"]["sessions"] == {"gap": "90min"}


def test_a_list_of_the_wrong_type_is_named_in_plain_words():
    with pytest.raises(ConfigError, match=r"^source\.names: expected a list of strings or null, got 3$"):
        parse_config({"source": {"paths": "x", "names": 3}, "windows": {"size": 2}, "output": {"path": "o"}})


@pytest.mark.parametrize("value", ["float16", "f8", "double", 64, None, ["float64"]])
def test_source_dtype_is_float32_or_float64_else_one_line_error(value):
    assert parse_config(base()).source.dtype == "float32"
    good = base()
    good["source"]["dtype"] = "float64"
    assert parse_config(good).source.dtype == "float64"
    bad = base()
    bad["source"]["dtype"] = value
    with pytest.raises(ConfigError) as err:
        parse_config(bad)
    assert str(err.value) == f"source.dtype: expected one of 'float32', 'float64', got {value!r}"


def test_source_dtype_float32_written_out_keeps_the_fingerprint_of_stores_built_without_it():
    plain = config_fingerprint(parse_config(base()))
    for value, same in (("float32", True), ("float64", False)):
        data = base()
        data["source"]["dtype"] = value
        assert (config_fingerprint(parse_config(data)) == plain) is same


def test_output_on_partial_day_defaults_to_append_and_keeps_the_fingerprint():
    # An unattended job adds the key to the config of a store it appends to: the store's
    # fingerprint must not change, or the append would be refused as another config.
    plain = parse_config(base())
    assert plain.output.on_partial_day == "append"
    for value in ("append", "refuse"):
        data = base()
        data["output"]["on_partial_day"] = value
        parsed = parse_config(data)
        assert parsed.output.on_partial_day == value
        assert config_fingerprint(parsed) == config_fingerprint(plain)
    data = base()
    data["output"]["on_partial_day"] = "wait"
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value) == "output.on_partial_day: expected one of 'append', 'refuse', got 'wait'"


def test_the_source_dtype_reaches_the_loader():
    from pipeline.job import _source_kwargs

    cfg = parse_config(apply_overrides(base(), ["source.dtype=float64"]))
    assert _source_kwargs(cfg)["dtype"] == "float64"
    # The default need not be passed: tables read float32 without it, arrays keep their own dtype.
    assert _source_kwargs(parse_config(base())).get("dtype", "float32") == "float32"


def test_an_unknown_source_format_is_refused_when_parsed(tmp_path):
    data = base()
    data["source"]["format"] = "gif"
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value).startswith("source.format: expected one of csv, fi2010, hdf5, image, lobster, npy, npz, "
                                     "parquet or null (by suffix), got 'gif'")
    for fmt in ("lobster", "parquet", None):
        data["source"]["format"] = fmt
        assert parse_config(data).source.format == fmt


@pytest.mark.parametrize("fmt", ["npy", "npz", "hdf5", "image"])
def test_an_array_source_format_is_refused_when_parsed_naming_the_key(fmt):
    """``pipeline run`` reads tables: an array format is refused as the config is read,
    naming ``source.format`` (it was refused later, naming ``source.paths``)."""
    data = base()
    data["source"]["format"] = fmt
    with pytest.raises(ConfigError, match=rf"^source.format: expected a table format \(csv, parquet, lobster, "
                                          rf"fi2010\) or null: .* go through the Python API .*, got '{fmt}'$"):
        parse_config(data)


def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path):
    text = EXAMPLE.read_text()
    p = tmp_path / "c.yaml"
    p.write_text(text + "windows:\n  size: 5\n")
    first = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("windows:"))
    second = len(text.splitlines()) + 1
    with pytest.raises(ConfigError, match=rf"key 'windows' appears twice, at lines {first} and {second}"):
        load_config(p)
    # nested keys too, and a merge key's keys may still be overridden
    p.write_text(text.replace("windows:", "windows:\n  stride: 2\n  stride: 3", 1))
    with pytest.raises(ConfigError, match=rf"key 'stride' appears twice, at lines {first + 1} and {first + 2}"):
        load_config(p)
    from pipeline.config import _safe_load

    assert _safe_load("a: &w {s: 2, t: 1}\nb:\n  <<: *w\n  s: 3\n") == {"a": {"s": 2, "t": 1}, "b": {"s": 3, "t": 1}}


def test_exponents_without_a_dot_or_sign_are_numbers_in_files_and_overrides(tmp_path):
    """YAML 1.2 reads 1e-9 as a number; PyYAML left it a string, which number keys refused."""
    from pipeline.config import _safe_load

    assert _safe_load("a: 1e-9\nb: 1.5e3\nc: .5e2\nd: -2E+5\ne: x1e3\nf: 12\ng: 1.0") == \
        {"a": 1e-9, "b": 1500.0, "c": 50.0, "d": -200000.0, "e": "x1e3", "f": 12, "g": 1.0}
    p = tmp_path / "c.yaml"
    p.write_text(EXAMPLE.read_text())
    config = load_config(p, overrides=['source.scale={"*_price_*": 1e-9}', "labels.scale=1e4"])
    assert config.source.scale == {"*_price_*": 1e-9} and config.labels.scale == 1e4


def test_config_rename_takes_a_list_of_alternatives():
    from pipeline.config import _rename

    assert _rename({"a": ["x", "y"], "b": "z"}, "source.rename") == {"a": ("x", "y"), "b": "z"}
    for bad, why in (({"a": []}, "a mapping of canonical"), ({"a": ["x", 3]}, "a mapping of canonical"),
                     ({"a": ["x", "y"], "b": "y"}, r"distinct source column names \('y' given twice\)")):
        with pytest.raises(ConfigError, match=r"^source\.rename: expected " + why):
            _rename(bad, "source.rename")


@pytest.mark.parametrize(("override", "message"), [
    ("source.paths=[]", r"^source\.paths: expected a path or glob \(a string\) or a non-empty list of them, got \[\]"),
    ("source.paths=''", r"^source\.paths: expected a path or glob"),
    ("source.paths=[a.csv, '']", r"^source\.paths\.1: expected a path or glob \(a non-empty string\), got ''"),
    ("output.path=", r"^output\.path: expected a store path or URL \(a non-empty string\), got ''"),
    ("source.delimiter=';;'", r"^source\.delimiter: expected one character \(not a newline or a quote\).*got ';;'"),
    ('source.delimiter="\\n"', r"^source\.delimiter: expected one character"),
    ("source.delimiter='\"'", r"^source\.delimiter: expected one character"),
    ("source.decimal=','", r"^source\.decimal: expected a mark other than the delimiter ','"),
    ("cluster.address=http://h:8787", r"^cluster\.address: 'http://h:8787' is a web address.*tcp://h:8786"),
    ("cluster.address=tcp://h", r"^cluster\.address: 'tcp://h' has no port"),
    ("cluster.address=foo://h:1", r"^cluster\.address: 'foo://h:1': unknown scheme foo://"),
    ("cluster.address=tcp://h:99999", r"^cluster\.address: 'tcp://h:99999': port 99999 is out of range"),
    ("cluster.scheduler_file=''", r"^cluster\.scheduler_file: expected a file path"),
])
def test_what_the_run_refuses_is_refused_when_parsed_naming_the_key_path(override, message):
    """``--print-config`` (validate the config) accepted these, which the run refused
    later, one of them (``paths: []``) without the ``source.`` of its key path."""
    with pytest.raises(ConfigError, match=message):
        parse_config(apply_overrides(base(), [override]))


def test_csv_marks_are_refused_when_parsed_by_the_loaders_own_rule():
    """Parsing and the loader agree on every delimiter: the loader's check, run on what
    parsing kept, passes; what parsing refused, the loader refuses too."""
    from pipeline.loaders.tables import check_csv_marks

    for delimiter in (",", ";", "\t", "|", " ", ";;", "", "\n", "\r", '"', "ab"):
        try:
            cfg = parse_config(apply_overrides(base(), [f"source.delimiter={yaml.safe_dump(delimiter).strip()}",
                                                        "source.decimal=."]))
        except ConfigError as exc:
            assert str(exc).startswith("source.delimiter: ")
            with pytest.raises(ConfigError, match=r"^(source\.)?delimiter: "):
                check_csv_marks(delimiter, ".")
        else:
            assert cfg.source.delimiter == delimiter and len(delimiter) == 1 and delimiter not in '\r\n"'
            check_csv_marks(cfg.source.delimiter, cfg.source.decimal)


def test_tls_files_with_an_unencrypted_address_are_refused_when_parsed():
    data = apply_overrides(base(), ["cluster.address=tcp://h:8786", "cluster.tls_ca_file=ca.pem"])
    with pytest.raises(ConfigError, match=r"^cluster\.address: 'tcp://h:8786' is unencrypted.*tls://h:8786"):
        parse_config(data)
    # Only the syntax: the files themselves are looked for when a run starts.
    cfg = parse_config(apply_overrides(data, ["cluster.address=tls://h:8786"]))
    assert cfg.cluster.address == "tls://h:8786" and cfg.cluster.tls_ca_file == "ca.pem"
    assert load_config(EXAMPLE, scheduler="tcp://127.0.0.1:8786").cluster.address == "tcp://127.0.0.1:8786"
    with pytest.raises(ConfigError, match=r"^cluster\.address: 'http://127\.0\.0\.1:8787' is a web address"):
        load_config(EXAMPLE, scheduler="http://127.0.0.1:8787")


@pytest.mark.parametrize(("key", "value"), [("source.decimal", ","), ("source.date.format", "%Y%m%d"),
                                            ("source.missing", "[@, 1]")])
def test_a_set_value_yaml_cannot_parse_says_how_to_quote_it(key, value):
    with pytest.raises(ConfigError) as err:
        apply_overrides(base(), [f"{key}={value}"])
    msg = str(err.value)
    assert msg.startswith(f"{key}: expected a YAML value, got {value!r}; quote a string: --set '")
    # The hint, as the shell hands it over, parses (plain PyYAML) to the text given.
    hint = msg.split("--set ", 1)[1]
    assert hint.startswith("'") and hint.endswith("'")
    hinted_key, _, hinted_value = hint[1:-1].partition("=")
    assert hinted_key == key and yaml.safe_load(hinted_value) == value
    assert apply_overrides(base(), [hint[1:-1]])["source"][key.split(".")[1]] == \
        ({"format": value} if key == "source.date.format" else value)


def test_the_reference_says_timestamp_units_meaning_once_and_what_it_means_under_source_date():
    """docs/hooks.py joined the ``#:`` comment and the config note, which said the same."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("pipeline_docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pipeline_docs_hooks", hooks)
    spec.loader.exec_module(hooks)
    problems: list[str] = []
    (row,) = [line for line in hooks.config_reference(problems).splitlines()
              if line.startswith("| `source.timestamp_unit` |")]
    meaning = row.split(" | ")[3].lower()
    assert meaning.count("numeric timestamp column since the epoch") == 1, row
    assert meaning.count("integers are nanoseconds and floats seconds") == 1, row
    assert "under ``source.date`` the unit applies to the times of day" in meaning, row
    assert problems == []
    # A comment and a note that say different things are both kept, in that order.
    assert hooks._meaning("CSV only: one character.", "Tabs too.") == "CSV only: one character. Tabs too."


def lobster_config(**source) -> dict:
    data = base()
    data["source"] = {"paths": "data/lobster/*_orderbook_10.csv", "format": "lobster", **source}
    return data


def test_source_halts_is_drop_or_keep_for_lobster_and_refused_for_other_formats():
    assert parse_config(lobster_config()).source.halts is None  # the loader's default for LOBSTER: drop
    assert parse_config(lobster_config(halts="keep")).source.halts == "keep"
    assert parse_config(apply_overrides(lobster_config(), ["source.halts=drop"])).source.halts == "drop"
    with pytest.raises(ConfigError, match=r"^source.halts: expected one of 'drop', 'keep' or null, got 'skip'$"):
        parse_config(lobster_config(halts="skip"))
    data = base()
    data["source"]["halts"] = "drop"  # a CSV/Parquet source: it would change nothing
    with pytest.raises(ConfigError, match=r"^source.halts: expected null for a format chosen by suffix: halts are "
                                          r"the trading-halt messages \(event type 7\) of LOBSTER files"):
        parse_config(data)
    data["source"]["format"] = "parquet"
    with pytest.raises(ConfigError, match=r"^source.halts: expected null for format 'parquet'"):
        parse_config(data)


@pytest.mark.parametrize("where", ["feature", "label", "columns"])
def test_lobster_order_ids_in_float32_are_refused_when_parsed(where):
    data = lobster_config()
    if where == "feature":
        data["features"] = {"steps": ["mid_price", {"name": "column", "column": "order_id"}]}
    elif where == "label":
        data["labels"] = {"kind": "column", "column": "order_id"}
    else:
        data["source"]["columns"] = ["ask_price_1", "bid_price_1", "order_id"]
    with pytest.raises(ConfigError, match=r"^source.dtype: expected float64 when order_id is read \(LOBSTER's order "
                                          r"ids run past 2\*\*24 = 16,777,216.*got 'float32'$"):
        parse_config(data)
    data["source"]["dtype"] = "float64"
    assert parse_config(data).source.dtype == "float64"


def test_the_reference_says_pipeline_run_reads_tables_only_and_chunk_rows_default(tmp_path):
    """The reference listed npy, npz, image and hdf5 as source formats, combine: stack, and
    chunk_rows "for npy and HDF5 arrays" (default 262,144), though pipeline run refuses
    array files and their default chunks are about 32 MiB."""
    import importlib.util
    import sys

    import numpy as np

    from pipeline.errors import FormatMismatchError
    from pipeline.job import _check_table_source
    from pipeline.loaders import open_source
    from pipeline.loaders.tables import TEXT_PART_ROWS

    spec = importlib.util.spec_from_file_location("pipeline_docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pipeline_docs_hooks", hooks)
    spec.loader.exec_module(hooks)
    problems: list[str] = []
    page = hooks.config_reference(problems)
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")[3] for line in page.splitlines()
            if line.startswith("| `source.")}
    section = " ".join(page.split("## source", 1)[1].split("| key |", 1)[0].split())
    assert problems == []
    assert "array files (npy, npz, images, hdf5) are refused before a cluster starts" in section.lower()
    assert "`pipeline run` refuses array files" in rows["source.format"]
    assert "`stack` is refused" in rows["source.combine"]
    assert "npy" not in rows["source.chunk_rows"] and "HDF5" not in rows["source.chunk_rows"]
    assert f"{TEXT_PART_ROWS:,} rows" in rows["source.chunk_rows"]
    opening = " ".join((ROOT / "docs" / "pages" / "reference" / "loaders.md").read_text().split("\n\n")[1].split())
    assert "reads the tables only" in opening and "a config's `source` section read these" not in opening
    # What the reference says holds: an HDF5 source and a stacked table are refused.
    import h5py

    with h5py.File(tmp_path / "d0.h5", "w") as f:
        f["x"] = np.zeros((5, 2))
    data = base()
    data["source"] = {"paths": str(tmp_path / "d*.h5"), "format": "hdf5"}
    with pytest.raises(ConfigError, match=r"^source.format: expected a table format .*Python API"):
        parse_config(data)
    data["source"] = {"paths": str(tmp_path / "d*.h5")}  # by suffix: refused once the files are listed
    with pytest.raises(ConfigError, match=r"^source.paths: expected tables with named columns .*Python API"):
        _check_table_source(parse_config(data).source)
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    with pytest.raises(FormatMismatchError, match=r"tables are joined along time; combine must be 'concat'"):
        open_source(str(tmp_path / "t.csv"), combine="stack")


@pytest.mark.parametrize("header", [True, False, "auto"])
def test_source_header_takes_true_false_or_auto(header):
    data = base()
    data["source"].update(header=header, names=["a", "b"])
    assert parse_config(data).source.header == header


def test_source_header_auto_reaches_the_loader_without_names():
    from pipeline.job import _source_kwargs

    cfg = parse_config(apply_overrides(base(), ["source.header=auto"]))
    assert _source_kwargs(cfg)["header"] == "auto"
    # The default (a header, its own names) is not passed: formats without headers take no such option.
    assert "header" not in _source_kwargs(parse_config(base()))


# -- cluster values dask reads ------------------------------------------------------------


def _dask_memory_limit(value):
    """The bytes a LocalCluster worker gets for ``value``, by distributed's own parser
    (the reference: what the run would do with the value), or the exception it raises."""
    import logging

    from distributed.worker_memory import parse_memory_limit

    try:
        return parse_memory_limit(value, 1, logger=logging.getLogger("test"))
    except (ValueError, TypeError, OverflowError) as exc:
        return exc


@pytest.mark.parametrize("value", ["4GiB", "500MB", "1.5 GB", "0.5", 0.5, 1, 4_000_000_000, "4000000000", "auto",
                                   None, 0])
def test_cluster_memory_limit_takes_what_dask_reads_as_it_was_written(value):
    data = base()
    data["cluster"]["memory_limit"] = value
    assert parse_config(data).cluster.memory_limit == value  # passed to dask as written
    limit = _dask_memory_limit(value)
    assert limit is None or (isinstance(limit, int) and limit > 0)


def _cluster_refusal(key: str, value: object) -> str:
    """The error of a config whose ``cluster.<key>`` is ``value``."""
    data = base()
    data["cluster"][key] = value
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    return str(err.value)


@pytest.mark.parametrize("value", ["lots", "4 GiBs", "", "-1GB", -1, float("inf"), "nan", True, [4], {"a": 1}])
def test_cluster_memory_limit_dask_cannot_use_is_one_line_naming_the_key(value):
    """The LocalCluster refused 'lots' with a traceback from inside its start, after
    ``--print-config`` had shown it without a word."""
    assert _cluster_refusal("memory_limit", value) == (
        "cluster.memory_limit: expected a size such as 4GiB or 500MB, a fraction of memory such "
        f"as 0.5, auto, or null (no limit), got {value!r}")
    limit = _dask_memory_limit(value)
    # dask fails on it, or reads what no one means: a negative size, '' as 1 byte, True
    # as the whole machine's memory.
    assert isinstance(limit, Exception) or limit < 0 or value in ("", True)


@pytest.mark.parametrize(("value", "address"), [
    (8787, "127.0.0.1:8787"), (":8787", "127.0.0.1:8787"), ("8787", "127.0.0.1:8787"), (0, "127.0.0.1:0"),
    ("127.0.0.1:0", "127.0.0.1:0"), ("0.0.0.0:8787", "0.0.0.0:8787"), ("localhost", "localhost:0"), (None, None)])
def test_cluster_dashboard_address_takes_a_bare_port_on_the_loopback_address(value, address):
    """A bare port was refused as 'expected a string'; dask reads one as every network
    interface, which only a host written out asks for here."""
    from distributed.utils import clean_dashboard_address

    data = base()
    data["cluster"]["dashboard_address"] = value
    got = parse_config(data).cluster.dashboard_address
    assert got == address
    if value is not None:
        port = int(str(value).rpartition(":")[2]) if str(value).rpartition(":")[2].isdigit() else 0
        assert clean_dashboard_address(got) == [{"address": address.rpartition(":")[0], "port": port}]


@pytest.mark.parametrize("value", [70000, -1, "a:b", "host:", "[::1]:8787", "tcp://h:8787", "", " 8787", True, 8.5])
def test_cluster_dashboard_address_dask_cannot_use_is_refused_naming_the_key(value):
    assert _cluster_refusal("dashboard_address", value) == (
        "cluster.dashboard_address: expected a port such as 8787, or host:port such as "
        f"127.0.0.1:8787, or null (no dashboard), got {value!r}")


# -- the codec, printed and compared -------------------------------------------------------


@pytest.mark.parametrize(("codec", "printed"), [
    ("zstd", {"name": "zstd", "clevel": 5}),
    ({"name": "zstd", "clevel": 3}, {"name": "zstd", "clevel": 3}),
    ("none", {"name": "none"}),
    ("blosc-zstd", {"name": "blosc", "cname": "zstd", "clevel": 5, "shuffle": "noshuffle"}),
    ("blosc-lz4", {"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "noshuffle"}),
])
def test_print_config_shows_only_the_codec_fields_that_apply(codec, printed):
    """``cname`` and ``shuffle`` are blosc's: a zstd codec listed them (cname: lz4)."""
    from zarr.codecs import BloscCodec, ZstdCodec

    from pipeline.job import config_as_yaml

    config = load_config(EXAMPLE, overrides=[f"output.codec={yaml.safe_dump(codec, default_flow_style=True).strip()}"])
    shown = yaml.safe_load(config_as_yaml(config))["output"]["codec"]
    assert shown == printed
    assert parse_config(yaml.safe_load(config_as_yaml(config))).output.codec == config.output.codec
    # The reference: the zarr codecs the spec writes, and the fields they take.
    compressors = config.output.codec.zarr_compressors()
    if printed["name"] == "zstd":
        assert compressors == [ZstdCodec(level=printed["clevel"])]
    elif printed["name"] == "blosc":
        assert compressors == [BloscCodec(cname=printed["cname"], clevel=printed["clevel"], shuffle=printed["shuffle"])]
    else:
        assert compressors == []


_STORED = ("source: {paths: raw/*.csv}\nwindows: {size: 4}\n"
           "output: {path: s.zarr, codec: {name: blosc, cname: lz4, clevel: 5, shuffle: noshuffle}}\n")


@pytest.mark.parametrize(("new", "said"), [
    ("zstd", "output.codec: blosc lz4 clevel 5 noshuffle -> zstd clevel 5"),
    ("{name: zstd, clevel: 3}", "output.codec: blosc lz4 clevel 5 noshuffle -> zstd clevel 3"),
    ("none", "output.codec: blosc lz4 clevel 5 noshuffle -> none (uncompressed)"),
    ("{name: blosc, shuffle: shuffle}", "output.codec: blosc lz4 clevel 5 noshuffle -> blosc lz4 clevel 5 shuffle"),
    ("blosc-lz4", "output.codec: {'name': 'blosc', 'cname': 'lz4', 'clevel': 5, 'shuffle': 'noshuffle'} -> "
                  "'blosc-lz4' (the same codec, blosc lz4 clevel 5 noshuffle, written otherwise)"),
])
def test_a_codec_change_is_named_once_in_words(new, said):
    """Field by field, ``codec: zstd`` against a mapping was 'output.codec: '(unset)' ->
    'zstd'; output.codec.clevel: 5 -> '(unset)'; ...'."""
    from pipeline.config import config_differences

    raw = parse_config(apply_overrides(yaml.safe_load(_STORED), [f"output.codec={new}"])).raw_yaml
    assert config_differences(_STORED, raw) == [said]


def test_a_value_written_as_a_mapping_on_one_side_only_is_one_difference():
    from pipeline.config import config_differences

    stored = "source: {paths: raw/*.csv, sessions: file}\nwindows: {size: 4, stride: 2}\noutput: {path: s.zarr}\n"
    now = ("source: {paths: raw/*.csv, sessions: {gap: 30min}}\nwindows: {size: 4, stride: 3, scales: [1, 2]}\n"
           "output: {path: s.zarr, codec: none}\n")
    assert config_differences(stored, now) == [
        "output.codec: blosc lz4 clevel 5 noshuffle -> none (uncompressed)",  # unset: the default
        "source.sessions: 'file' -> {'gap': '30min'}",
        "windows.scales: (unset) -> [1, 2]",
        "windows.stride: 2 -> 3",
    ]
    assert config_differences(stored, now, limit=1) == ["output.codec: blosc lz4 clevel 5 noshuffle -> none "
                                                        "(uncompressed)"]


def test_dates_in_differences_are_iso_text_whether_quoted_or_not():
    """YAML reads an unquoted date as a datetime.date: it was shown as
    ``datetime.date(2026, 1, 6)`` and differed from the same date quoted (``--set``)."""
    from pipeline.config import config_differences

    stored = "output: {path: s.zarr, splits: {train: {until: 2026-01-05}, test: {}}}\n"
    assert config_differences(stored, stored.replace("2026-01-05", "2026-01-06")) == [
        "output.splits.train.until: '2026-01-05' -> '2026-01-06'"]
    assert config_differences(stored, stored.replace("2026-01-05", '"2026-01-06"')) == [
        "output.splits.train.until: '2026-01-05' -> '2026-01-06'"]
    assert config_differences(stored, stored.replace("2026-01-05", '"2026-01-05"')) == []


def test_a_run_over_a_store_of_another_codec_names_the_codecs_in_words(tmp_path, monkeypatch):
    """The refusal of ``pipeline run --set output.codec=zstd`` over a store built with
    the default codec, before a cluster starts."""
    import numpy as np

    import pipeline
    import pipeline.cluster
    from pipeline.errors import StoreConflictError
    from pipeline.job import run

    monkeypatch.setattr(pipeline.cluster, "cluster", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.csv").write_text("timestamp,bid_price_1,ask_price_1\n1,1,2\n2,1,2\n")
    stored = yaml.safe_load(_STORED)
    stored["source"]["paths"] = str(tmp_path / "raw" / "*.csv")
    stored["output"]["path"] = str(tmp_path / "s.zarr")
    built = parse_config(stored)
    pipeline.write(built.output.path, {"x": np.zeros((8, 4, 2), np.float32), "y": np.arange(8)},
                   attrs={"config": built.raw_yaml}, fingerprint=config_fingerprint(built), progress=False)
    with pytest.raises(StoreConflictError) as err:
        run(parse_config(apply_overrides(stored, ["output.codec=zstd"])), log=None, progress=False)
    assert str(err.value).endswith("What differs from the stored build's config: output.codec: blosc lz4 clevel 5 "
                                   "noshuffle -> zstd clevel 5 (--rebuild builds it again)")
