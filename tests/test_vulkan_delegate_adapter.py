"""ExecuTorch's own Vulkan delegate tests, run on this runtime.

`executorch/backends/vulkan/test/test_vulkan_delegate.py` (in the executorch wheel) defines each
test as a module, sample inputs, optional dynamic shapes and test inputs, handed to
`TestVulkanBackend.lower_module_and_test_output`. This adapter runs every upstream test method
with that helper patched: it lowers the module exactly as upstream does (their `lower_module`,
VulkanPartitioner), keeps the `.pte` and the eager outputs at the sample and every test input, and
then an async test loads each `.pte` with `ar.load` and compares every output with eager, with the
test's own tolerances (upstream compares with `torch.allclose`, NaNs equal).

One pytest test per upstream method (on asyncio and trio), so the pass count shows: tests/conftest.py
prints it in pytest's terminal summary. `OUT_OF_SCOPE` names the tests this runtime does not take, with why; they and the
tests upstream disables (`@disable_test`) are skipped with the reason. `RUNTIME_BUGS` are in-scope
tests that fail on a bug outside kernels/: strict xfails.

Exporting is the slow part: each test is lowered once per session for both backends, in worker
processes (one per core) that start with the session's first test (tests/conftest.py) at low
priority, so they use the CPU the other files leave idle. Run alone on two CPU cores the file
takes about 2.3 minutes (3.5 with one worker; 16.5 before
`async_runtime.vulkan_patterns.cache_vulkan_pattern_graphs`). With the exports kept, it runs in about 40 seconds on lavapipe.

With PTE_WGPU_EXPORT_DIR set, each test's programs and eager results are kept under
`<dir>/vulkan_delegate/<test>/` and a later run reuses them without ExecuTorch.
"""

import ast
import functools
import importlib.util
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

EXPORT_DIR = os.environ.get("PTE_WGPU_EXPORT_DIR")
UPSTREAM_MODULE = "executorch.backends.vulkan.test.test_vulkan_delegate"

# Upstream tests this runtime does not take, with the reason: none now. (avg_pool2d and max_pool2d
# feed shapes past the export's maximum in a dim not declared dynamic, [3, 14, 15, 9] for a sample
# of [5, 13, 55, 68]; inputs follow ExecuTorch's capacity rule, resize.engine.check_fits.)
OUT_OF_SCOPE = {}
# In scope, failing on a runtime bug outside kernels/: strict xfails, so a fix shows up.
RUNTIME_BUGS = {}


@dataclass
class Case:
    """One `lower_module_and_test_output` call: a program and its (inputs, eager outputs) calls."""

    pte: bytes
    calls: list  # [(inputs: [np.ndarray], expected: [np.ndarray])]
    atol: float
    rtol: float
    first_output_only: bool


@functools.cache
def _upstream():
    try:
        mod = __import__(UPSTREAM_MODULE, fromlist=["TestVulkanBackend"])
    except Exception:  # no ExecuTorch export stack here (a GPU machine that reuses exports)
        return None
    from async_runtime.vulkan_patterns import cache_vulkan_pattern_graphs

    cache_vulkan_pattern_graphs()
    return mod


def _upstream_tests():
    """{name: upstream's reason for disabling it, or None} for every upstream test method, read from
    the source without importing it (collection stays fast); without ExecuTorch, the tests kept in
    the export dir."""
    spec = importlib.util.find_spec("executorch")
    dirs = list(spec.submodule_search_locations or []) if spec else []
    source = Path(dirs[0], "backends/vulkan/test/test_vulkan_delegate.py") if dirs else None
    if source is None or not source.exists():
        root = Path(EXPORT_DIR or ".") / "vulkan_delegate"
        return {p.parent.name: None for p in sorted(root.glob("*/manifest.json"))}
    tree = ast.parse(source.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TestVulkanBackend"]
    out = {}
    for fn in sorted((n for n in cls.body if isinstance(n, ast.FunctionDef)), key=lambda n: n.name):
        if fn.name.startswith("test_"):
            reasons = [
                d.args[0].value
                for d in fn.decorator_list
                if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "disable_test"
            ]
            out[fn.name] = reasons[0] if reasons else None
    return out


def _numpy(xs):
    """Tensors flattened as upstream flattens method inputs, as numpy arrays."""
    import torch
    from executorch.extension.pytree import tree_flatten

    flat, _ = tree_flatten(xs)
    return [x.detach().numpy().copy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in flat]


def _record(cases):
    """A stand-in for `lower_module_and_test_output` that lowers as upstream does and records."""
    mod = _upstream()

    def lower_module_and_test_output(
        self,
        model,
        sample_inputs,
        atol=1e-03,
        rtol=1e-01,
        dynamic_shapes=None,
        test_inputs=None,
        first_output_only=False,
        expect_no_delegates=False,
    ):
        import torch

        model.eval()
        model(*sample_inputs)
        et_program = mod.lower_module(model, sample_inputs, dynamic_shapes=dynamic_shapes).to_executorch()
        if expect_no_delegates:
            self.check_no_delegation(et_program)
        else:
            self.check_vk_delegation(et_program)
        calls = []
        with torch.no_grad():
            for inputs in [sample_inputs, *(test_inputs or [])]:
                calls.append((_numpy(inputs), _numpy(model(*inputs))))
        cases.append(Case(bytes(et_program.buffer), calls, atol, rtol, first_output_only))

    return lower_module_and_test_output


_CASES = {}


def _store(name, cases):
    root = Path(EXPORT_DIR) / "vulkan_delegate" / name
    root.mkdir(parents=True, exist_ok=True)
    manifest = []
    for i, case in enumerate(cases):
        (root / f"{i}.pte").write_bytes(case.pte)
        arrays = {}
        for j, (inputs, expected) in enumerate(case.calls):
            arrays.update({f"c{j}_in{k}": a for k, a in enumerate(inputs)})
            arrays.update({f"c{j}_out{k}": a for k, a in enumerate(expected)})
        np.savez(root / f"{i}.npz", **arrays)
        counts = [(len(inp), len(exp)) for inp, exp in case.calls]
        manifest.append({"atol": case.atol, "rtol": case.rtol, "first_output_only": case.first_output_only, "counts": counts})
    (root / "manifest.json").write_text(json.dumps(manifest))


def _kept(name):
    """Test `name`'s directory in the export dir if it holds a whole export (the manifest is written
    last), else None."""
    root = Path(EXPORT_DIR, "vulkan_delegate", name) if EXPORT_DIR else None
    return root if root is not None and (root / "manifest.json").exists() else None


def _load_stored(name):
    root = _kept(name)
    if root is None:
        return None
    cases = []
    for i, m in enumerate(json.loads((root / "manifest.json").read_text())):
        with np.load(root / f"{i}.npz") as z:
            calls = [
                ([z[f"c{j}_in{k}"] for k in range(n_in)], [z[f"c{j}_out{k}"] for k in range(n_out)])
                for j, (n_in, n_out) in enumerate(m["counts"])
            ]
        cases.append(Case((root / f"{i}.pte").read_bytes(), calls, m["atol"], m["rtol"], m["first_output_only"]))
    return cases


def lower(name):
    """The cases upstream test `name` lowers, or None without ExecuTorch's test stack (runs in a
    worker process: see `lowerings`)."""
    mod = _upstream()
    if mod is None:
        return None
    import torch

    cases = []
    torch.manual_seed(0)
    with mock.patch.object(mod.TestVulkanBackend, "lower_module_and_test_output", _record(cases)):
        getattr(mod.TestVulkanBackend(name), name)()
    return cases


def _compare(got, want, case, where):
    pairs = list(zip(got, want))[:1] if case.first_output_only else list(zip(got, want))
    if not case.first_output_only:
        assert len(got) == len(want), f"{where}: {len(got)} outputs, eager has {len(want)}"
    for k, (g, w) in enumerate(pairs):
        g = np.asarray(g)
        assert g.shape == w.shape, f"{where}, output {k}: shape {g.shape}, eager {w.shape}"
        gf, wf = g.astype(np.float64), w.astype(np.float64)
        ok = np.isclose(gf, wf, atol=case.atol, rtol=case.rtol, equal_nan=True)
        if not ok.all():
            i = np.unravel_index(np.argmax(~ok), ok.shape)
            raise AssertionError(
                f"{where}, output {k}: {int((~ok).sum())} of {ok.size} elements differ; "
                f"at {tuple(int(x) for x in i)} got {gf[i]}, eager {wf[i]} (atol {case.atol}, rtol {case.rtol})"
            )


UPSTREAM_TESTS = _upstream_tests()


def _params():
    for name, disabled in UPSTREAM_TESTS.items():
        marks = []
        if disabled is not None:
            marks.append(pytest.mark.skip(reason=f"disabled upstream: {disabled}"))
        elif name in OUT_OF_SCOPE:
            marks.append(pytest.mark.skip(reason=f"out of scope: {OUT_OF_SCOPE[name]}"))
        elif name in RUNTIME_BUGS:
            marks.append(pytest.mark.xfail(reason=RUNTIME_BUGS[name], strict=True))
        yield pytest.param(name, marks=marks, id=name)


def _background():
    """A lowering worker runs niced (the tests come first), and its stdout and stderr (ExecuTorch's
    INFO logs and warnings) go nowhere, not into whichever test's output pytest is capturing; its
    errors come back through the future."""
    os.nice(10)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


_LOWERINGS = {}  # name -> future of `lower(name)`, from start_lowerings


def start_lowerings(session):
    """Submit every selected test with no stored export to worker processes (one per core, up to
    8); returns the pool for the session's end to shut down, or None. Called at the session's
    first test (tests/conftest.py). Spawned, not forked: this process already runs torch's and
    wgpu's threads."""
    selected = [
        item.callspec.params["name"]
        for item in session.items
        if getattr(item, "module", None) is sys.modules[__name__] and not item.get_closest_marker("skip")
    ]
    names = [n for n in dict.fromkeys(selected) if _kept(n) is None]
    if not names:
        return None
    workers = min(os.cpu_count() or 1, 8, len(names))
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_background)
    _LOWERINGS.update({name: pool.submit(lower, name) for name in names})
    return pool


@pytest.fixture
def cases(name):
    """The upstream test's programs and eager results: from the export dir, else from its worker
    (then kept in the export dir). A sync fixture: waiting blocks, outside the event loop."""
    if name not in _CASES:
        cases = _load_stored(name)
        if cases is None:
            lowering = _LOWERINGS.get(name)  # none without ExecuTorch (tests/conftest.py)
            cases = lowering.result() if lowering is not None else None
            if cases is None:
                pytest.skip("ExecuTorch's test module cannot be imported and no stored export exists")
            if EXPORT_DIR:
                _store(name, cases)
        _CASES[name] = cases
    return _CASES[name]


@pytest.mark.parametrize("name", list(_params()))
async def test_upstream(name, cases, load_pte):
    assert cases, f"{name} lowered nothing"
    for i, case in enumerate(cases):
        model = await load_pte(case.pte)
        for j, (inputs, expected) in enumerate(case.calls):
            got = await model.execute(*inputs)
            _compare(got, expected, case, f"{name}: program {i}, call {j} (input shapes {[list(a.shape) for a in inputs]})")


def summary_line(stats):
    """'N passed of M in scope (...)' from pytest's terminal stats, or None when no adapter test ran
    (tests/conftest.py prints it). An upstream test counts as passed when it passed on every anyio
    backend that ran it."""
    worst = ("error", "failed", "xpassed", "xfailed", "skipped", "passed")
    outcomes = {}
    for outcome in worst:
        for r in stats.get(outcome, []):
            nodeid = getattr(r, "nodeid", "")
            if "test_vulkan_delegate_adapter.py::test_upstream[" in nodeid:
                # None where ExecuTorch is missing: the empty parametrization's one skip, [asyncio-NOTSET]
                name = next((p for p in nodeid.split("[", 1)[1].rstrip("]").split("-") if p.startswith("test_")), None)
                if name is not None:
                    outcomes.setdefault(name, outcome)  # the worst outcome comes first
    if not outcomes:
        return None
    counts = {o: sum(1 for v in outcomes.values() if v == o) for o in worst}
    disabled = sum(1 for reason in UPSTREAM_TESTS.values() if reason is not None)
    in_scope = len(UPSTREAM_TESTS) - disabled - len(OUT_OF_SCOPE)
    return (
        f"ExecuTorch Vulkan delegate tests: {counts['passed']} passed of {in_scope} in scope "
        f"({len(UPSTREAM_TESTS)} upstream: {len(OUT_OF_SCOPE)} out of scope, {disabled} disabled upstream, "
        f"{counts['xfailed']} xfail on runtime bugs, {counts['failed'] + counts['error'] + counts['xpassed']} failed; "
        f"{len(outcomes)} ran)"
    )
