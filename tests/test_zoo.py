"""ExecuTorch's model zoo architectures end to end (tests/vision_models.py, inception_v3.py,
zoo_models.py; random weights, nothing downloaded): export with the VulkanPartitioner, run on
WebGPU, compare with torch eager at the exported program's live sizes.

Tolerance (fp32), every model: atol 1e-4, rtol 1e-3, as for MobileNet V2 and ResNet-18 in
test_vision_ops.py: the GPU sums a convolution's or a matmul's products in another order than torch.
The large models (a minute or more of lowering each on two cores) run only with PTE_WGPU_SLOW=1."""

import functools
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.export import Dim

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .background import Background
from .exporting import export_pte
from .inception_v3 import InceptionV3
from .test_int8_conv import _output_steps
from .test_more_ops import _delegate_ops, _xnnpack_static, export_quantized
from .vision_models import DeepLabV3, MobileNetV2, MobileNetV3Small, ResNet50, randomize_batch_norms
from .zoo_models import EDSR, MobileBert, Wav2Letter, deit_tiny, vit_b16

pytestmark = pytest.mark.usefixtures("adapter")
SLOW = pytest.mark.skipif(os.environ.get("PTE_WGPU_SLOW") != "1", reason="slow (minutes); set PTE_WGPU_SLOW=1")


def image(lo, hi):
    """A square image input whose side is dynamic in lo..hi."""
    s = Dim(f"side_{lo}_{hi}", min=lo, max=hi)
    return (torch.randn(1, 3, hi, hi),), ({2: s, 3: s},)


def static_image(side):
    return (torch.randn(1, 3, side, side),), None


def waveform(lo, hi):
    return (torch.randn(1, 1, hi),), ({2: Dim("samples", min=lo, max=hi)},)


def tokens(seq):
    return (torch.randint(0, 30522, (1, seq)),), None


# name -> (module factory, (sample, dynamic shapes), require_dynamic_shapes, marks)
ZOO = {
    "mobilenet_v3_small": (lambda: MobileNetV3Small(10), image(64, 96), True, ()),
    "deit_tiny": (lambda: deit_tiny(64, 10), static_image(64), True, ()),
    "edsr": (EDSR, image(12, 24), True, ()),
    "wav2letter": (Wav2Letter, waveform(1600, 3200), True, ()),
    "resnet50": (lambda: ResNet50(10), image(64, 96), True, SLOW),
    # from 107 px: the last feature map is at least 2 x 2 (torch.export specializes a size of 1)
    "inception_v3": (lambda: InceptionV3(10), image(107, 139), True, SLOW),
    # the final upsample to the input's size: ExecuTorch 1.5.1 refuses a dynamic one under
    # require_dynamic_shapes (test_vision_ops.py's SmallCNN); pte-wgpu resizes it
    "deeplab_v3": (DeepLabV3, image(64, 96), False, SLOW),
    "vit_b16": (lambda: vit_b16(64, 10), static_image(64), True, SLOW),
    # static: with a dynamic sequence length, ExecuTorch 1.5.1's Vulkan preprocess fails in memory
    # planning ("graph_output_allocated not set") before anything reaches pte-wgpu
    "mobilebert": (MobileBert, tokens(16), True, SLOW),
}


def make(name):
    factory = ZOO[name][0]
    return lambda: randomize_batch_norms(factory())


def other_values(x):
    """An input of `x`'s shape and dtype with other values (token ids within x's range)."""
    if x.is_floating_point():
        return torch.randn_like(x)
    return torch.randint(int(x.min()), int(x.max()) + 1, x.shape, generator=torch.Generator().manual_seed(1))


def zoo_export(name):
    _, (sample, dynamic), require_dynamic, _ = ZOO[name]
    return export_pte(f"zoo_{name}", make(name), sample, dynamic_shapes=dynamic, require_dynamic_shapes=require_dynamic)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the kernels are the same on trio
@pytest.mark.parametrize("name", [pytest.param(n, marks=ZOO[n][3]) for n in ZOO])
async def test_zoo_model_matches_eager(name, load_pte):
    _, (sample, dynamic), _, _ = ZOO[name]
    pte, module = zoo_export(name)
    model = await load_pte(pte)
    calls = dynamic_shape_calls(sample, dynamic, n=3, seed=1) if dynamic else [sample, (other_values(sample[0]),)]
    await assert_matches_eager(model, module, calls, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("cin", [512, 1024, 2048])
async def test_wide_3x3_convolution(cin, load_pte):
    """One 3x3 convolution at 8 x 8 over `cin` input channels (DeepLab V3's ASPP has 2048): with
    its window's loops left in, lavapipe's loop limit cut the sums from 1024 channels on
    (kernels/vision/conv.py)."""
    pte, module = export_pte(f"zoo_conv3x3_{cin}", lambda: torch.nn.Conv2d(cin, 16, 3, padding=1), (torch.randn(1, cin, 8, 8),))
    await assert_matches_eager(await load_pte(pte), module, [(torch.randn(1, cin, 8, 8),)], atol=1e-4, rtol=1e-3)


def _int8_mobilenet_v2():
    torch.manual_seed(0)
    sample = (torch.randn(1, 3, 64, 64),)
    calibration = [(torch.randn(1, 3, 64, 64),) for _ in range(3)]
    mobilenet_v2 = lambda: randomize_batch_norms(MobileNetV2(10))  # noqa: E731
    return export_quantized("zoo_int8_mobilenet_v2", _xnnpack_static, sample, make_module=mobilenet_v2, calibration=calibration)


# tests/prebuild.py: the zoo models that run without PTE_WGPU_SLOW, and the int8 MobileNet V2
SLOW_ON = os.environ.get("PTE_WGPU_SLOW") == "1"
PREBUILD = [functools.partial(zoo_export, n) for n in ZOO if not ZOO[n][3] or SLOW_ON] + [_int8_mobilenet_v2]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_int8_mobilenet_v2_matches_the_eager_quantized_program(load_pte):
    """MobileNet V2 quantized by ExecuTorch's static int8 flow (XNNPACKQuantizer, per-channel
    weights, calibrated on four random images): every convolution lowers to a q8ta op, the ReLU6s
    run in float between a dequantize and a quantize. Static input: ExecuTorch resizes no q8ta
    convolution. ExecuTorch's serializer gives the graph's zero points of 6 the ReLU6s' 6.0.

    Tolerance: the logits (after the final dequantize) within 3 output quantization steps of the
    converted program in eager, 1.5 on average; not test_int8_conv.py's one step with 95% exact.
    Each int8 op is within one step, nearly always exact, but an output on the other side of a
    rounding boundary moves the sums after it, and this graph requantizes 99 times (52 q8ta
    convolutions, 10 q8ta adds, the linear, 36 quantizes). The first four feature layers still
    match eager 99.9% exactly; the 10 logits 40-60%, up to 2 steps apart, as eager's own logits
    move when noise of a 300th of the input's step is added to the input."""
    pte, graph = _int8_mobilenet_v2()
    ops = _delegate_ops(pte)
    assert {f"et_vk.q8ta_conv2d{kind}.default" for kind in ("", "_dw", "_pw")} | {"et_vk.q8ta_add.default"} <= ops
    (step,) = _output_steps(graph)
    model = await load_pte(pte)
    for x in (torch.randn(1, 3, 64, 64), torch.randn(1, 3, 64, 64) * 2):
        (got,) = await model.execute(x)
        with torch.no_grad():
            want = graph(x).numpy()
        steps = np.abs(got - want) / step
        assert steps.max() <= 3 * 1.001 and steps.mean() <= 1.5, steps
        assert np.abs(want).max() >= 30 * step  # the logits far from zero: 3 steps is a few percent


# -- examples/bench_vision.py: its export and run modes at tiny sizes ------------------------------

BENCH = Path(__file__).resolve().parents[1] / "examples" / "bench_vision.py"


def bench(*args):
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc.stdout


_STARTED = {}  # "export": the vision bench's Background export, once start_vision_export ran


def start_vision_export(tmp_path_factory):
    """Start the vision bench's export (MobileNet V2, two batches: most of the test's time) in a
    subprocess, niced; returns the Background run. tests/conftest.py calls this at the session's
    first test when ExecuTorch is here, so the export uses the CPU the files before it leave idle."""
    out = tmp_path_factory.mktemp("vision_bench")
    cmd = [sys.executable, str(BENCH), "export", "--short", "--models", "mobilenet_v2", "--out", str(out / "models")]
    _STARTED["export"] = Background(cmd, out, nice=10)
    return _STARTED["export"]


def test_vision_bench_exports_compressible_files_and_runs(tmp_path_factory):
    """MobileNet V2 at 32 px: both batches exported, the tiled weights compress (the bench's files
    must cross to the GPU machine), and the run's table and JSON are well formed, with pte-wgpu
    matching torch on the first output."""
    pytest.importorskip("executorch.backends.vulkan", reason="the export mode needs ExecuTorch")
    export = _STARTED.get("export") or start_vision_export(tmp_path_factory)  # started here without tests/conftest.py
    proc = export.result(timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    models = export.out / "models"
    manifest = json.loads((models / "manifest.json").read_text())
    assert [(e["model"], e["batch"]) for e in manifest["entries"]] == [("mobilenet_v2", 1), ("mobilenet_v2", 8)]
    raw = (models / "mobilenet_v2_b1.pte").read_bytes()
    assert len(lzma.compress(raw, preset=6)) < len(raw) / 8

    table = bench("run", str(models), "--short", "--json", str(export.out / "vision.json"))
    rows = json.loads((export.out / "vision.json").read_text())["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [("mobilenet_v2", 1), ("mobilenet_v2", 8)]
    for r in rows:
        assert r["matches"] and r["max_abs_err"] <= 1e-3, r
        assert r["max_abs_torch"] > 1e-2, r  # the tiled weights keep the logits far from zero
        assert r["wgpu_ms"] > 0 and r["torch_ms"] > 0
        assert r["wgpu_images_s"] == pytest.approx(r["batch"] * 1e3 / r["wgpu_ms"])
    header = next(line for line in table.splitlines() if line.startswith("| model"))
    columns = [c.strip() for c in header.split("|")[1:-1]]
    assert columns[:3] == ["model", "batch", "image"] and set(columns) <= set(rows[0]), columns  # the JSON's fields
    assert sum(line.startswith("| mobilenet_v2 |") for line in table.splitlines()) == 4  # streamed, then the table
