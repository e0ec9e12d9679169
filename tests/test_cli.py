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
    assert main(["precompile", "--device", "cpu", "--family", "bspline", "--family", "geglu", "--orders", "2",
                 "--uniform-only"]) == 0
    out = capsys.readouterr().out
    assert "warpkan_edge_bspline_uniform_k2_float32" in out and "warpkan_geglu_float32_v4" in out
    assert "threads a block" not in out  # the CPU runs one


def test_precompile_jobs_build_every_module_into_this_process_cache(tmp_path, capsys, monkeypatch):
    """--jobs 2 builds the listed modules in two worker processes, into the kernel cache this process uses (a
    fresh one here): a cache entry for every module, each reported once, and the run's summary line."""
    import warp as wp

    from warpkan.kernels import precompile
    from warpkan.kernels.precompile import PrecompileConfig

    cache = tmp_path / wp.config.version
    monkeypatch.setattr(wp.config, "kernel_cache_dir", str(cache))
    assert main(["precompile", "--device", "cpu", "--family", "geglu", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    listed = [build.name for build in precompile.modules(["geglu"], PrecompileConfig(), is_cuda=False)]
    built = os.listdir(cache)
    for name in listed:
        assert sum(line.startswith(name + " ") for line in out.splitlines()) == 1, (name, out)
        assert any(entry.startswith(f"wp_{name}_") for entry in built), (name, built)
    assert f"{len(listed)} modules on cpu in " in out and "(2 at a time)" in out


@pytest.mark.parametrize("argv", [["precompile", "--jobs", "0"], ["demo", "--steps", "-3"]])
def test_non_positive_counts_are_argparse_errors(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "the value must be a positive int" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--config", "order=3,depth=2"], "unknown key 'depth'"),
    (["--config", "in=10,groups=3"], "groups must divide in"),
    (["--taylor", "2"], "--taylor 2: expected two integers"),
    (["--rational-order", "5;4"], "--rational-order 5;4: expected two integers"),
    (["--basis", "bessel"], "unknown basis bessel; known: chebyshev"),
    (["--family", "ukan_pairs"], "unknown family ukan_pairs; known: bspline, ukan, poly, rational, geglu"),
])
def test_precompile_bad_options_are_usage_errors(capsys, argv, message):
    assert message in _one_line_error(capsys, ["precompile", "--device", "cpu", *argv], status=2)


def test_precompile_lists_every_tiled_module():
    """The CUDA precompile covers the warp-tiled kernels the launchers pick: for every table size, the modules
    the table plans of the forward and backward passes launch (whole tables and bands) are among those the
    registry lists, and a pass whose shared memory does not fit is neither planned nor listed (checked without
    a GPU: the lists)."""
    from warpkan.kernels.bspline import family_of
    from warpkan.kernels.edge import registry
    from warpkan.kernels.edge import tiled as kbt
    from warpkan.kernels.edge.poly_family import poly_family

    for family in (family_of(3, True, "float32"), family_of(5, True, "float32"), family_of(2, False, "float64"),
                   poly_family("chebyshev", 12, "float64"), poly_family("lut", 32, "float32")):
        names = kbt.tiled_modules(family)
        assert len(set(names)) == len(names)
        assert set(names) <= set(registry.family_modules(family, is_cuda=True))
        for n_coef in (1, 4, 12, 40, 67, 90, 150, 259, 400, 2000):
            assert set(kbt.planned_modules(family, n_coef)) <= set(names), (family.key, n_coef)
    # k = 5: the 80-row banded backward does not fit shared memory, so it is not built
    k5 = [build.name for build in kbt.tiled_modules(family_of(5, True, "float32"))]
    assert not any(name.endswith("c80_bwd_banded") for name in k5)
    # float64, 12 bases: the 48-row forward does not fit (2 x 48 x 32 x 8 + 8 x 32 x 14 x 8 bytes), the backward does
    poly = [build.name for build in kbt.tiled_modules(poly_family("chebyshev", 12, "float64"))]
    assert not any(name.endswith("_tiled_c48") for name in poly) and any(name.endswith("_tiled_c48_bwd") for name in poly)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the warp-tiled kernels are CUDA-only")
def test_precompile_cuda_compiles_tiled_modules(capsys):
    # four worker processes: the parallel build on CUDA (each worker with a CUDA context of its own)
    assert main(["precompile", "--device", "cuda", "--orders", "1", "--uniform-only", "--jobs", "4"]) == 0
    out = capsys.readouterr().out
    assert "(4 at a time)" in out
    assert "warpkan_edge_bspline_uniform_k1_float32_tiled_c48_bwd_banded" in out
    assert "warpkan_transpose" in out  # the copies of public-layout parameters


# column names of the comparisons with GPU ceilings and of the CUDA-only measurements
GPU_ONLY_COLUMN_WORDS = ("HBM", "peak FLOP", "SIMT", "TB_s", "TB/s", "graphed", "peak_MiB", "memory", "target")


# the columns that name a row rather than measure it
IDENTIFYING_COLUMNS = ("case", "impl", "model")


def _check_cpu_results(rows: list[dict], markdown: str) -> None:
    """A CPU run's rows hold what was measured there: positive times, the backward timed wherever a step is,
    no empty values, no GPU-only columns, no tensor-core (tf32 / bf16 GEMM) rows, FLOP rates in GFLOP/s (in
    TFLOP/s they read 0.000826); below the table, a legend line for every column that measures something."""
    for row in rows:
        for key, value in row.items():
            assert value is not None, (key, row)
            assert not any(word in key for word in GPU_ONLY_COLUMN_WORDS + ("TFLOP",)), (key, row)
            if key.endswith("_ms"):
                assert isinstance(value, float) and value > 0, (key, row)
        if "total_ms" in row and "fwd_ms" in row:
            assert "bwd_ms" in row, row
        assert not {"tf32", "bf16"} & set(row.get("impl", "").split()), row
    header = markdown.split("\n")[2]
    assert not any(word in header for word in GPU_ONLY_COLUMN_WORDS), header
    columns = [column.strip() for column in header.strip("|").split("|")]
    for column in columns:
        if column not in IDENTIFYING_COLUMNS:
            assert f"\n- {column}: " in markdown, f"the legend does not explain {column!r}"
    if "total_ms" in columns and "bwd_ms" in columns:  # why total_ms can be less than fwd_ms + bwd_ms
        assert "timed apart" in markdown


def test_bench_quick_writes_json_and_markdown(tmp_path, capsys):
    assert main(["bench", "bspline", "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bspline.json").read_text())
    impls = {row["impl"] for row in data["rows"]}
    assert {"warpkan", "warpkan stencil", "warpkan gemm", "efficient-kan (torch)", "nn.Linear"} <= impls
    # every row is timed, except the optional peer's (inkan: when not installed, or for k != 3), which says why
    for row in data["rows"]:
        if row["impl"] == "inkan" and "note" in row:
            assert row["note"].startswith(("not installed", "skipped")), row
        else:
            assert row.get("total_ms", 0) > 0 and row.get("bwd_ms", 0) > 0, row
    markdown = (tmp_path / "bspline.md").read_text()
    assert "| case | impl |" in markdown
    _check_cpu_results(data["rows"], markdown)
    # the quick cases are not the ones the plot draws: no file, and no line saying one was written
    assert not (tmp_path / "bspline.png").exists()
    assert "plot written" not in capsys.readouterr().out


def test_bench_plot_is_reported_only_when_written(tmp_path, capsys):
    from warpkan import bench

    bench._load("bspline")
    rows = [{"case": f"N={2**17} 32->32 G={g} k=3", "impl": "warpkan", "total_ms": 1.0 + g / 1024} for g in (64, 1024)]
    bench._plot("bspline", rows, str(tmp_path / "drawn.png"))
    bench._plot("bspline", rows[:0], str(tmp_path / "empty.png"))
    out = capsys.readouterr().out
    assert (tmp_path / "drawn.png").stat().st_size > 1000 and not (tmp_path / "empty.png").exists()
    assert out.count("plot written") == 1 and str(tmp_path / "drawn.png") in out


# the models family's run is shared with tests/test_models.py (conftest: quick_bench), under xdist on one worker
@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.xdist_group("bench_models")) if f == "models" else f
    for f in families() if f != "bspline"])
def test_every_benchmark_family_runs_quick_on_cpu(quick_bench, family):
    status, out = quick_bench(family)
    assert status == 0
    rows = json.loads((out / f"{family}.json").read_text())["rows"]
    assert rows
    timed = [row for row in rows if any(key.endswith("_ms") and isinstance(value, float) for key, value in row.items())]
    assert timed, f"no timed rows in {family}"
    _check_cpu_results(rows, (out / f"{family}.md").read_text())


def test_demo_trains_and_writes_png(tmp_path, capsys):
    assert main(["demo", "--device", "cpu", "--steps", "600", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "| KAN [2, 5, 1]" in captured.out and "| MLP" in captured.out
    # the progress bars name each model whole (not cut at its first comma: "KAN [2:")
    for name in ("KAN [2, 5, 1], G=8, k=3", "UKAN [2, 5, 1], h=0.25, k=3", "MLP [2, 12, 12, 1], SiLU"):
        assert f"{name}: 100%" in captured.err, name
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured on cuda")
def test_peak_memory_of_a_training_step_counts_the_gradients_it_writes_cuda():
    # the step frees the last step's gradients first: a baseline taken with them allocated would subtract
    # them from the peak, and a layer of large parameters would seem to need less than its gradients
    from warpkan.bench.timing import peak_memory, training_step

    layer = torch.nn.Linear(1024, 1024, bias=False, device="cuda")
    x = torch.randn(8, 1024, device="cuda", requires_grad=True)
    step = training_step(layer, x, torch.randn(8, 1024, device="cuda"))
    step()
    grad_mib = layer.weight.numel() * 4 / 2**20
    assert peak_memory(step, "cuda") >= grad_mib


def _subparsers(parser):
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_option_has_help_and_the_help_is_plain_text():
    from warpkan.cli import build_parser

    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) == {"demo", "info", "precompile", "bench"}
    for name, command in [("warpkan", parser), *commands.items()]:
        text = command.format_help()
        assert "``" not in text and ":func:" not in text, name
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
    assert "UKAN" in commands["demo"].format_help() and "UKAN" in parser.format_help()
    assert "B-spline" in commands["precompile"].format_help()  # what it compiles


def _one_line_error(capsys, argv, status=1):
    assert main(argv) == status
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_cuda_device_without_a_gpu_is_a_one_line_error(tmp_path, capsys, monkeypatch, command):
    import warp as wp

    monkeypatch.setattr(wp, "is_cuda_available", lambda: False)
    out = tmp_path / "out"
    line = _one_line_error(capsys, [command, "--device", "cuda", "--out", str(out)])
    assert line.startswith(f"warpkan {command}: error: --device cuda:") and "no CUDA device" in line
    assert not out.exists()


def test_cuda_device_with_a_cpu_only_torch_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    import warp as wp

    monkeypatch.setattr(wp, "is_cuda_available", lambda: True)
    monkeypatch.setattr(wp, "get_cuda_device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = _one_line_error(capsys, ["demo", "--device", "cuda", "--out", str(tmp_path / "out")])
    assert "torch.cuda.is_available() is False" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["gpu", "cuda0", "cpu:0"])
def test_unknown_device_is_a_usage_error(capsys, device):
    assert "expected cpu, cuda or cuda:N" in _one_line_error(capsys, ["precompile", "--device", device], status=2)


def test_unknown_benchmark_family_is_a_usage_error(capsys):
    assert "unknown benchmark family nope" in _one_line_error(capsys, ["bench", "nope", "--device", "cpu"], status=2)


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_without_torch_demo_and_bench_say_how_to_install_it(tmp_path, child_env, command):
    """A process where ``import torch`` fails, as where torch is not installed."""
    import subprocess
    import sys

    out = tmp_path / "out"
    code = ("import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
            "from warpkan.cli import main\n"
            f"sys.exit(main([{command!r}, '--device', 'cpu', '--out', {str(out)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f'warpkan {command}: error: this command needs torch, not installed here: pip install "warpkan[torch]"']
    assert "Traceback" not in done.stdout + done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
