"""Programmatic dependent launches (kernels/_dependent_launch): that the attribute takes effect on devices
that support it, and that other devices fall back to a plain launch."""

import pytest
import torch
import warp as wp

from warpkan.kernels import ukan as ku
from warpkan.kernels._dependent_launch import (
    DependentLaunch, allow_dependents, dependent_launch_supported, wait_for_previous_grid,
)

# The first kernel lets its dependents launch, then waits (up to ~0.2 s of clock cycles) for the second
# kernel to raise a flag. A dependent launch starts the second kernel while the first still runs, so the
# first sees the flag; a plain launch starts it only after the first has finished, so the wait times out.
_SPIN = """
#if defined(__CUDA_ARCH__)
    const long long start = clock64();
    while (*(volatile int*)flag.data == 0) {
        if (clock64() - start > 400000000LL) return 0;
    }
    return 1;
#else
    return 0;
#endif
"""


@wp.func_native(_SPIN)
def spin_for_flag(flag: wp.array(dtype=wp.int32)) -> int: ...


@wp.kernel
def first(flag: wp.array(dtype=wp.int32), saw_flag: wp.array(dtype=wp.int32)):
    allow_dependents()
    saw_flag[0] = spin_for_flag(flag)


@wp.kernel
def second(flag: wp.array(dtype=wp.int32), saw_flag: wp.array(dtype=wp.int32), after_wait: wp.array(dtype=wp.int32)):
    flag[0] = 1
    wait_for_previous_grid()
    after_wait[0] = saw_flag[0] + 10  # the first kernel's result is visible after the wait


@pytest.mark.parametrize("dependent", [False, True])
def test_dependent_launch_overlaps_the_previous_kernel(device, dependent):
    flag, saw_flag, after_wait = (wp.zeros(1, dtype=wp.int32, device=device) for _ in range(3))
    first_cmd = wp.launch(first, dim=1, inputs=[flag, saw_flag], device=device, record_cmd=True)
    second_cmd = wp.launch(second, dim=1, inputs=[flag, saw_flag, after_wait], device=device, record_cmd=True)
    if dependent:
        second_cmd = DependentLaunch(second_cmd)
    first_cmd.launch()
    second_cmd.launch()
    overlapped = dependent and dependent_launch_supported(device)
    assert saw_flag.numpy()[0] == int(overlapped)
    assert after_wait.numpy()[0] == 10 + int(overlapped)


@wp.kernel
def mark_threads(marks: wp.array3d(dtype=wp.int32)):
    i, j, k = wp.tid()
    marks[i, j, k] = marks[i, j, k] + 1


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 1, 257), (3, 5, 7), (7, 300, 64)])
@pytest.mark.parametrize("block_dim", [32, 256])
def test_dependent_launch_runs_every_thread_once(device, shape, block_dim):
    """The replayed grid is the one Warp's own launcher computes (partial blocks, 3-D launches)."""
    marks = wp.zeros(shape, dtype=wp.int32, device=device)
    cmd = DependentLaunch(wp.launch(mark_threads, dim=shape, inputs=[marks], device=device, block_dim=block_dim,
                                    record_cmd=True))
    cmd.launch()
    assert (marks.numpy() == 1).all()


# ------------------------------------------------------------------ UKAN's dependent chain
def _steps(layer, source, dy_source, steps: int = 3) -> list:
    """A few eager fwd + bwd steps, x and dy written each step by the kernel just before the layer's first
    launch, over NaN-filled buffers (a kernel that read them before that one finished would take NaN in, or,
    in UKAN's range search, which skips NaN, other groups); y, dx and every parameter gradient of each."""
    results = []
    for _ in range(steps):
        layer.zero_grad(set_to_none=True)
        x = torch.full_like(source, float("nan"))
        x.copy_(source)
        x.requires_grad_()
        y = layer(x)
        dy = torch.full_like(dy_source, float("nan"))
        dy.copy_(dy_source)
        y.backward(dy)
        results += [y.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in layer.parameters())]
    return results


def _recorded_dependents() -> set:
    from warpkan.torch_bridge import ukan_ops

    return {cmd.cmd.kernel.key for cmds, _ in ukan_ops._launch._records.values() for cmd in cmds
            if isinstance(cmd, DependentLaunch) and cmd.enabled}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n_rows", [1, 37, 1024, 20011])
def test_ukan_chain_matches_plain_launches_cuda(n_rows, monkeypatch):
    """The recorded launches of UKAN's range search and generator replay as programmatic dependents
    (``as_dependents``, compute capability 9.0+): bitwise the results of plain launches, eagerly and in a
    captured step."""
    from warpkan.kernels import _dependent_launch
    from warpkan.torch_bridge import UKANLinear, capture_step, ukan_ops

    torch.manual_seed(0)
    # deterministic: the spline's backward without atomics, so that any difference is the launches'
    layer = UKANLinear(13, 7, grid_delta=0.5, table_groups=32, deterministic=True, device="cuda")
    source = torch.rand(n_rows, 13, device="cuda") * 3.0 - 0.95
    dy_source = torch.randn(n_rows, 7, device="cuda")
    ukan_ops._launch.clear()
    dependent = _steps(layer, source, dy_source)
    assert layer.table_overflow() == 0
    # the range search's kernels (one block a feature for a small batch, three chunked launches for a large
    # one), the generator's forward and its three backward kernels
    search = ["range_block"] if ku._block_search(n_rows, 13) else ["range_init", "range_partial", "range_finalize"]
    expected = {f"_{name}_kernel__locals__{name}" for name in search} | {
        "_generator_forward_kernel__locals__generator_forward",
        "_generator_backward_kernels__locals__generator_backward_output",
        "_generator_backward_kernels__locals__generator_backward_hidden",
        "_generator_combine_kernel__locals__generator_combine"}
    assert _recorded_dependents() == (expected if dependent_launch_supported(wp.get_device("cuda")) else set())
    x_static = source.clone().requires_grad_()

    def step():
        layer.zero_grad(set_to_none=False)
        x_static.grad = None
        y = layer(x_static)
        y.backward(dy_source)
        return y

    y_captured = capture_step(step)().clone()
    captured_grads = [x_static.grad.clone(), *(p.grad.clone() for p in layer.parameters())]
    monkeypatch.setattr(_dependent_launch, "CHAINS_DEPENDENT", False)
    ukan_ops._launch.clear()
    plain = _steps(layer, source, dy_source)
    assert not _recorded_dependents()
    assert all(torch.equal(a, b) for a, b in zip(dependent, plain))
    assert torch.equal(y_captured, plain[0])
    assert all(torch.equal(a, b) for a, b in zip(captured_grads, plain[1:len(captured_grads) + 1]))
