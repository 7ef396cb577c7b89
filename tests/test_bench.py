"""`python -m async_runtime bench --short` on a tiny Llama: it runs, and what it writes is well formed.

No timing is asserted (lavapipe timings mean nothing): only structure, counters that do not depend
on speed (resize events, submits per execute), and the trace format. The model is the bench's own
default export (ExecuTorch's export_llm, Vulkan, dynamic; ~1.5 min on 2 cores), kept under
$PTE_WGPU_EXPORT_DIR/bench when that is set, so a machine without ExecuTorch reuses it. Only the
Vulkan export is made here (the static and XNNPACK twins cost two more exports): their rows must
then read n/a. The streaming-kernel scenario's kernels are also run directly and checked against
numpy.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest

from async_runtime.tools.bench import streaming as bench_streaming
from async_runtime.tools.bench.models import FILES, SHORT, llama_tag
from async_runtime.tools.bench.report import SPLIT_PARTS, markdown
from async_runtime.device import open_device

from .background import Background

pytestmark = pytest.mark.usefixtures("adapter")
ROOT = Path(__file__).resolve().parents[1]


_STARTED = {}  # "run": the bench's Background run, once start_bench ran


def start_bench(tmp_path_factory):
    """Start the bench in a subprocess, unless its export is neither cached nor makeable here;
    returns the Background run or None. tests/conftest.py calls this at the session's first test,
    so the export and the run overlap the files before this one."""
    out = tmp_path_factory.mktemp("bench")
    cache = Path(os.environ["PTE_WGPU_EXPORT_DIR"]) / "bench" if os.environ.get("PTE_WGPU_EXPORT_DIR") else out / "cache"
    if not (cache / f"llama_{llama_tag(SHORT['llama'])}" / FILES["vulkan"]).exists() and importlib.util.find_spec("executorch") is None:
        return None
    cmd = [
        sys.executable, "-m", "async_runtime", "bench", "--short", "--exports", "vulkan", "--cache-dir", str(cache),
        "--json", str(out / "bench.json"), "--markdown", str(out / "bench.md"), "--trace", str(out / "trace.json"),
        "--plots", str(out / "plots"),
    ]
    _STARTED["run"] = Background(cmd, out, cwd=ROOT)
    return _STARTED["run"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    run = _STARTED.get("run") or start_bench(tmp_path_factory)  # started here without tests/conftest.py
    if run is None:
        pytest.importorskip("executorch", reason="the bench's tiny Llama must be exported (or cached in $PTE_WGPU_EXPORT_DIR/bench)")
    proc = run.result(timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return run.out, proc


def _number_or_none(x):
    return x is None or isinstance(x, (int, float)) and x >= 0


def test_json_is_well_formed(bench_run):
    out, _ = bench_run
    s = json.loads((out / "bench.json").read_text())
    meta = s["meta"]
    assert meta["short"] is True and meta["runs"] == 1
    assert meta["prompts"] == sorted(meta["prompts"]) and max(meta["prompts"]) <= s["meta"]["model"]["max_prompt"]
    assert set(s["decode_tokens_per_s"]) >= {"wgpu", "torch eager (cpu)", "executorch xnnpack"}
    assert s["decode_tokens_per_s"]["wgpu"] > 0
    for name, v in s["decode_tokens_per_s"].items():
        assert _number_or_none(v), name
        assert set(s["prefill_tokens_per_s"][name]) == {str(p) for p in meta["prompts"]}
        assert all(_number_or_none(x) for x in s["prefill_tokens_per_s"][name].values())
    # only the Vulkan export was made: the XNNPACK twin and the static export are n/a, with a reason
    if s["models"]["xnnpack"] is None:
        assert s["decode_tokens_per_s"]["executorch xnnpack"] is None
        assert "executorch xnnpack" in s["baseline_errors"]
    resize = s["resize"]
    assert resize["dynamic, fixed [1, 1]"]["resize_events_per_execute"] == 0
    assert resize["dynamic, cycling 1..4"]["resize_events_per_execute"] == 1
    assert resize["dynamic, cycling 1..4"]["hook_calls_per_execute"] > resize["dynamic, fixed [1, 1]"]["hook_calls_per_execute"]
    if s["models"]["static"] is None:
        assert resize["static [1, 1]"] is None
    for label, row in s["cpu_split_ms"].items():
        assert set(row) == set(SPLIT_PARTS) | {"other", "execute"}, label
        assert all(isinstance(v, float) for v in row.values())
    conc = s["concurrency_tokens_per_s"]
    assert set(conc) == {"batched", "unbatched"}
    for mode, rows in conc.items():
        assert [int(n) for n in rows] == list(SHORT["sessions"])
        assert all(_number_or_none(r["tokens_per_s"]) for r in rows.values())
    assert all(r["submits_per_execute"] == 1 for r in conc["unbatched"].values())
    assert all(0 < r["submits_per_execute"] <= 1 for r in conc["batched"].values())


def test_markdown_has_every_table(bench_run):
    out, proc = bench_run
    md = (out / "bench.md").read_text()
    assert md in proc.stdout
    titles = ("## Tokens/s", "## Resize overhead", "## CPU time per execute", "## Concurrency", "## GPU profile", "## Streaming kernels")
    for title in titles:
        assert title in md
    assert "| decode (" in md and "| prefill " in md and "n/a" in md


def test_trace_and_op_table(bench_run):
    out, _ = bench_run
    s = json.loads((out / "bench.json").read_text())
    trace = json.loads((out / "trace.json").read_text())
    assert isinstance(trace["traceEvents"], list)
    prof = s["profile"]
    if not prof["supported"]:  # no timestamp-query: profiling degrades to a note and an empty trace
        assert trace["traceEvents"] == [] and "timestamp-query" in prof["note"]
        return
    assert prof["units"] in ("ns", "ticks")
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans and all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in spans)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert {e["name"] for e in spans if e["cat"] == "step"} >= {"decode"}
    for phase in ("prefill", "decode"):
        rows = prof["ops"][phase]
        assert rows and all(r["count"] > 0 for r in rows)
        assert abs(sum(r["share"] for r in rows) - 1) < 1e-6
        linear = next(r for r in rows if "linear" in r["op"])
        assert linear["bytes"] > 0 and linear["gb_per_s"] > 0  # weights and activations, per op family
    ops = {r["op"] for r in prof["ops"]["decode"]}
    assert any("linear" in op for op in ops) and any("sdpa" in op for op in ops)


def test_markdown_without_timestamps(bench_run):
    """An adapter without timestamp-query: the profile section says so instead of a table."""
    out, _ = bench_run
    s = json.loads((out / "bench.json").read_text())
    s["profile"] = {"supported": False, "units": "ns", "note": "the adapter has no timestamp-query: no GPU profile"}
    assert "no timestamp-query" in markdown(s)


def test_normalization_after_an_adapter_exists_falls_back_to_ticks(adapter):
    """wgpu-native's instance takes the flag only before it exists; Dawn resolves nanoseconds itself."""
    import async_runtime.backend as backend
    from async_runtime.tools.profile import enable_timestamp_normalization

    assert enable_timestamp_normalization() == ("ns" if backend.NAME == "dawn" else "ticks")  # the adapter fixture created the instance


def test_concurrency_plot_is_a_png(bench_run):
    pytest.importorskip("matplotlib")
    out, _ = bench_run
    png = (out / "plots" / "concurrency.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_streaming_section_is_well_formed(bench_run):
    """Every kernel has a row with bytes, both timings, GB/s and a share of the copy bandwidth (no
    thresholds: lavapipe's numbers mean nothing), and its sampled outputs matched numpy."""
    out, _ = bench_run
    s = json.loads((out / "bench.json").read_text())["streaming"]
    p = bench_streaming.SHORT
    assert list(s["kernels"]) == [k.label for k in bench_streaming.kernels(p, s["limit_bytes"])]
    assert s["runs"] == 1 and s["reps"] == p["reps"] and s["copy_gb_per_s"] > 0
    assert s["timing"].startswith(("GPU timestamps", "wall clock"))
    rtols = {k.label: k.rtol for k in bench_streaming.kernels(p, s["limit_bytes"])}
    for label, r in s["kernels"].items():
        assert "error" not in r, (label, r["error"])
        size = 2 if label.endswith(" f16") else 4  # f16 or f32 tensors, each once
        assert r["bytes"] == sum(size * int(np.prod(shape)) for shape in r["shapes"]) > 0, label
        assert r["gb_per_s"] > 0 and r["us_per_dispatch"] > 0 and len(r["seconds"]) == 1, label
        assert r["us_wall"] > 0 and (r["us_timestamps"] is None or r["us_timestamps"] > 0), label
        if r["timed_by"] == "timestamps":  # used only when wall clock agrees
            assert abs(r["us_timestamps"] - r["us_wall"]) <= bench_streaming.AGREE * r["us_wall"], label
            assert r["us_per_dispatch"] == r["us_timestamps"], label
        else:
            assert r["timed_by"] == "wall clock" and r["us_per_dispatch"] == r["us_wall"], label
        assert isinstance(r["share_of_copy"], float) and r["share_of_copy"] > 0, label
        assert r["dispatches_per_run"] >= max(p["reps"], r["copies"], p["span_bytes"] / r["bytes"]), label
        assert r["max_rel_err"] < rtols[label], label
    # the denominator is the faster copy, and says which
    assert s["copy_reference"] in bench_streaming.COPIES
    assert s["kernels"][s["copy_reference"]]["share_of_copy"] == 1.0
    assert max(s["kernels"][c]["share_of_copy"] for c in bench_streaming.COPIES) == 1.0
    assert any(r["copies"] > 1 for r in s["kernels"].values())  # small GEMVs cycle through weight copies
    md = (out / "bench.md").read_text()
    assert all(f"| {label} |" in md for label in s["kernels"])
    assert f"from {s['copy_reference']}" in md


@pytest.mark.parametrize("limit", [2_147_483_644, 128 << 20])  # the H100's and lavapipe's binding limits
def test_streaming_grids_reach_every_element(limit, monkeypatch):
    """At full size (1 GiB tensors: 1M-4M workgroups of 64, folded into x and y) every kernel of the
    registry reaches all of its output, within 65,535 workgroups a
    dimension; a grid that stops short is refused."""
    full = bench_streaming.kernels(bench_streaming.FULL, limit)
    for kernel in full:
        _, _, active = bench_streaming.plan(kernel)  # raises on a short or oversized grid
        grids = [g for d, g in active if d.shader is not None]
        if kernel.per_invocation and kernel.wgsl is None and limit > 1 << 30:
            assert grids[0][1] > 1, kernel.label  # the fold is exercised
    from pte_wgpu.kernels import wgsl

    monkeypatch.setattr(wgsl, "fold_grid", lambda w: (min(w, 65535), 1, 1))  # a fold that truncates
    with pytest.raises(ValueError, match="reaches fewer"):
        bench_streaming.plan(next(k for k in full if k.label == "aten.add.Tensor"))


async def test_streamed_kernels_compute_what_numpy_does(adapter):
    """The scenario's kernels, on the data they stream: untouched outputs fail the sampled check
    (so it would catch a kernel that does nothing), a dispatch one workgroup short fails it (so it
    would catch a partial dispatch), and one dispatch per buffer copy passes it."""
    _, device, info = await open_device()
    p = bench_streaming.SHORT
    for kernel in bench_streaming.kernels(p, min(info.max_storage_binding, info.max_buffer_size)):
        op = await anyio.to_thread.run_sync(bench_streaming.OneOp, device, kernel, p["footprint"])
        try:
            assert await op.max_rel_err() == 1.0, kernel.label
            if op.copies > 1:  # a dispatch missing from one copy is caught too
                await anyio.to_thread.run_sync(_run, device, op, op.copies - 1)
                assert await op.max_rel_err() == 1.0, kernel.label
            if kernel.per_invocation:  # the last workgroup left out: the last elements stay zero
                full, op.commands = op.commands, [
                    [(r[0], [(pl, g, (x - 1, y, z) if x > 1 else (x, y - 1, z)) for pl, g, (x, y, z) in r[1]]) for r in runs]
                    for runs in op.commands
                ]
                await anyio.to_thread.run_sync(_run, device, op, op.copies)
                op.commands = full
                assert await op.max_rel_err() > 0.05, kernel.label
            await anyio.to_thread.run_sync(_run, device, op, op.copies)
            assert await op.max_rel_err() < kernel.rtol, kernel.label
        finally:
            op.release()


def _run(device, op, reps):
    encoder = device.create_command_encoder()
    op.encode(encoder, reps)
    device.queue.submit([encoder.finish()])


def test_peer_kit_outputs_become_rows(tmp_path):
    """The peer kits' outputs (llama-bench's JSON, llama-batched-bench's JSONL, bench_ort.py's
    JSON) become the rows bench_llm.py reports for us."""
    from async_runtime.tools.bench import peers

    runs = [dict(n_prompt=512, n_gen=0, avg_ts=50000.0, flash_attn=True), dict(n_prompt=512, n_gen=0, avg_ts=1.0, flash_attn=False),
            dict(n_prompt=0, n_gen=128, avg_ts=590.0, flash_attn=True), dict(n_prompt=2048, n_gen=0, avg_ts=45000.0, flash_attn=True)]
    (tmp_path / "llamacpp_f32.json").write_text(json.dumps(runs))
    (tmp_path / "llamacpp_batched_f32_faon.jsonl").write_text(
        "\n".join(json.dumps(dict(pl=pl, speed_tg=s)) for pl, s in ((1, 500.0), (16, 3199.0), (32, 5992.0))))
    assert peers.llamacpp_rows(tmp_path) == {"f32": {"prefill_512": 50000.0, "decode_1": 590.0, "prefill_2048": 45000.0,
                                                     "decode_16": 3199.0, "decode_32": 5992.0}}
    ort = {"engines": {"genai": {"decode_b1": {"tok_s": 119.0}, "prefill": {"512": {"tok_s": 27100.0}},
                                 "decode_b16": {"agg_tok_s": 1330.0}}, "ort": {"error": "no adapter"}}}
    (tmp_path / "ort_webgpu_int4.json").write_text(json.dumps(ort))
    assert peers.ort_rows(tmp_path) == {"int4 (genai)": {"decode_1": 119.0, "prefill_512": 27100.0, "decode_16": 1330.0}}
    table = peers.markdown({"decode_1": 300.0}, {"llamacpp": {"rows": peers.llamacpp_rows(tmp_path)}})
    assert "| decode_1 | 300 | 590 |" in table and "| decode_32 | — | 5,992 |" in table
