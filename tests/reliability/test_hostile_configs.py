"""Hostile and malformed configs: never a traceback, always a config or a key-path error;
`module:function` hooks are imported only when a config names them, and only when run."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import Config, parse_config
from pipeline.errors import ConfigError

BASE = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "orderbook.yaml").read_text())

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=8), st.binary(max_size=4))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(data=st.dictionaries(st.sampled_from(["cluster", "source", "features", "windows", "labels", "output",
                                             "stream", "extra"]), values, max_size=8))
def test_random_documents_give_a_config_or_a_config_error(data):
    try:
        cfg = parse_config(data)
    except ConfigError as exc:
        assert "\n" not in str(exc) and ":" in str(exc)
    else:
        assert isinstance(cfg, Config)
        assert cfg.output.target_chunk_mb > 0 and cfg.windows.size > 0


@settings(max_examples=300, deadline=None)
@given(path=st.lists(st.sampled_from(["cluster", "source", "features", "steps", "windows", "labels", "output",
                                      "codec", "splits", "stream", 0, 1, 2, "name", "window", "size"]),
                     min_size=1, max_size=4),
       value=values)
def test_a_hostile_value_anywhere_in_the_example_config(path, value):
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            break
    if isinstance(node, dict):
        node[path[-1]] = value
    elif isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node):
        node[path[-1]] = value
    try:
        parse_config(data)
    except ConfigError as exc:
        assert "\n" not in str(exc)


def test_hooks_are_imported_only_when_named_and_run():
    data = copy.deepcopy(BASE)
    data["features"]["steps"].append({"name": "custom", "function": "pipeline_test_hook_never_exists:f",
                                      "lookback": 2})
    cfg = parse_config(data)  # validating the config does not import the hook
    assert "pipeline_test_hook_never_exists" not in sys.modules
    assert cfg.features.steps[-1].function == "pipeline_test_hook_never_exists:f"
