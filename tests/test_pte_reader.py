"""The `.pte` and VkGraph readers on real exports, truncated and corrupted."""

import random

import numpy as np
import pytest
import torch

from async_runtime import ModelFormatError, UnsupportedOperatorError
from async_runtime.tools.cli import inspect
from async_runtime.program.graph import link
from async_runtime.program.pte import DelegateCall, KernelCall, read_program
from async_runtime.program.vkgraph import read_vkgraph
from pte_wgpu.resize.values import SymInt, Tensor

from .exporting import export_pte
from .models import MLP, Block


def mlp():
    return export_pte("mlp", MLP, [torch.randn(5, 13)])[0]


def block_dynamic():
    s = torch.export.Dim("S", min=1, max=11)
    return export_pte("block_dyn", Block, [torch.randn(1, 11, 15)], dynamic_shapes=({1: s},))[0]


def parse_all(data):
    program = read_program(data)
    for method in program.methods.values():
        link(method, check=False)


def test_reads_a_static_mlp():
    program = read_program(mlp())
    m = program.method("forward")
    assert [type(i) for i in m.instructions] == [DelegateCall]
    graph = read_vkgraph(m.delegates[0].blob)
    assert [c.name for c in graph.chain] == ["aten.linear.default", "aten.relu.default", "aten.linear.default"]
    weights = [v for v in graph.values if isinstance(v, Tensor) and v.constant is not None]
    assert sorted(w.dims for w in weights) == [(7,), (7, 29), (29,), (29, 13)]
    # weights live in the named data, keyed by SHA-256
    for w in weights:
        raw = np.frombuffer(program.named_data[w.constant.key], np.float32)
        assert raw.size == np.prod(w.dims)


def test_links_delegates_around_non_delegated_ops():
    program = read_program(block_dynamic())
    m = program.method("forward")
    kinds = [type(i).__name__ for i in m.instructions]
    assert kinds.count("DelegateCall") == 3 and kinds.count("KernelCall") == 4
    assert {i.op for i in m.instructions if isinstance(i, KernelCall)} == {"aten::expand_copy.out"}
    graph = link(m)
    # the sequence length crosses delegates as a SymInt
    assert any(isinstance(graph.values[a], SymInt) for name, args in graph.calls for a in args)
    assert graph.values[graph.inputs[0]].dims == (1, 11, 15)


def test_missing_method_is_named():
    with pytest.raises(ModelFormatError, match="no method 'decode'"):
        read_program(mlp()).method("decode")


def test_every_truncation_is_a_format_error():
    data = mlp()
    cuts = sorted(set(range(0, 64)) | set(range(0, len(data), max(1, len(data) // 300))))
    for cut in cuts:
        with pytest.raises(ModelFormatError):
            parse_all(data[:cut])


def test_corruptions_never_crash():
    """Random byte flips give a ModelFormatError, an UnsupportedOperatorError, or a file that still parses."""
    data = block_dynamic()
    rng = random.Random(1234)
    for _ in range(400):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            parse_all(bytes(mutated))
        except (ModelFormatError, UnsupportedOperatorError):
            pass


def test_inspect_lists_ops_and_shapes():
    import io

    out = io.StringIO()
    inspect(block_dynamic(), out)
    text = out.getvalue()
    assert "input 0: float32[1, <=11, 15] (dynamic)" in text
    assert "aten::expand_copy.out" in text and "aten.bmm.default" in text


def test_inspect_shows_dtypes_and_how_float16_is_stored(monkeypatch):
    import io

    from pte_wgpu.kernels import OPS

    data = export_pte("mlp_half", lambda: MLP().half(), [torch.randn(5, 13).half()])[0]
    out = io.StringIO()
    inspect(data, out)
    text = out.getvalue()
    assert "input 0: float16[5, 13]" in text
    assert "float16" in next(line for line in text.splitlines() if line.startswith("  dtypes: "))
    for fn in {OPS[name] for name in OPS}:  # every op with an f16 kernel: stored as f16
        monkeypatch.setattr(fn, "half", True)
    out = io.StringIO()
    inspect(data, out)
    assert "float16 storage: f16 on adapters with shader-f16" in out.getvalue()
    monkeypatch.setattr(OPS["aten.linear.default"], "half", False)
    out = io.StringIO()
    inspect(data, out)
    assert "float16 storage: f32 (widened: no f16 kernel for aten.linear.default)" in out.getvalue()
