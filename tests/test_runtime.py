"""The shared kernel runtime (warpkan/kernels/_runtime.py): launch or record, workspaces, the row-chunk
planner and the fixed-order chunk combine. Pure Warp and numpy."""

import subprocess
import sys

import numpy as np
import pytest
import warp as wp

from warpkan.kernels import _common, _runtime
from warpkan.kernels import rational as kr


@wp.kernel(enable_backward=False, module="warpkan_test_runtime")
def _affine(x: wp.array(dtype=wp.float32), scale: float, y: wp.array(dtype=wp.float32)):
    i = wp.tid()
    y[i] = scale * x[i] + 1.0


@wp.kernel(enable_backward=False, module="warpkan_test_runtime")
def _block_ids(out: wp.array(dtype=wp.int32)):
    block, lane = wp.tid()
    if lane == 0:
        out[block] = 10 * block + 7


# ---------------------------------------------------------------------------------------------- launch

def test_launch_runs_and_returns_none(device):
    x = wp.array(np.arange(5, dtype=np.float32), device=device)
    y = wp.zeros(5, dtype=wp.float32, device=device)
    assert _runtime.launch(_affine, 5, [x, 2.0], [y], device=device) is None
    np.testing.assert_array_equal(y.numpy(), 2.0 * np.arange(5, dtype=np.float32) + 1.0)


def test_record_runs_nothing_until_replayed(device):
    x = wp.array(np.linspace(-1, 1, 37, dtype=np.float32), device=device)
    direct = wp.zeros(37, dtype=wp.float32, device=device)
    _runtime.launch(_affine, 37, [x, 3.0], [direct], device=device)
    y = wp.zeros(37, dtype=wp.float32, device=device)
    cmds = _runtime.launch(_affine, 37, [x, 3.0], [y], device=device, record=True)
    assert isinstance(cmds, list) and len(cmds) == 1 and isinstance(cmds[0], wp.Launch)
    wp.synchronize_device(device)
    assert not y.numpy().any(), "a recorded launch must not run"
    cmds[0].launch()
    np.testing.assert_array_equal(y.numpy(), direct.numpy())
    y.zero_()
    cmds[0].launch()  # replayable
    np.testing.assert_array_equal(y.numpy(), direct.numpy())


def test_tiled_launch_and_record(device):
    want = 10 * np.arange(6, dtype=np.int32) + 7
    out = wp.zeros(6, dtype=wp.int32, device=device)
    _runtime.launch(_block_ids, [6], [], [out], device=device, block_dim=64, tiled=True)
    np.testing.assert_array_equal(out.numpy(), want)
    out.zero_()
    (cmd,) = _runtime.launch(_block_ids, [6], [], [out], device=device, block_dim=64, tiled=True, record=True)
    wp.synchronize_device(device)
    assert not out.numpy().any()
    cmd.launch()
    np.testing.assert_array_equal(out.numpy(), want)


# ------------------------------------------------------------------------------------------ workspaces

def test_workspace_reuses_grows_and_zeroes(device):
    ws = _runtime.Workspace(device)
    first = ws.get("partials", (4, 8), wp.float32)
    assert tuple(first.shape) == (4, 8) and first.dtype == wp.float32 and first.device == wp.get_device(device)
    first.fill_(5.0)
    smaller = ws.get("partials", (3, 2), wp.float32)
    assert smaller.ptr == first.ptr, "a request that fits must reuse the buffer"
    assert (smaller.numpy() == 5.0).all(), "get without zero leaves the contents"
    assert not ws.get("partials", (3, 2), wp.float32, zero=True).numpy().any()
    grown = ws.get("partials", (5, 8), wp.float32)
    assert tuple(grown.shape) == (5, 8)
    assert ws.get("partials", (5, 8), wp.float32).ptr == grown.ptr
    # names and dtypes are separate buffers
    assert ws.get("other", (5, 8), wp.float32).ptr != grown.ptr
    assert ws.get("partials", (5, 8), wp.float64).ptr != grown.ptr
    assert tuple(ws.get("flat", (7,), wp.int32).shape) == (7,)
    assert tuple(ws.get("empty", (0, 3), wp.float32).shape) == (0, 3)


def test_workspace_sort_pairs_is_stable(device):
    keys_np = np.array([3, 1, 3, 0, 1, 2, 0, 2, 1, 3], dtype=np.int32)
    count = keys_np.size
    keys = wp.array(np.concatenate([keys_np, np.zeros(count, np.int32)]), device=device)
    values = wp.array(np.arange(2 * count, dtype=np.int32), device=device)
    _runtime.Workspace(device).sort_pairs(keys, values, count, key_bits=2)
    order = np.argsort(keys_np, kind="stable")
    np.testing.assert_array_equal(keys.numpy()[:count], keys_np[order])
    np.testing.assert_array_equal(values.numpy()[:count], order)


def test_workspace_for_caches_per_device_and_stream(device):
    ws = _runtime.workspace_for(device)
    assert _runtime.workspace_for(wp.get_device(device), None) is ws
    assert ws.device == wp.get_device(device)
    if wp.get_device(device).is_cuda:
        assert _runtime.workspace_for(device, wp.Stream(device)) is not ws
    _runtime.clear_workspaces()
    assert _runtime.workspace_for(device) is not ws


def test_flat_workspace_carves_in_order(device):
    buffer = wp.zeros(20, dtype=wp.float64, device=device)
    flat = _runtime.FlatWorkspace(buffer)
    a = flat.get("a", (2, 3), wp.float64)
    b = flat.get("b", (4,), wp.float64)
    c = flat.get("c", (), wp.float64)
    assert tuple(a.shape) == (2, 3) and tuple(b.shape) == (4,) and c.size == 1
    assert a.ptr == buffer.ptr and b.ptr == buffer.ptr + 6 * 8 and c.ptr == buffer.ptr + 10 * 8
    a.fill_(1.0)
    b.fill_(2.0)
    np.testing.assert_array_equal(buffer.numpy()[:11], [1.0] * 6 + [2.0] * 4 + [0.0])
    buffer.fill_(9.0)
    assert not flat.get("d", (3, 3), wp.float64, zero=True).numpy().any()
    assert flat.offset == 20


def test_flat_workspace_refuses_too_small_or_wrong_dtype(device):
    flat = _runtime.FlatWorkspace(wp.zeros(10, dtype=wp.float32, device=device))
    flat.get("a", (2, 4), wp.float32)
    with pytest.raises(ValueError, match="partials"):
        flat.get("partials", (3,), wp.float32)  # 8 + 3 > 10
    assert flat.offset == 8, "a refused request takes nothing"
    flat.get("b", (2,), wp.float32)
    with pytest.raises(ValueError, match="float64"):
        _runtime.FlatWorkspace(wp.zeros(10, dtype=wp.float32, device=device)).get("c", (1,), wp.float64)


# ---------------------------------------------------------------------------------- row-chunk planner

PRIMES = (2, 3, 5, 13, 101, 997, 7919, 104729)
ROW_COUNTS = (0, 1, 4, 32, 33, 1000, 4096, *PRIMES)


@pytest.mark.parametrize("n_rows", ROW_COUNTS)
@pytest.mark.parametrize("parallel_items, target_threads, min_rows", [
    (1, 1, 1), (7, 1 << 16, 32), (4096, 1 << 16, 32), (1 << 20, 1 << 16, 32), (0, 1 << 14, 16), (3, 1 << 18, 1),
])
def test_row_chunks_bounds(n_rows, parallel_items, target_threads, min_rows):
    n_chunks, rows = _runtime.row_chunks(n_rows, parallel_items, target_threads, min_rows)
    assert n_chunks >= 1 and rows >= 1
    assert n_chunks * rows >= n_rows, "every row is in a chunk"
    if n_rows:
        assert (n_chunks - 1) * rows < n_rows, "no empty chunk"
        assert n_chunks <= -(-n_rows // min_rows)
    else:
        assert (n_chunks, rows) == (1, 1)
    assert n_chunks <= max(1, -(-target_threads // max(parallel_items, 1)))
    # a function of the shapes alone
    assert _runtime.row_chunks(n_rows, parallel_items, target_threads, min_rows) == (n_chunks, rows)


@pytest.mark.parametrize("n_rows, max_chunks, want", [
    (10, 4, (4, 3)), (10, 6, (5, 2)), (10, 100, (10, 1)), (10, 0, (1, 10)), (0, 5, (1, 1)), (1, 1, (1, 1)),
    (7919, 8, (8, 990)),
])
def test_split_rows(n_rows, max_chunks, want):
    assert _runtime.split_rows(n_rows, max_chunks) == want


def _bspline_row_chunks(n_rows, n_in, n_out, target):
    """The B-spline backward's tuned chunking as it was written in kernels/bspline.py (rows > 0)."""
    pairs = max(n_in * n_out, 1)
    n_chunks = max(1, min(-(-target // pairs), -(-n_rows // 32)))
    rows_per_chunk = -(-n_rows // n_chunks)
    return -(-n_rows // rows_per_chunk), rows_per_chunk


def _poly_chunks(total, threads_per_chunk, min_per_chunk, target):
    """The polynomial family's tuned chunking as it was written in kernels/poly.py (total > 0)."""
    n_chunks = max(1, min(-(-target // max(threads_per_chunk, 1)), -(-total // min_per_chunk)))
    per_chunk = -(-total // n_chunks)
    return -(-total // per_chunk), per_chunk


def _rational_layout(n_rows, vectors_per_group, num_groups, target_blocks):
    """The rational launch layout as it was written in kernels/rational.py before it used split_rows."""
    tiles = max(1, -(-vectors_per_group // kr._MAX_TILE_WIDTH))
    tile_width = -(-vectors_per_group // tiles)
    by_target = max(1, target_blocks // (num_groups * tiles))
    by_size = -(-(n_rows * tile_width) // kr._MIN_ITEMS_PER_BLOCK)
    chunks = max(1, min(by_target, by_size))
    rows_per_chunk = max(1, -(-n_rows // chunks))
    chunks = max(1, -(-n_rows // rows_per_chunk))
    return vectors_per_group, tile_width, tiles, chunks, rows_per_chunk, num_groups


def test_row_chunks_keeps_the_tuned_numbers():
    """The general planner gives each family's numbers exactly, with that family's constants."""
    for n_rows in ROW_COUNTS[1:] + (65536, 1 << 20):
        for n_in, n_out in ((1, 1), (3, 5), (64, 64), (768, 3072)):
            for target in (1 << 14, 1 << 16, 1 << 18):
                assert _runtime.row_chunks(n_rows, n_in * n_out, target, 32) == \
                    _bspline_row_chunks(n_rows, n_in, n_out, target)
                for min_per in (1, 4, 32):
                    assert _runtime.row_chunks(n_rows, n_in * n_out, target, min_per) == \
                        _poly_chunks(n_rows, n_in * n_out, min_per, target)
    for n_rows in ROW_COUNTS:
        for vectors, groups in ((1, 1), (6, 4), (192, 8), (2100, 2)):
            for target in (1, 7, 2048, 132 * 3 * 32):
                got = kr.layout(n_rows, vectors, groups, target)
                assert (got.vectors_per_group, got.tile_width, got.tiles_per_group, got.chunks, got.rows_per_chunk,
                        got.num_groups) == _rational_layout(n_rows, vectors, groups, target)


# ---------------------------------------------------------------------------------------- chunk combine

@pytest.mark.parametrize("scalar_name, np_dtype", [("float32", np.float32), ("float64", np.float64)])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("chunks", [0, 1, 7])
def test_combine_chunks_matches_numpy(device, scalar_name, np_dtype, accumulate, chunks):
    rng = np.random.default_rng(chunks)
    # magnitudes far apart, so that another summation order would give other bits
    partial = (rng.normal(size=(chunks, 5, 9)) * 10.0 ** rng.integers(-6, 7, size=(chunks, 5, 9))).astype(np_dtype)
    start = rng.normal(size=(5, 9)).astype(np_dtype)
    want = np.zeros((5, 9), dtype=np_dtype)
    for c in range(chunks):  # the kernel's order: chunk 0 first
        want = want + partial[c]
    if accumulate:
        want = want + start
    out = wp.array(start, device=device)
    part = wp.array(partial.reshape(chunks, 5, 9), dtype=out.dtype, device=device)
    assert _runtime.launch_combine_chunks(part, out, accumulate=accumulate) is None
    np.testing.assert_array_equal(out.numpy(), want)
    assert out.dtype == _common.SCALARS[scalar_name]


def test_combine_chunks_record_and_checks(device):
    partial = wp.array(np.ones((3, 2, 4), np.float32), device=device)
    out = wp.zeros((2, 4), dtype=wp.float32, device=device)
    (cmd,) = _runtime.launch_combine_chunks(partial, out, accumulate=True, record=True)
    wp.synchronize_device(device)
    assert not out.numpy().any()
    cmd.launch()
    cmd.launch()
    np.testing.assert_array_equal(out.numpy(), np.full((2, 4), 6.0, np.float32))
    with pytest.raises(ValueError, match="partial must have shape"):
        _runtime.launch_combine_chunks(partial, wp.zeros((4, 2), dtype=wp.float32, device=device))
    with pytest.raises(TypeError, match="partial must have the dtype of out"):
        _runtime.launch_combine_chunks(partial, wp.zeros((2, 4), dtype=wp.float64, device=device))
    assert _runtime.combine_chunks_kernel("float64") is _runtime.combine_chunks_kernel("float64")


# ------------------------------------------------------------------------------------- one definition each

def test_runtime_does_not_import_torch():
    code = "import sys, warpkan.kernels._runtime; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shared_helpers_have_one_definition():
    assert _runtime.lane_sum is _common.lane_sum
    assert _runtime.lane_group_width is _common.lane_group_width
    assert _runtime.on_stream is _common.on_stream
    # the families moved onto the runtime keep no private copies
    for name in ("_Workspace", "_workspace", "_workspaces", "clear_workspaces"):
        assert not hasattr(kr, name), name
