"""Programmatic dependent launches (kernels/_dependent_launch): that the attribute takes effect on devices
that support it, and that other devices fall back to a plain launch."""

import pytest
import warp as wp

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
