"""Compression settings: a frozen spec parsed from YAML, turned into zarr 3 codecs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from pipeline.errors import ConfigError

__all__ = ["CodecSpec"]

_SHORT = {
    "blosc-lz4": {"name": "blosc", "cname": "lz4"},
    "blosc-zstd": {"name": "blosc", "cname": "zstd"},
    "zstd": {"name": "zstd"},
    "none": {"name": "none"},
}


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """How chunks are compressed.

    ``blosc`` with lz4 is the default: it decodes at several GB/s per core, which keeps
    streaming ahead of a GPU; ``zstd`` trades decode speed for size.

    The default does *not* shuffle bytes. Materialized windows repeat every step
    ``size`` times at shifting offsets, and lz4 finds those repeats in the raw bytes; a
    byte shuffle scatters them (``benchmarks/bench_storage.py`` prints the ratios and
    speeds of each codec on the demo windows). Use ``shuffle`` for smooth, non-repeating
    numeric data (per-step features).
    """

    name: Literal["blosc", "zstd", "none"] = "blosc"
    cname: Literal["lz4", "lz4hc", "zstd", "zlib", "blosclz"] = "lz4"
    clevel: int = 5
    shuffle: Literal["shuffle", "bitshuffle", "noshuffle"] = "noshuffle"

    @classmethod
    def from_mapping(cls, value: object, path: str) -> "CodecSpec":
        """Parse ``"blosc-lz4"``, ``"zstd"``, ``"none"`` or a mapping of the fields."""
        if isinstance(value, CodecSpec):
            return value
        if isinstance(value, str):
            if value not in _SHORT:
                raise ConfigError(path, "one of " + ", ".join(_SHORT) + " or a mapping", value)
            value = _SHORT[value]
        if not isinstance(value, Mapping):
            raise ConfigError(path, "a codec name or a mapping", value)
        fields = {"name": ("blosc", "zstd", "none"), "cname": ("lz4", "lz4hc", "zstd", "zlib", "blosclz"),
                  "shuffle": ("shuffle", "bitshuffle", "noshuffle")}
        kwargs: dict[str, Any] = {}
        for key, v in value.items():
            if key in fields:
                if v not in fields[key]:
                    raise ConfigError(f"{path}.{key}", "one of " + ", ".join(repr(f) for f in fields[key]), v)
                kwargs[key] = v
            elif key == "clevel":
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 22:
                    raise ConfigError(f"{path}.clevel", "an integer from 0 to 22", v)
                kwargs[key] = v
            else:
                raise ConfigError(f"{path}.{key}", "", detail="unknown key (expected one of: clevel, cname, name, shuffle)")
        spec = cls(**kwargs)
        if spec.name == "blosc" and spec.clevel > 9:
            raise ConfigError(f"{path}.clevel", "an integer from 0 to 9 for blosc", spec.clevel)
        return spec

    def zarr_compressors(self) -> list[Any]:
        """The zarr 3 codec objects (an empty list for no compression)."""
        from zarr.codecs import BloscCodec, ZstdCodec

        if self.name == "none":
            return []
        if self.name == "zstd":
            return [ZstdCodec(level=self.clevel)]
        return [BloscCodec(cname=self.cname, clevel=self.clevel, shuffle=self.shuffle)]

    def with_shuffle(self, shuffle: Literal["shuffle", "bitshuffle", "noshuffle"]) -> "CodecSpec":
        """The same codec with another shuffle (only blosc has one)."""
        return CodecSpec(name=self.name, cname=self.cname, clevel=self.clevel, shuffle=shuffle)

    def to_value(self) -> dict[str, Any]:
        """The mapping :meth:`from_mapping` reads back, with only the fields that apply
        to this codec: ``cname`` and ``shuffle`` are blosc's, ``clevel`` is not used
        without compression (``--print-config`` listed them for every codec)."""
        if self.name == "none":
            return {"name": "none"}
        if self.name == "zstd":
            return {"name": "zstd", "clevel": self.clevel}
        return {"name": "blosc", "cname": self.cname, "clevel": self.clevel, "shuffle": self.shuffle}

    def in_words(self) -> str:
        """The codec in words, its fields that apply only, e.g. ``blosc lz4 clevel 5
        noshuffle``, ``zstd clevel 3`` or ``none (uncompressed)``: how a refusal of a
        store built with another codec says what changed."""
        if self.name == "none":
            return "none (uncompressed)"
        return " ".join(f"clevel {v}" if k == "clevel" else str(v) for k, v in self.to_value().items())

    def describe(self) -> str:
        """Short text for reports, e.g. ``blosc(lz4, shuffle, 5)``."""
        if self.name == "blosc":
            return f"blosc({self.cname}, {self.shuffle}, {self.clevel})"
        return self.name if self.name == "none" else f"zstd({self.clevel})"
