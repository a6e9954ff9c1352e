"""Write units stored through zarr's own codecs and store API, and the dask layer that
writes each block of a split in the task that computes it.

Per array and unit, ``zarr.Array.__setitem__`` pays, beside the encoding itself, a
round trip into zarr's event loop, its indexing, a copy of each chunk into a fresh
buffer and a comparison of every element with the fill value (zarr stores no chunk
equal to it). For the small arrays beside the windows (labels, times, sessions) that
overhead is most of a unit's time; for the windows the copy and the comparison are two
more passes over every byte. Here a task makes at most one round trip for all its
units, and per unit:

- each chunk is encoded by the array's own codec pipeline (the same codecs, so the same
  bytes), straight from the block when it is whole, padded with the fill value as zarr
  pads it when it runs past the array's end;
- a chunk is empty, and deleted rather than stored, exactly when zarr would find it so
  (``NDBuffer.all_equal``); a chunk whose first element differs is settled by that one
  element;
- the bytes go to the store with its ``set``; the unit's ``_written`` row only after them.

Where every codec of an array has zarr's synchronous method and the store writes without
the event loop (local and memory stores), there is no round trip at all: the task's
thread runs the codecs and writes, as zarr's own synchronous pipeline does. Sharded
arrays (whose codec merges inner chunks into a shard) go through zarr's own ``setitem``.

The dask layer is one ``blockwise`` over the block plans and the split's arrays, so
dask fuses it with the blockwise layers that make the arrays: a block is written where
it is computed, with no transfer between workers and no task of its own. A build's
arrays, which all read the same held inputs, are not fused so: they carry their recipe
(:class:`MadeBlocks`), and one task per block makes and writes them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import zarr
from dask.task_spec import Task
from zarr.abc.codec import SupportsSyncCodec
from zarr.abc.store import SupportsDeleteSync, SupportsGetSync, SupportsSetSync
from zarr.buffer import default_buffer_prototype
from zarr.codecs import ShardingCodec
from zarr.core.sync import sync

from pipeline.storage import inflight
from pipeline.storage.checksum import crc32
from pipeline.storage.layout import unit_chunks

if TYPE_CHECKING:
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

__all__ = ["SHARED", "WRITTEN", "MadeBlocks", "is_fill", "read_rows_sync", "write_blocks", "write_units",
           "written_units"]

# dask.array is imported only where a graph is made: ``pipeline inspect`` reads a
# store's markers through this module, and dask.array (with what it imports) is most of
# that command's start-up.

#: Per split, one row per write unit: ``[1, crc32 of each array's block...]`` once the
#: unit is fully written (0 = not yet). One zarr chunk per row, so units never share one.
WRITTEN = "_written"
#: Group of arrays shared by all splits (the per-step features of virtual windows).
SHARED = "_shared"


@dataclass(frozen=True, eq=False)
class MadeBlocks:
    """Every array of a split made together, one task per block: the recipe that the
    arrays a build makes carry (``attrs["blocks"] = (recipe, field)``, see
    :mod:`pipeline.features.splitblocks`), so that :func:`write_blocks` makes and writes
    each block in one task.

    ``tasks[j]`` is an inline task (no key) whose result maps each field to block
    ``j`` of that array (``chunks[j]`` samples); its dependencies are chunks of
    ``inputs``. ``makers[j]``, when given, is the same block as a callable
    ``maker(lo, hi)`` that makes the fields of its samples ``lo .. hi - 1`` only: the
    writer then makes a block one write unit at a time.
    """

    name: str
    chunks: tuple[int, ...]
    tasks: tuple[Task, ...]
    inputs: tuple[da.Array, ...]
    makers: tuple[Task, ...] = ()

    def graph(self) -> HighLevelGraph:
        """The graph whose key ``(name, j)`` is made block ``j``, with its inputs'."""
        from dask.highlevelgraph import HighLevelGraph

        layer = {(self.name, j): Task((self.name, j), t.func, *t.args, **t.kwargs) for j, t in enumerate(self.tasks)}
        return HighLevelGraph.from_collections(self.name, layer, dependencies=self.inputs)


def _made(arrays: Mapping[str, Any], block: int) -> tuple[MadeBlocks, tuple[tuple[str, str], ...]] | None:
    """The one recipe that every array is a field of, with blocks of ``block`` samples
    (the last may be shorter), and each array's field; ``None`` otherwise."""
    found = []
    for a in arrays.values():
        attrs = getattr(a, "attrs", None)
        carried = attrs.get("blocks") if isinstance(attrs, Mapping) else None
        if not (isinstance(carried, tuple) and len(carried) == 2 and isinstance(carried[0], MadeBlocks)):
            return None
        found.append(carried)
    made = found[0][0]
    if any(m is not made for m, _ in found):
        return None
    if any(c != block for c in made.chunks[:-1]) or made.chunks[-1] > block:
        return None
    return made, tuple((name, str(field)) for name, (_, field) in zip(arrays, found))


def is_fill(chunk: Any, fill_value: Any) -> bool:
    """Whether zarr finds ``chunk`` (an ``NDBuffer``) equal to ``fill_value``, and so
    stores nothing for it.

    zarr compares every element (``NDBuffer.all_equal``: bit patterns for a float fill of
    zero, ``np.array_equal`` with NaN equal to NaN otherwise). An element that differs
    decides it alone, so the first element is compared first: a chunk of data almost
    always differs there, and the whole comparison (a pass over the chunk) is left for
    chunks that might be empty.
    """
    flat = chunk.as_numpy_array().reshape(-1)
    if flat.dtype.kind in "biu" and isinstance(fill_value, (bool, int, np.bool_, np.integer)):
        # Integers equal by value alone, which is all zarr's comparison does for them
        # (``np.array_equal``), here without its broadcasting and its checks: a split's
        # session and instrument ids start at the fill value, 0, so their small chunks
        # were compared whole, two calls each: 5% of a virtual build's write tasks.
        return bool(flat.size == 0 or (flat[0] == fill_value and (flat == fill_value).all()))
    if (flat.size and flat.dtype.kind == "f" and isinstance(fill_value, (float, int, np.floating, np.integer))
            and not isinstance(fill_value, (bool, np.bool_))):
        # A first element that differs in value (and is not NaN beside a NaN fill)
        # differs by either of zarr's comparisons, as numpy promotes the two alike: a
        # scalar comparison, where a buffer, its broadcast and zarr's checks cost 0.1 ms
        # per chunk. An equal one (-0.0 beside 0.0 among them) is left to zarr.
        first = flat[0]
        if first != fill_value and not (first != first and fill_value != fill_value):
            return False
    if flat.size and not type(chunk).from_numpy_array(flat[:1]).all_equal(fill_value):
        return False
    return bool(chunk.all_equal(fill_value))


def _fill_value(spec: Any) -> Any:
    # zarr v3 metadata always holds a fill value; v2's may be null (then the default).
    return spec.fill_value if spec.fill_value is not None else spec.dtype.default_scalar()


def _whole_chunks(arr: Any) -> bool:
    """Whether an array's chunks are whole rows of a zarr 3 array without shards: the
    layout :func:`_chunks` encodes (every array the writer creates, but sharded ones)."""
    md = arr.metadata
    return (md.zarr_format == 3 and not any(isinstance(c, ShardingCodec) for c in md.codecs)
            and tuple(md.chunk_grid.chunk_shape[1:]) == tuple(md.shape[1:]))


def _chunks(arr: Any, part: np.ndarray, start: int) -> list[tuple[Any, Any, Any]]:
    """``(store path, chunk or None when empty, chunk spec)`` for the chunks of rows
    ``start .. start + len(part)`` of an unsharded array (``start`` on a chunk boundary,
    every other axis one whole chunk)."""
    md = arr.metadata
    proto = default_buffer_prototype()
    rows = int(md.chunk_grid.chunk_shape[0])
    # One spec for every chunk: a regular grid's (zarr asserts it) holds the chunk's
    # shape, dtype, fill value and config, none of which depend on the chunk's coordinates.
    spec = md.get_chunk_spec((start // rows,) + (0,) * (part.ndim - 1), arr.config, proto)
    fill = _fill_value(spec)
    out = []
    for a in range(0, part.shape[0], rows):
        coords = ((start + a) // rows,) + (0,) * (part.ndim - 1)
        piece = part[a : a + rows]
        if piece.shape == tuple(spec.shape):
            chunk = proto.nd_buffer.from_numpy_array(piece)
        else:  # past the array's end: zarr stores the whole chunk, the rest fill value
            chunk = proto.nd_buffer.create(shape=spec.shape, dtype=spec.dtype.to_native_dtype(), order=spec.order,
                                           fill_value=fill)
            chunk[: piece.shape[0]] = piece
        empty = not spec.config.write_empty_chunks and is_fill(chunk, fill)
        out.append((arr.store_path / md.encode_chunk_key(coords), None if empty else chunk, spec))
    return out


async def _store(arr: Any, part: np.ndarray, start: int) -> None:
    """Rows ``start ..`` of one array: its chunks encoded and set (empty ones deleted,
    as zarr does), or, sharded (or chunked along other axes), through zarr's own
    ``setitem``."""
    if not _whole_chunks(arr):
        await arr.setitem(slice(start, start + part.shape[0]), part)
        return
    chunks = _chunks(arr, part, start)
    full = [(chunk, spec) for _, chunk, spec in chunks if chunk is not None]
    encoded = iter(await arr.codec_pipeline.encode(full) if full else [])
    writes = []
    for path, chunk, _ in chunks:
        data = next(encoded) if chunk is not None else None
        writes.append(path.delete() if data is None else path.set(data))
    await asyncio.gather(*writes)


async def _store_units(arrays: Mapping[str, Any], written: Any,
                       plans: Sequence[tuple[int, int, dict[str, np.ndarray], np.ndarray]]) -> None:
    for unit, start, parts, marker in plans:
        await asyncio.gather(*(_store(arrays[name], part, start) for name, part in parts.items()))
        # The marker only once every array of the unit is stored: a unit without one is
        # rewritten by a resumed write.
        await _store(written, marker, unit)


#: :func:`_sync_capable`'s answers, by the store's and the codecs' types.
_SYNC_CAPABLE: dict[tuple[type, ...], bool] = {}


def _sync_capable(codecs: tuple[Any, ...], store: Any) -> bool:
    """Whether ``codecs`` all have zarr's synchronous methods and ``store`` writes and
    deletes without the event loop. Asked once per combination of types:
    ``isinstance`` against a runtime-checkable protocol lists the protocol's members
    and looks each up (about 30 us a check), and a write asked it of every array of
    every unit, and zarr's ``StorePath`` again of every chunk: a third of the Python
    time of a build's write tasks (benchmarks/README.md)."""
    key = (type(store), *(type(c) for c in codecs))
    found = _SYNC_CAPABLE.get(key)
    if found is None:
        found = _SYNC_CAPABLE[key] = (all(isinstance(c, SupportsSyncCodec) for c in codecs)
                                      and isinstance(store, SupportsSetSync) and isinstance(store, SupportsDeleteSync))
    return found


def _sync_codecs(arr: Any) -> tuple[Any, ...] | None:
    """An array's codecs in the order its codec pipeline applies them, when every one
    has zarr's synchronous method (``SupportsSyncCodec``) and its store writes without
    the event loop (``SupportsSetSync``, ``SupportsDeleteSync``: local and memory
    stores); ``None`` otherwise."""
    pipe = arr.codec_pipeline
    codecs = (*getattr(pipe, "array_array_codecs", ()), getattr(pipe, "array_bytes_codec", None),
              *getattr(pipe, "bytes_bytes_codecs", ()))
    if not _whole_chunks(arr) or not _sync_capable(codecs, arr.store_path.store):
        return None
    return codecs


def _store_sync(arr: Any, codecs: tuple[Any, ...], part: np.ndarray, start: int) -> None:
    """:func:`_store` without the event loop: each chunk through the synchronous method
    of each codec, in the order and with the chunk specs of zarr's codec pipeline
    (``BatchedCodecPipeline.encode_batch``, whose asynchronous methods run these), then
    the store's ``set_sync`` (``delete_sync`` for an empty chunk, or an encoding of
    ``None``). ``codecs`` comes from :func:`_sync_codecs`, which checked the store too:
    the store is called itself, not through ``StorePath``, which checks it again."""
    store = arr.store_path.store
    for path, chunk, spec in _chunks(arr, part, start):
        data = chunk
        for codec in codecs:
            if data is None:
                break
            data = codec._encode_sync(data, spec)
            spec = codec.resolve_metadata(spec)
        if data is None:
            store.delete_sync(path.path)
        else:
            store.set_sync(path.path, data)


def read_rows_sync(arr: zarr.Array, rows: Sequence[int] | None = None) -> np.ndarray | None:
    """Every row of a table chunked one row per chunk (a split's ``_written``), or only
    ``rows`` (the others left at the fill value), read without the event loop: each
    chunk's bytes by the store's ``get_sync`` and decoded by the synchronous method of
    each codec, in reverse order, as zarr's pipeline decodes them; a missing chunk is
    the fill value. ``None`` where the array's codecs or store have no synchronous
    methods (zarr's array API serves then).

    zarr's own read of a table of a thousand one-row chunks (a build's markers) goes
    through its event loop chunk by chunk: a tenth of a second per split, twice per write.
    """
    target = arr.async_array
    codecs = _sync_codecs(target)
    md = target.metadata
    if (codecs is None or not isinstance(target.store_path.store, SupportsGetSync)
            or md.chunk_grid.chunk_shape[0] != 1):
        return None
    proto = default_buffer_prototype()
    out = np.zeros(md.shape, dtype=md.dtype.to_native_dtype())
    if out.size and md.fill_value is not None:
        out[...] = md.fill_value
    # The spec each codec was given when encoding: one for every row of a regular grid.
    spec = md.get_chunk_spec((0,) * len(md.shape), target.config, proto)
    specs = []
    for codec in codecs:
        specs.append(spec)
        spec = codec.resolve_metadata(spec)
    store = target.store_path.store  # checked above: called itself, not through StorePath's check per call
    for u in range(md.shape[0]) if rows is None else rows:
        coords = (int(u),) + (0,) * (len(md.shape) - 1)
        data = store.get_sync((target.store_path / md.encode_chunk_key(coords)).path, prototype=proto)
        if data is None:
            continue
        for codec, given in zip(reversed(codecs), reversed(specs)):
            data = codec._decode_sync(data, given)
        out[u] = data.as_numpy_array().reshape(out.shape[1:])
    return out


def written_units(group: zarr.Group, split: str, units: Sequence[int] | None = None) -> np.ndarray:
    """Boolean per write unit of a split (or per unit of ``units`` only): fully written
    (its ``_written`` row is set).

    A row whose chunk cannot be decoded (a crash mid-write) counts as not written.
    """
    table = group[f"{split}/{WRITTEN}"]
    picked = None if units is None else np.asarray(units, dtype=np.int64)
    try:
        rows = read_rows_sync(table, None if picked is None else picked.tolist())
        if rows is not None:
            return (rows[:, 0] if picked is None else rows[picked, 0]) == 1
        return np.asarray(table[:, 0] if picked is None else table.oindex[picked, 0]) == 1
    except Exception:  # noqa: BLE001 - a torn marker chunk; read rows one by one
        todo = range(table.shape[0]) if picked is None else picked.tolist()
        out = np.zeros(len(todo), dtype=bool)
        for i, u in enumerate(todo):
            try:
                out[i] = int(table[int(u), 0]) == 1
            except Exception:  # noqa: BLE001
                out[i] = False
        return out


def write_units(arrays: Mapping[str, zarr.Array], written: zarr.Array, units: Sequence[tuple[int, int, int]],
                block_start: int, blocks: Mapping[str, np.ndarray], *,
                stopped: Callable[[], bool] | None = None) -> int:
    """Write units of a split's arrays from one block, each followed by its row of
    ``written``: ``[1, crc32 of each array's part...]``.

    Parameters
    ----------
    arrays, written
        The split's open arrays by name, and its ``_written`` table.
    units
        ``(unit, start, stop)`` sample ranges, inside the block, of the units to write.
    block_start, blocks
        The block's first sample, and its rows of each array.
    stopped
        Asked before each unit: ``True`` once the write call was stopped
        (:mod:`pipeline.storage.inflight`), and no further unit is written.

    Returns
    -------
    int
        The number of units written.
    """
    plans = []
    for unit, start, stop in units:
        parts = {}
        crcs = []
        for name, block in blocks.items():
            part = np.ascontiguousarray(block[start - block_start : stop - block_start], dtype=arrays[name].dtype)
            # The contiguous part itself, not a bytes copy of it.
            crcs.append(crc32(part.reshape(-1).view(np.uint8)))
            parts[name] = part
        plans.append((unit, start, parts, np.array([[1, *crcs]], dtype=np.uint64)))
    targets = {k: a.async_array for k, a in arrays.items()}
    codecs = {k: _sync_codecs(a) for k, a in targets.items()}
    marker_codecs = _sync_codecs(written.async_array)
    if marker_codecs is None or any(c is None for c in codecs.values()):
        if stopped is not None and stopped():
            return 0
        sync(_store_units(targets, written.async_array, plans))
        return len(plans)
    # Local and memory stores: no event loop at all (zarr's own synchronous codec and
    # store methods), the worker's thread encodes and writes.
    done = 0
    for unit, start, parts, marker in plans:
        if stopped is not None and stopped():
            break
        for name, part in parts.items():
            _store_sync(targets[name], codecs[name], part, start)
        _store_sync(written.async_array, marker_codecs, marker, unit)
        done += 1
    return done


def _write_block(plan: np.ndarray, *blocks: np.ndarray, write: Callable[..., int], location: str,
                 storage_options: dict | None, split: str, names: tuple[str, ...], call: str, ndim: int) -> np.ndarray:
    start, todo = plan[0]
    count = write(location, storage_options, split, todo, start, dict(zip(names, blocks)), call) if todo else 0
    return np.full((1,) * ndim, count, dtype=np.int64)


def _write_made(plan: tuple[int, list], made: Mapping[str, np.ndarray], *, write: Callable[..., int], location: str,
                storage_options: dict | None, split: str, fields: tuple[tuple[str, str], ...], call: str) -> np.ndarray:
    start, todo = plan
    blocks = {name: made[field] for name, field in fields}
    count = write(location, storage_options, split, todo, start, blocks, call) if todo else 0
    return np.full((1,), count, dtype=np.int64)


def _write_made_units(plan: tuple[int, list], maker: Callable[[int, int], Mapping[str, np.ndarray]], *,
                      write: Callable[..., int], location: str, storage_options: dict | None, split: str,
                      fields: tuple[tuple[str, str], ...], call: str) -> np.ndarray:
    """:func:`_write_made` a unit at a time: each unit's samples made, then written
    (its data, then its marker), before the next unit's are made."""
    start, todo = plan
    count = 0
    for unit in todo:
        if inflight.stopped(call):  # the write failed or was interrupted: nothing more to make
            break
        made = maker(unit[1] - start, unit[2] - start)
        count += write(location, storage_options, split, [unit], unit[1], {name: made[field] for name, field in fields},
                       call)
        del made  # this unit's arrays freed before the next unit's are made
    return np.full((1,), count, dtype=np.int64)


def _made_writes(write: Callable[..., int], location: str, storage_options: dict | None, split: str,
                 made: MadeBlocks, fields: tuple[tuple[str, str], ...], plans: np.ndarray, needed: list[int],
                 token: str) -> da.Array:
    """One task per block to write: it makes the block (the recipe's task, inline) and
    writes it, a unit at a time where the recipe has makers."""
    name = f"write-units-{split}-{token}"
    step, recipes = (_write_made_units, made.makers) if made.makers else (_write_made, made.tasks)
    layer = {(name, k): Task((name, k), step, plans[b], recipes[b], write=write, location=location,
                             storage_options=storage_options, split=split, fields=fields, call=token)
             for k, b in enumerate(needed)}
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    graph = HighLevelGraph.from_collections(name, layer, dependencies=made.inputs)
    return da.Array(graph, name, chunks=((1,) * len(needed),), dtype=np.int64, meta=np.empty((0,), dtype=np.int64))


def write_blocks(write: Callable[..., int], location: str, storage_options: dict | None, split: str,
                 arrays: Mapping[str, da.Array], *, unit: int, block: int, done: np.ndarray,
                 token: str) -> da.Array | None:
    """The dask array (one count per block) whose computation writes a split's units
    that ``done`` does not mark, a block of ``block`` samples per task; ``None`` when
    every unit is written.

    Each array is rechunked to the blocks (a no-op for arrays made in them), and one
    ``blockwise`` layer calls ``write(location, storage_options, split, todo, start,
    {name: block}, token)`` per block, so dask fuses it with the blockwise layers that
    compute the blocks. Blocks with nothing left to write are culled, with what they
    would have read. Arrays that a build made together, in these blocks
    (:class:`MadeBlocks`), are made and written by one task per block instead: in a
    build's graph, whose arrays all read the same held inputs, dask fused the write with
    none of the layers that make them.
    """
    n = int(next(iter(arrays.values())).shape[0])
    starts = range(0, n, block)
    plans = np.empty(len(starts), dtype=object)
    needed = []
    for b, start in enumerate(starts):
        stop = min(n, start + block)
        todo = [(u, u * unit, min(stop, (u + 1) * unit)) for u in range(start // unit, -(-stop // unit))
                if not done[u]]
        plans[b] = (start, todo)
        if todo:
            needed.append(b)
    if not needed:
        return None
    made = _made(arrays, block)
    if made is not None:
        return _made_writes(write, location, storage_options, split, made[0], made[1], plans, needed, token)
    import dask.array as da

    # Every axis of every array is an axis of the output (one chunk each): dask fuses a
    # blockwise layer with its inputs' only when it contracts none of their axes.
    args: list[Any] = [da.from_array(plans, chunks=1, name=f"write-plan-{split}-{token}"), ("i",)]
    out_ind = ["i"]
    for k, a in arrays.items():
        aligned = a.rechunk({0: unit_chunks(n, block), **{i: -1 for i in range(1, a.ndim)}})
        extra = tuple(f"{k}.{j}" for j in range(1, a.ndim))
        args += [aligned, ("i", *extra)]
        out_ind += extra
    out = da.blockwise(_write_block, tuple(out_ind), *args, write=write, location=location,
                       storage_options=storage_options, split=split, names=tuple(arrays), call=token,
                       ndim=len(out_ind), align_arrays=False, adjust_chunks={i: 1 for i in out_ind},
                       dtype=np.int64, meta=np.empty((0,) * len(out_ind), dtype=np.int64),
                       name=f"write-units-{split}-{token}")
    return out if len(needed) == len(starts) else out.blocks[needed]
