"""``warpkan precompile`` covers what a layer loads: a layer's first training step (forward and backward; on the
CPU, and on CUDA where present) loads no Warp module, at no block size, that the precompile list of its
configuration leaves out."""

import sys

import pytest
import torch
import warp as wp
import warp._src.context as wp_context

from warpkan.kernels import precompile
from warpkan.kernels._modules import ModuleBuild
from warpkan.kernels.precompile import PrecompileConfig
from warpkan.torch_bridge import GEGLUFFN, KATMLP, GRKANLinear, KANLinear, PolyKANLinear, UKANLinear, jet
from warpkan.torch_bridge._common import RecordedLaunches


class Loads:
    """The modules Warp loads, at the block size each load resolved (every launch, recorded or not, loads its
    module first), and the block sizes the launches ask for, while recording."""

    def __init__(self, monkeypatch):
        self.modules, self.launches = set(), set()
        load = wp_context.Module.load

        def recording_load(module, device, block_dim=None, *args, **kwargs):
            self.modules.add(ModuleBuild(module.name, block_dim))
            return load(module, device, block_dim, *args, **kwargs)

        monkeypatch.setattr(wp_context.Module, "load", recording_load)
        for name in ("launch", "launch_tiled"):
            monkeypatch.setattr(wp, name, self._recording_launch(getattr(wp, name)))

    def _recording_launch(self, launch):
        def recording(kernel, *args, block_dim=256, **kwargs):
            self.launches.add((kernel.module.name, block_dim))
            return launch(kernel, *args, block_dim=block_dim, **kwargs)

        return recording


@pytest.fixture
def loads(monkeypatch):
    # a replayed launch skips the module load: forget every recorded launch (those of earlier tests too)
    for name, module in list(sys.modules.items()):
        if name.startswith("warpkan.torch_bridge"):
            for value in list(vars(module).values()):
                if isinstance(value, RecordedLaunches):
                    value.clear()
    return Loads(monkeypatch)


def _inputs(rows: int, features: int, device, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rows * 131 + features)
    x = (torch.rand(rows, features, generator=generator, dtype=torch.float64) * 2 - 1) * scale
    return x.to(device=device, dtype=dtype).requires_grad_(True)


def _step(layer, x):
    layer(x).square().sum().backward()


def _taylor_step(model, x, pairs):
    u = jet(model, x, pairs=pairs)
    (u.d(1) - u.d2(*pairs[0])).square().mean().backward()


def _kan_nonuniform(device):
    layer = KANLinear(5, 3, device=device)
    layer.update_grid(_inputs(40, 5, device).detach())
    return layer


def _autocast_step(layer, x):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = layer(x)
    y.float().square().sum().backward()


def _create_graph_step(layer, x):
    (dx,) = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    dx.square().sum().backward()


BF16 = torch.bfloat16
# (id, families, config, step(device)): each step builds its layers and runs forward + backward once
CASES = [
    ("kan_k3_fp32", ["bspline"], PrecompileConfig(orders=(3,), grid=5, uniform_only=True),
     lambda d: _step(KANLinear(5, 3, device=d), _inputs(37, 5, d))),
    ("kan_k2_fp64", ["bspline"], PrecompileConfig(orders=(2,), dtypes=("float64",), grid=7, uniform_only=True),
     lambda d: _step(KANLinear(4, 3, grid_size=7, spline_order=2, dtype=torch.float64, device=d),
                     _inputs(29, 4, d, torch.float64))),
    ("kan_stencil", ["bspline"], PrecompileConfig(orders=(1,), grid=5, uniform_only=True),
     lambda d: _step(KANLinear(4, 6, spline_order=1, strategy="stencil", device=d), _inputs(31, 4, d))),
    ("kan_autocast_bf16", ["bspline"], PrecompileConfig(orders=(3,), grid=5, uniform_only=True),
     lambda d: _autocast_step(KANLinear(5, 3, device=d), _inputs(33, 5, d))),
    ("kan_nonuniform", ["bspline"], PrecompileConfig(orders=(3,), grid=5),
     lambda d: _step(_kan_nonuniform(d), _inputs(23, 5, d))),
    ("ukan_range", ["ukan"], PrecompileConfig(orders=(3,)),
     lambda d: _step(UKANLinear(4, 3, device=d), _inputs(27, 4, d))),
    ("ukan_table", ["ukan"], PrecompileConfig(orders=(2,)),
     lambda d: _step(UKANLinear(3, 2, spline_order=2, grid_delta=0.001, device=d), _inputs(26, 3, d, scale=10.0))),
    ("poly_lut", ["poly"], PrecompileConfig(orders=(4,), bases=("chebyshev",), poly_modes=("lut",)),
     lambda d: _step(PolyKANLinear(4, 3, 4, device=d), _inputs(25, 4, d))),
    ("poly_exact", ["poly"], PrecompileConfig(orders=(6,), bases=("legendre",), poly_modes=("exact",)),
     lambda d: _step(PolyKANLinear(4, 3, 6, basis="legendre", mode="exact", device=d), _inputs(24, 4, d))),
    ("rational", ["rational"], PrecompileConfig(group_size=2, rational_variants=("A",)),
     lambda d: _step(GRKANLinear(16, 5, num_groups=8, device=d), _inputs(21, 16, d))),
    ("rational_bf16", ["rational"], PrecompileConfig(dtypes=("bfloat16",), group_size=4, rational_variants=("B",)),
     lambda d: _step(GRKANLinear(16, 5, num_groups=4, variant="B", dtype=BF16, device=d), _inputs(22, 16, d, BF16))),
    ("katmlp", ["rational"], PrecompileConfig(), lambda d: _step(KATMLP(8, 16, device=d), _inputs(19, 8, d))),
    ("katmlp_autocast_bf16", ["rational"], PrecompileConfig(dtypes=("float32", "bfloat16"), rational_variants=("A",)),
     lambda d: _autocast_step(KATMLP(8, 16, device=d), _inputs(13, 8, d))),
    ("geglu_small", ["geglu"], PrecompileConfig(hidden=8, inter=24),
     lambda d: _step(GEGLUFFN(8, 24, device=d), _inputs(3, 8, d))),
    ("geglu_bf16", ["geglu"], PrecompileConfig(dtypes=("bfloat16",), hidden=8, inter=24, small_batch_rows=12),
     lambda d: _step(GEGLUFFN(8, 24, small_batch_rows=12, dtype=BF16, device=d), _inputs(11, 8, d, BF16))),
    ("geglu_large", ["geglu"], PrecompileConfig(hidden=8, inter=24),
     lambda d: _step(GEGLUFFN(8, 24, device=d), _inputs(20, 8, d))),
    ("taylor_kan", ["bspline"], PrecompileConfig(orders=(3,), grid=5, uniform_only=True, jets=((2, 1),)),
     lambda d: _taylor_step(torch.nn.Sequential(KANLinear(2, 32, device=d), KANLinear(32, 1, device=d)),
                            _inputs(18, 2, d), [(0, 0)])),
    ("taylor_poly_rational", ["poly", "rational"],
     PrecompileConfig(orders=(3, 4), bases=("chebyshev",), rational_variants=("A",), jets=((2, 2),)),
     lambda d: _taylor_step(torch.nn.Sequential(PolyKANLinear(2, 8, 4, device=d), GRKANLinear(8, 8, device=d),
                                                PolyKANLinear(8, 1, 3, mode="exact", device=d)),
                            _inputs(17, 2, d), [(0, 0), (0, 1)])),
    ("create_graph", ["poly", "rational"], PrecompileConfig(orders=(4,), bases=("chebyshev",), poly_modes=("lut",),
                                                            rational_variants=("A",), create_graph=True),
     lambda d: (_create_graph_step(PolyKANLinear(3, 2, 4, device=d), _inputs(15, 3, d)),
                _create_graph_step(GRKANLinear(8, 8, device=d), _inputs(14, 8, d)))),
]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("names, config, step", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_first_step_loads_only_precompiled_modules(loads, names, config, step, device):
    listed = precompile.modules(names, config, is_cuda=device == "cuda")
    cuda = precompile.modules(names, config, is_cuda=True)
    step(device)
    if device == "cuda":
        torch.cuda.synchronize()
    assert loads.modules, "the step loaded no Warp module: nothing was checked"
    missing = loads.modules - set(listed)
    assert not missing, f"the step loaded modules (at block sizes) precompile does not list: {sorted(missing)}"
    # on the CPU every load is at one thread a block; the block sizes the launches ask for there are the ones
    # listed for CUDA (the edge engine asks for one thread a block on the CPU)
    asked = {launch for launch in loads.launches if launch[1] != 1}
    assert asked <= set(cuda), f"launched at block sizes precompile does not list: {sorted(asked - set(cuda))}"


def test_precompile_lists_nothing_twice_and_only_the_asked_dtypes():
    config = PrecompileConfig(orders=(3,), dtypes=("float64",))
    for name in precompile.LAYER_FAMILIES:
        for is_cuda in (False, True):
            builds = precompile.family_modules(name, config, is_cuda)
            assert builds and len(builds) == len(set(builds)), name
            assert not any("float32" in build.name for build in builds), (name, builds)
    with pytest.raises(ValueError, match="unknown layer family 'spline'"):
        precompile.family_modules("spline", config, False)
