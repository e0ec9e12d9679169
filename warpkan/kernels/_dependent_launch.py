"""Programmatic dependent launch (PDL, compute capability 9.0+) for chains of Warp kernels.

A kernel that waits on the one before it normally starts only after that one has finished and its blocks
have left the GPU: the SMs idle through the first kernel's tail (its slowest blocks) and the second
kernel's launch. Launched with the programmatic-stream-serialization attribute, the second kernel's
blocks may become resident as soon as every block of the first has called ``griddepcontrol.
launch_dependents`` (``DEPENDENTS_SNIPPET``) and resources free up. They run whatever does not depend on
the first kernel's results (issuing weight copies, say) and then stop in ``griddepcontrol.wait``
(``WAIT_SNIPPET``), which returns once the first kernel has completed and its memory operations are
visible. So a kernel launched this way must execute ``WAIT_SNIPPET`` before it reads anything the previous
kernel writes and before it writes anything that kernel reads. Launched plainly, both instructions do
nothing.

Warp's launch API has no launch attributes, so :class:`DependentLaunch` replays a recorded ``wp.Launch``
through the driver's ``cuLaunchKernelEx`` with the same function, grid and packed arguments. CUDA-graph
capture records the attribute as a programmatic edge. Devices below 9.0, the CPU and drivers without
``cuLaunchKernelEx`` take the plain launch.
"""

from __future__ import annotations

import ctypes
import functools

import warp as wp

__all__ = ["DEPENDENTS_SNIPPET", "WAIT_SNIPPET", "DependentLaunch", "allow_dependents", "as_dependents",
           "dependent_launch_supported", "start_as_dependent", "wait_for_previous_grid"]

# Whether as_dependents makes the recorded launches of chained kernels dependents (a switch for A/B runs and
# for the tests that compare them with plain launches).
CHAINS_DEPENDENT = True

# The two PTX instructions (sm_90), guarded so that other targets compile them out.
WAIT_SNIPPET = """
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
"""
DEPENDENTS_SNIPPET = """
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
"""


@wp.func_native(WAIT_SNIPPET)
def wait_for_previous_grid(): ...


@wp.func_native(DEPENDENTS_SNIPPET)
def allow_dependents(): ...


@wp.func
def start_as_dependent():
    """Where a kernel of a dependent chain (:func:`as_dependents`) waits for the kernel before it on the stream
    to finish, and from where the kernel after it may be made resident. Before it a kernel may only read what
    was written before the kernel before it (that kernel lets it in only from its own call, once everything
    before that kernel has finished: a chain's inputs, the parameters) and write nothing but its own shared
    memory; as its first statement, it reads and writes nothing early. A plain launch (and the CPU) skips
    both."""
    wait_for_previous_grid()
    allow_dependents()


_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: an enum id padded to 8 bytes, then a 64-byte value union whose member for this
    # attribute is one int at its start
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_uint32), ("value", ctypes.c_int),
                ("value_rest", ctypes.c_uint32 * 15)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint),
    ]


@functools.lru_cache(maxsize=None)
def _driver_launch():
    """The driver's ``cuLaunchKernelEx``, or None."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = getattr(lib, "cuLaunchKernelEx", None)
        if fn is None:
            return None
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        return fn
    return None


def dependent_launch_supported(device) -> bool:
    """Whether launches on the Warp ``device`` can be programmatically dependent."""
    device = wp.get_device(device)
    return bool(device.is_cuda and device.arch >= 90 and _driver_launch() is not None)


def _grid(cmd: "wp.Launch") -> tuple:
    """The grid ``wp_cuda_launch_kernel`` gives a recorded launch (warp/native/warp.cu)."""
    dim, block = cmd.bounds.size, cmd.block_dim if cmd.block_dim > 0 else 256
    blocks = (dim + block - 1) // block
    if cmd.grid_stride:
        cap = cmd.max_blocks if cmd.max_blocks > 0 else 2**31 - 1
        return (max(1, min(blocks, cap)), 1, 1)
    gx = max(1, min(blocks, (1 << 24) // block))
    remaining = (blocks + gx - 1) // gx
    gy = max(1, min(remaining, 65535))
    gz = max(1, min((remaining + gy - 1) // gy, 65535))
    return (gx, gy, gz)


class DependentLaunch:
    """A recorded ``wp.Launch`` replayed as a programmatic dependent of the stream's previous kernel.

    ``params`` are the recorded launch's packed arguments (re-pointing them re-points this launch). The
    kernel must follow the rule in the module docstring."""

    def __init__(self, cmd: "wp.Launch"):
        if cmd.adjoint or cmd.cluster_dim > 1:
            raise ValueError("a dependent launch replays a forward, unclustered launch")
        self.cmd = cmd
        self.params = cmd.params
        self.enabled = dependent_launch_supported(cmd.device)
        if self.enabled:
            self._attribute = _LaunchAttribute()
            self._attribute.id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            self._attribute.value = 1  # programmaticStreamSerializationAllowed
            gx, gy, gz = _grid(cmd)
            self._config = _LaunchConfig(
                gx, gy, gz, cmd.block_dim if cmd.block_dim > 0 else 256, 1, 1, cmd.hooks.forward_smem_bytes,
                None, ctypes.pointer(self._attribute), 1,
            )

    def launch(self, stream: "wp.Stream | None" = None) -> None:
        cmd = self.cmd
        if not self.enabled or cmd.bounds.size == 0:
            cmd.launch(stream)
            return
        if stream is None:
            stream = cmd.device.stream
        runtime = wp._src.context.runtime
        # as wp.Launch.launch: a Warp graph capture keeps the module loaded while the graph lives
        if runtime.captures and runtime.core.wp_cuda_stream_is_capturing(stream.cuda_stream):
            graph = runtime.captures.get(runtime.core.wp_cuda_stream_get_capture_id(stream.cuda_stream))
            if graph is not None:
                graph._retain_module_exec(cmd.module_exec)
        self._config.hStream = stream.cuda_stream
        runtime.core.wp_cuda_context_push_current(cmd.device.context)
        try:
            result = _driver_launch()(ctypes.byref(self._config), cmd.hooks.forward, cmd.params_addr, None)
        finally:
            runtime.core.wp_cuda_context_pop_current()
        if result != 0:
            raise RuntimeError(f"cuLaunchKernelEx of {cmd.kernel.key} failed with CUDA error {result}")


def as_dependents(cmds: list) -> list:
    """Recorded launches of kernels that call :func:`start_as_dependent`, each made a programmatic
    dependent of the kernel before it (:class:`DependentLaunch`; a plain launch where the device cannot): in
    a chain of short kernels each one's launch and block start then overlap the tail of the one before it.
    Unchanged while ``CHAINS_DEPENDENT`` is off."""
    return [DependentLaunch(cmd) for cmd in cmds] if CHAINS_DEPENDENT else cmds
