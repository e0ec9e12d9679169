"""A whole training step replayed from a CUDA graph.

A small network's step (a physics-informed residual's u_x and u_xx by ``create_graph=True``, ``backward`` and the
optimizer) is bound by the host: Python, autograd and a launch per kernel cost more than the GPU work. Captured
once and replayed, the step costs its GPU time. warpkan's ops launch on torch's current stream and allocate
through torch, so they capture like torch's own."""

import torch

__all__ = ["capture_step"]


def capture_step(step, warmup: int = 3):
    """Capture ``step()`` in a CUDA graph and return ``replay()``, which runs the step again on the GPU and
    returns what the captured call returned (the same tensors, refreshed in place).

    ``warmup`` eager calls come first, on a side stream, as ``torch.cuda.graph`` asks; they are training steps
    like the replays. The step must keep its tensors where they are: an optimizer made with
    ``capturable=True``, ``zero_grad(set_to_none=False)``, and new inputs copied into the captured input tensors
    rather than passed as new ones."""
    if not torch.cuda.is_available():
        raise RuntimeError("capture_step needs a CUDA device: CUDA graphs replay GPU work only")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()

    def replay():
        graph.replay()
        return outputs

    return replay
