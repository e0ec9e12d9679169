import os

import pytest
import warp as wp

wp.config.quiet = True
wp.init()


def _devices():
    devices = ["cpu"]
    if wp.is_cuda_available():
        devices.append("cuda")
    only = os.environ.get("WARPKAN_TEST_DEVICES")
    if only:
        devices = [d for d in devices if d in only.split(",")]
    return devices


DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request):
    """Each test that takes ``device`` runs on Warp's CPU device and, when present, on cuda."""
    return request.param
