"""The launch plumbing every kernel family shares (pure Warp and numpy, no torch import).

One of each, so that a fix or a measurement lands in one place:

- :func:`launch`: run a kernel on a caller's stream, or record the launch for a caller's replay cache;
- :class:`Workspace`, :class:`FlatWorkspace`, :func:`workspace_for`, :func:`clear_workspaces`: scratch
  buffers (partial sums, sort keys) that a launcher asks for by name;
- :func:`split_rows`, :func:`row_chunks`: how a reduction over rows is cut into chunks, a function of the
  shapes alone (so the summation order, and the result, is the same on every run);
- :func:`combine_chunks_kernel`, :func:`launch_combine_chunks`: the fixed-order sum of per-chunk partials
  (:func:`launch_accumulate`: the one-chunk case, ``dst += src``);
- :func:`lane_sum`, :func:`lane_group_width`, :func:`on_stream` (defined in ``_common``, re-exported here).
"""

import functools

import numpy as np
import warp as wp

from ._common import SCALARS, lane_group_width, lane_sum, on_stream, scalar_name

__all__ = [
    "launch",
    "Workspace",
    "FlatWorkspace",
    "workspace_for",
    "clear_workspaces",
    "split_rows",
    "row_chunks",
    "combine_chunks_kernel",
    "launch_combine_chunks",
    "launch_accumulate",
    "lane_sum",
    "lane_group_width",
    "on_stream",
]


# ---------------------------------------------------------------------------------------------- launches

def launch(kernel, dim, inputs, outputs=(), device=None, stream=None, record: bool = False,
           block_dim: int = 256, tiled: bool = False):
    """Run ``kernel`` on ``stream`` (Warp's current stream of ``device`` when None), or with ``record=True``
    run nothing and return the recorded ``wp.Launch`` as a one-element list; None otherwise.

    Why a list: a launcher issues one or several launches, and the caller's replay cache (the torch bridge's
    ``RecordedLaunches``) concatenates what each returns, so a single launch is returned in the same shape.
    ``record_tape=False`` always: the launchers are the hand-written forward or backward themselves; a
    surrounding ``wp.Tape`` records them through ``Tape.record_func``, never launch by launch.
    ``block_dim``: threads a block on the GPU (Warp runs one thread a block on the CPU unless
    ``wp.config.enable_cpu_blocks``). ``tiled=True`` goes through ``wp.launch_tiled``, which appends the
    block as a trailing dimension (one block per item of ``dim``)."""
    run = wp.launch_tiled if tiled else wp.launch
    cmd = run(kernel, dim=dim, inputs=inputs, outputs=outputs, device=device, stream=stream, block_dim=block_dim,
              record_tape=False, record_cmd=record)
    return [cmd] if record else None


# -------------------------------------------------------------------------------------------- workspaces

def _size(shape) -> int:
    return int(np.prod(shape)) if len(shape) else 1


def _view(flat: wp.array, shape) -> wp.array:
    """``flat`` (1-D, exactly the size of ``shape``) as an array of ``shape``; 1-D shapes skip the reshape."""
    return flat.reshape(tuple(shape)) if len(shape) > 1 else flat


class Workspace:
    """Named scratch buffers on one device, grown on demand and reused between calls, and the device-wide
    stable key-value sort that the bucketing passes need.

    Why a named cache: the backward passes need scratch (per-chunk partial sums, sort keys) of a size that
    depends on the shapes; allocating it on every call costs a Warp allocation (and, on the GPU, possibly a
    synchronisation), while a buffer grown to the largest size seen is free after the first call.

    A host framework passes its own object with the same ``get`` (and, where a launcher sorts,
    ``sort_pairs``): the torch bridge allocates from torch's caching allocator and sorts with torch, which
    stays legal under CUDA-graph capture of torch's stream (Warp's allocator and ``wp.utils``' sort are not,
    on a foreign stream)."""

    def __init__(self, device):
        self.device = wp.get_device(device)
        self._buffers: dict[tuple, wp.array] = {}

    def get(self, name: str, shape, dtype, zero: bool = False) -> wp.array:
        """A view of ``shape`` on buffer ``name`` (one buffer per name and dtype), grown when too small;
        zeroed when ``zero``. The contents are otherwise whatever the last user left. A view handed out
        earlier for the same name becomes stale when the buffer grows."""
        size = _size(shape)
        key = (name, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.size < size:
            # one element at least: a zero-size Warp array has no allocation (ptr None) to view
            buf = wp.empty(max(size, 1), dtype=dtype, device=self.device)
            self._buffers[key] = buf
        view = _view(buf[:size], shape)
        if zero:
            view.zero_()
        return view

    def sort_pairs(self, keys: wp.array, values: wp.array, count: int, key_bits: int) -> None:
        """Stable sort of keys[:count] with values[:count] by the low ``key_bits`` bits; both arrays hold at
        least 2 * count entries (the radix sort's double buffer)."""
        wp.utils.radix_sort_pairs(keys, values, count, end_bit=key_bits)


class FlatWorkspace:
    """Scratch views carved one after the other out of one caller-owned flat buffer, with the ``get`` of
    :class:`Workspace`.

    Why: a recorded launch keeps the addresses of its scratch; carving the scratch out of a buffer the caller
    owns (a torch tensor of a launcher's ``*_scratch_size`` / ``*_partials_size`` elements) lets the caller
    decide how long that memory lives, and re-point it when replaying. Every ``get`` takes the next
    ``prod(shape)`` elements, so call order decides the layout (the launchers ask in a fixed order)."""

    def __init__(self, buffer: "wp.array"):
        self.buffer = buffer
        self.offset = 0

    def get(self, name: str, shape, dtype, zero: bool = False) -> wp.array:
        """The next ``prod(shape)`` elements as an array of ``shape``; ValueError naming ``name`` when the
        buffer is of another dtype or has too few elements left."""
        size = _size(shape)
        if dtype != self.buffer.dtype:
            raise ValueError(f"{name} needs {wp.types.type_repr(dtype)} scratch, the buffer holds "
                             f"{wp.types.type_repr(self.buffer.dtype)}")
        if self.offset + size > self.buffer.size:
            raise ValueError(f"{name} {tuple(shape)} needs {size} values after the {self.offset} already taken, "
                             f"the scratch buffer holds {self.buffer.size}")
        view = _view(self.buffer[self.offset: self.offset + size], shape)
        self.offset += size
        if zero:
            view.zero_()
        return view


_workspaces: dict[tuple, Workspace] = {}


def workspace_for(device, stream=None) -> Workspace:
    """The cached :class:`Workspace` of (device, stream). One per stream: passes that run concurrently on two
    streams must not share scratch, while passes on one stream are ordered by it and may. Buffer names keep
    the families apart."""
    device = wp.get_device(device)
    key = (str(device), stream.cuda_stream if stream is not None else 0)
    found = _workspaces.get(key)
    if found is None:
        found = _workspaces[key] = Workspace(device)
    return found


def clear_workspaces() -> None:
    """Free every cached scratch buffer (all devices and streams); the next pass allocates afresh."""
    _workspaces.clear()


# ------------------------------------------------------------------------------------- row-chunk planner

def split_rows(n_rows: int, max_chunks: int) -> tuple[int, int]:
    """(n_chunks, rows_per_chunk): ``n_rows`` cut into at most ``max(max_chunks, 1)`` balanced chunks with no
    empty one (the count is recomputed from the chunk size: 10 rows in 4 chunks are 3 + 3 + 3 + 1, and 10
    rows asked in 6 chunks become 5 chunks of 2).

    Always at least one chunk of at least one row, also for ``n_rows == 0`` (1, 1): partial buffers and
    combine launches keep a non-empty shape, and the one chunk's rows all lie past the end."""
    rows_per_chunk = max(1, -(-n_rows // max(max_chunks, 1)))
    return max(1, -(-n_rows // rows_per_chunk)), rows_per_chunk


def row_chunks(n_rows: int, parallel_items: int, target_threads: int, min_rows_per_chunk: int = 1) -> tuple[int, int]:
    """(n_chunks, rows_per_chunk) for a reduction over ``n_rows`` rows done by ``parallel_items`` threads a
    chunk (say one per (input, output) pair): enough chunks that about ``target_threads`` threads run, but
    at most ``ceil(n_rows / min_rows_per_chunk)`` of them (each chunk costs a partial row to write and to
    combine, so short chunks do not pay). The balanced split may then make chunks a little shorter than
    ``min_rows_per_chunk`` (9 rows, at least 4 a chunk: 3 chunks of 3).

    A function of the shapes alone, never of the device or the timing: the chunking fixes the order of the
    sums, so the result is bitwise the same on every run. The constants are each family's tuned values."""
    by_threads = -(-target_threads // max(parallel_items, 1))
    by_rows = -(-n_rows // max(min_rows_per_chunk, 1))
    return split_rows(n_rows, min(by_threads, by_rows))


# --------------------------------------------------------------------------------------- chunk combine

@functools.lru_cache(maxsize=None)
def combine_chunks_kernel(scalar_name: str = "float32") -> wp.Kernel:
    """Kernel (partial [chunks, A, B], accumulate, out [A, B]), one thread per (a, b): out[a, b] = (out[a, b]
    when accumulate, else nothing) + the sum of partial[c, a, b] over c = 0, 1, ... in that order.

    Why a fixed order and not atomics: float addition is not associative, so summing the chunks always in
    the same order is what makes a chunked reduction bitwise reproducible. ``accumulate=0`` overwrites
    ``out`` (the torch ops: no zeroing launch needed); 1 adds (Warp's adjoint convention). One small
    module per scalar type, shared by every family."""
    scalar = SCALARS[scalar_name]

    @wp.kernel(enable_backward=False, module=f"warpkan_combine_chunks_{scalar_name}")
    def combine_chunks(partial: wp.array3d(dtype=scalar), accumulate: int, out: wp.array2d(dtype=scalar)):
        a, b = wp.tid()
        acc = scalar(0.0)
        for chunk in range(partial.shape[0]):  # fixed order: deterministic
            acc = acc + partial[chunk, a, b]
        if accumulate:
            acc = acc + out[a, b]
        out[a, b] = acc

    return combine_chunks


def launch_combine_chunks(partial: "wp.array3d", out: "wp.array2d", accumulate: bool = True, stream=None,
                          record: bool = False):
    """out [A, B] (+)= sum over chunks of partial [chunks, A, B], with :func:`combine_chunks_kernel`; returns
    what :func:`launch` returns. ValueError/TypeError naming the argument for mismatched arrays."""
    if partial.ndim != 3 or out.ndim != 2 or tuple(partial.shape[1:]) != tuple(out.shape):
        raise ValueError(f"partial must have shape (chunks, {', '.join(map(str, out.shape))}) for out "
                         f"{tuple(out.shape)}, got {tuple(partial.shape)}")
    name = scalar_name(out, "out")
    if partial.dtype != out.dtype:
        raise TypeError(f"partial must have the dtype of out ({name}), got {wp.types.type_repr(partial.dtype)}")
    if out.shape[0] == 0 or out.shape[1] == 0:
        return [] if record else None
    return launch(combine_chunks_kernel(name), tuple(out.shape), [partial, int(accumulate)], [out],
                  device=out.device, stream=stream, record=record)


def launch_accumulate(src: "wp.array", dst: "wp.array", stream=None) -> None:
    """dst += src for two contiguous arrays of one shape and dtype (a gradient computed into scratch, added
    into the caller's under Warp's adjoint convention): :func:`launch_combine_chunks` with one chunk."""
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"src must have the shape of dst {tuple(dst.shape)}, got {tuple(src.shape)}")
    if dst.size == 0:
        return
    rows = dst.shape[0]
    launch_combine_chunks(src.reshape((1, rows, dst.size // rows)), dst.reshape((rows, dst.size // rows)),
                          accumulate=True, stream=stream)
