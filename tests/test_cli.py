"""The command line: info, precompile, bench (quick, CPU) and the demo's main job."""

import json
import os

import pytest
import torch

from warpkan.bench import families
from warpkan.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "warp" in out and "kernel cache" in out


def test_precompile_cpu(capsys):
    assert main(["precompile", "--device", "cpu", "--orders", "2", "--uniform-only"]) == 0
    assert "warpkan_bspline_k2_uniform_float32" in capsys.readouterr().out


def test_precompile_lists_every_tiled_module():
    """The CUDA precompile covers the warp-tiled kernels the launchers pick: each whole-table capacity's
    forward and backward, and the banded forward and backward tables (checked without a GPU: the list)."""
    from warpkan.kernels import bspline_tiled as kbt

    names = kbt.tiled_modules(3, True, "float32")
    launched = {kbt.tiled_kernels(3, True, "float32", cap).forward.module.name for cap in kbt.CAPACITIES["float32"]}
    launched |= {kbt.tiled_kernels(3, True, "float32", cap).backward.module.name for cap in kbt.CAPACITIES["float32"]}
    launched |= {kbt._forward_kernel(3, True, "float32", cap, True).module.name
                 for cap, _ in kbt.FORWARD_BANDED_CAPACITIES["float32"]}
    launched |= {kbt._backward_kernel(3, True, "float32", cap, True).module.name
                 for cap, _ in kbt.BANDED_CAPACITIES["float32"]}
    assert len(set(names)) == len(names) and set(names) == launched
    # k = 5: the 80-row banded backward does not fit shared memory, so it is not built
    assert not any(name.endswith("c80_bwd_banded") for name in kbt.tiled_modules(5, True, "float32"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the warp-tiled kernels are CUDA-only")
def test_precompile_cuda_compiles_tiled_modules(capsys):
    assert main(["precompile", "--device", "cuda", "--orders", "1", "--uniform-only"]) == 0
    out = capsys.readouterr().out
    assert "warpkan_bspline_tiled_k1_uniform_float32_c48_bwd_banded" in out


def test_bench_quick_writes_json_and_markdown(tmp_path):
    assert main(["bench", "bspline", "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bspline.json").read_text())
    impls = {row["impl"] for row in data["rows"]}
    assert {"warpkan", "warpkan stencil", "warpkan gemm", "efficient-kan (torch)", "nn.Linear"} <= impls
    # every row is timed, except the optional peer's (inkan: when not installed, or for k != 3), which says why
    for row in data["rows"]:
        if row["impl"] == "inkan" and "note" in row:
            assert row["note"].startswith(("not installed", "skipped")), row
        else:
            assert row.get("total_ms", 0) > 0, row
    assert "| case | impl |" in (tmp_path / "bspline.md").read_text()


@pytest.mark.parametrize("family", [f for f in families() if f != "bspline"])
def test_every_benchmark_family_runs_quick_on_cpu(tmp_path, family):
    assert main(["bench", family, "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / f"{family}.json").read_text())["rows"]
    assert rows
    timed = [row for row in rows if any(key.endswith("_ms") and isinstance(value, float) for key, value in row.items())]
    assert timed, f"no timed rows in {family}"


def test_demo_trains_and_writes_png(tmp_path, capsys):
    assert main(["demo", "--device", "cpu", "--steps", "600", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| KAN [2, 5, 1]" in out and "| MLP" in out
    assert os.path.getsize(tmp_path / "demo_surfaces.png") > 10_000


def test_training_step_clears_gradients_first():
    # a timed step must not add into the last step's gradients (optimizer.zero_grad() sets them to None)
    import torch

    from warpkan.bench.timing import training_step

    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    dy = torch.randn(4, 2)
    step = training_step(layer, x, dy)
    step()
    first = [layer.weight.grad.clone(), layer.bias.grad.clone(), x.grad.clone()]
    step()
    for before, after in zip(first, [layer.weight.grad, layer.bias.grad, x.grad]):
        torch.testing.assert_close(after, before, rtol=0, atol=0)
