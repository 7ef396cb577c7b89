"""Test helpers: check that a `.pte` gives on WebGPU what its torch module gives in eager mode.

    from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

    calls = dynamic_shape_calls(sample, dynamic_shapes, n=8)   # live shapes, min and max included
    await assert_matches_eager("model.pte", module, calls)     # AssertionError naming call and output

torch is an export-time dependency: this module imports without it, and needs it only when a
torch module is given (or for `dynamic_shape_calls`, whose spec is made of `torch.export.Dim`s).

The testing room holds these helpers and the pytest plugin (`pytest_plugin`). It uses only the
public API (`import async_runtime as ar`) and `device`; the runtime never imports it.

Kept as one module past 400 lines: it is the public `async_runtime.testing` API, one import for users.
"""

import inspect
import random
from collections.abc import Mapping

import numpy as np

__all__ = ["assert_matches_eager", "dynamic_shape_calls", "export_pte"]


# --- assert_matches_eager -----------------------------------------------------------------------
async def assert_matches_eager(
    pte,
    module,
    sample_calls,
    *,
    atol=1e-4,
    rtol=1e-4,
    method="forward",
    seed=0,
    expected=None,
    **load_kwargs,
):
    """Run every call of `sample_calls` on the `.pte` and compare each output with eager.

    `pte` is a path, bytes or binary file (loaded here with `ar.load(pte, method, **load_kwargs)`
    and closed at the end), or an already loaded `Model` or `Session` (used as is, left open).
    `module` is the eager reference: a `torch.nn.Module` (or any callable taking torch tensors, such
    as `exported_program.module()`), run under `torch.no_grad()` on copies of the inputs. Instead,
    `module=None` with `expected=[outputs of call 0, outputs of call 1, ...]` compares with outputs
    computed beforehand (no torch needed).

    `sample_calls` is a sequence of input tuples (numpy arrays or CPU torch tensors), each at its
    own live shapes. They run in the order given, then in a shuffled order (`random.Random(seed)`),
    then the first call once more, so every change of shape in both directions is exercised and
    a stale resize shows up. An output matches when `|got - expected| <= atol + rtol * |expected|`
    element-wise, with the same shape; NaN matches NaN. Otherwise an AssertionError names the call
    (its index and input shapes), the output index and the worst element (got, expected, position).

    For stateless methods: a model with state tensors (a KV cache) gives order-dependent results,
    so compare those step by step instead. Returns the model's `Statistics` after the run."""
    calls = [_as_call(c) for c in sample_calls]
    if not calls:
        raise ValueError("sample_calls is empty")
    if module is None and expected is None:
        raise TypeError("give the eager module, or module=None and expected=[outputs of each call]")
    if expected is not None:
        expected = list(expected)
        if len(expected) != len(calls):
            raise ValueError(f"expected has {len(expected)} entries for {len(calls)} calls")

    order = list(range(len(calls)))
    shuffled = order[:]
    random.Random(seed).shuffle(shuffled)
    schedule = [(i, "in order") for i in order] + [(i, "shuffled") for i in shuffled] + [(0, "the first again")]

    eager_cache = {}

    def eager_outputs(i):
        if i not in eager_cache:
            eager_cache[i] = _outputs_of(expected[i]) if expected is not None else _run_eager(module, calls[i])
        return eager_cache[i]

    owned = None
    if hasattr(pte, "execute"):
        runner = pte
    else:
        import async_runtime as ar

        owned = runner = await ar.load(pte, method, **load_kwargs)
    try:
        for step, (i, phase) in enumerate(schedule):
            where = f"call {i} ({_describe(calls[i])}; step {step + 1} of {len(schedule)}, {phase})"
            try:
                got = await runner.execute(*calls[i])
            except Exception as e:
                if hasattr(e, "add_note"):
                    e.add_note(f"assert_matches_eager: raised by {where}")
                raise
            want = eager_outputs(i)
            if len(got) != len(want):
                raise AssertionError(f"{where}: the .pte returned {len(got)} outputs, eager {len(want)}")
            for j, (g, w) in enumerate(zip(got, want)):
                problem = _mismatch(np.asarray(g), w, atol, rtol)
                if problem:
                    raise AssertionError(f"{where}: output {j} {problem}")
        model = getattr(runner, "_model", runner)
        return model.statistics() if hasattr(model, "statistics") else None
    finally:
        if owned is not None:
            await owned.aclose()


def _as_call(c):
    if isinstance(c, (tuple, list)):
        return tuple(c)
    return (c,)  # a lone array is a one-input call


def _describe(call):
    parts = []
    for x in call:
        shape = getattr(x, "shape", None)
        dtype = getattr(x, "dtype", None)
        if shape is None:
            parts.append(repr(x))
        else:
            parts.append(f"{str(dtype).replace('torch.', '')}{list(shape)}")
    return "inputs " + ", ".join(parts) if parts else "no inputs"


def _run_eager(module, call):
    import torch

    args = [x.detach().clone() if isinstance(x, torch.Tensor) else _to_torch(x) for x in call]
    with torch.no_grad():
        out = module(*args)
    return _outputs_of(out)


def _to_torch(x):
    import torch

    if isinstance(x, np.ndarray) or np.isscalar(x):
        return torch.from_numpy(np.array(x, copy=True))
    return x


def _outputs_of(out):
    """The leaves of an eager output (tensor, tuple, list, dict, ModelOutput) as numpy arrays, in
    the order ExecuTorch flattens them; None leaves are dropped."""
    leaves = []

    def walk(o):
        if o is None:
            return
        if isinstance(o, (tuple, list)):
            for x in o:
                walk(x)
        elif isinstance(o, Mapping):
            for x in o.values():
                walk(x)
        else:
            leaves.append(_to_numpy(o))

    walk(out)
    return leaves


def _to_numpy(x):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu()
        if x.dtype.is_floating_point and x.element_size() == 2 and str(x.dtype) != "torch.float16":
            x = x.float()  # bfloat16: numpy has no such dtype
        return x.resolve_conj().numpy() if x.is_complex() else x.numpy()
    return np.asarray(x)


def _mismatch(got, want, atol, rtol):
    """None when `got` matches `want`, else what differs."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"has shape {list(got.shape)}, eager {list(want.shape)}"
    if got.size == 0:
        return None
    g = got.astype(np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else np.float64)
    w = want.astype(g.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - w)
        allowed = atol + rtol * np.abs(w)
        ok = diff <= allowed
        ok |= (g == w)  # equal infinities
        ok |= np.isnan(g) & np.isnan(w)
        if ok.all():
            return None
        excess = np.where(ok, -np.inf, np.nan_to_num(diff - allowed, nan=np.inf, posinf=np.inf))
    flat = int(np.argmax(excess))
    pos = tuple(int(p) for p in np.unravel_index(flat, got.shape))
    bad = int((~ok).sum())
    finite = diff[np.isfinite(diff)]
    worst_overall = f"; max |diff| {finite.max():.4g}" if finite.size else ""
    return (
        f"differs from eager in {bad} of {got.size} elements (atol={atol}, rtol={rtol}); "
        f"worst at {pos}: got {_fmt(got[pos])}, expected {_fmt(want[pos])} "
        f"(|diff| {_fmt(diff[pos])}, allowed {_fmt(allowed[pos])}){worst_overall}"
    )


def _fmt(v):
    v = v.item() if hasattr(v, "item") else v
    return f"{v:.6g}" if isinstance(v, float) else repr(v)


# --- dynamic_shape_calls ------------------------------------------------------------------------
def dynamic_shape_calls(sample, dynamic_shapes, n, seed=0, *, module=None):
    """`n` input tuples drawn around `sample` (the inputs at their maximum shapes) within the
    ranges of a `torch.export` `dynamic_shapes` spec.

    `dynamic_shapes` is what `torch.export.export` took: one entry per input (a tuple/list, or a
    dict keyed by the forward's argument names: in the signature's order when `module` is given,
    else in the dict's order), each None (static), a `{dim_index: Dim}` dict or a per-dim sequence.
    A `Dim("s", min=..., max=...)` gives live sizes in `max(min, 1)..max` (an unbounded max stops at
    the sample's size); the same Dim (by name) used by several inputs gets the same size in a call,
    and a derived dim (`2 * s`, `s + 1`) follows its root. `Dim.AUTO`/`Dim.DYNAMIC` hints become
    independent dims over `1..sample size`; `Dim.STATIC` keeps the sample's size.

    Call 0 has every dim at its minimum, call 1 at its maximum (with n == 1, the maximum only), the
    rest uniformly random. Values: standard normal for floating inputs, uniform integers within the
    sample's min..max for integer and bool inputs. Each input comes back as the sample's type
    (torch tensor or numpy array) and dtype. Deterministic for a given `seed`."""
    single = not isinstance(sample, (tuple, list))
    sample = (sample,) if single else tuple(sample)
    if single and not (
        isinstance(dynamic_shapes, (tuple, list))
        and len(dynamic_shapes) == 1
        and (dynamic_shapes[0] is None or isinstance(dynamic_shapes[0], (Mapping, tuple, list)))
    ) and not (isinstance(dynamic_shapes, Mapping) and not all(isinstance(k, int) for k in dynamic_shapes)):
        dynamic_shapes = (dynamic_shapes,)  # a lone tensor's own spec: {0: batch} or (batch, None)
    specs = _per_input_specs(dynamic_shapes, len(sample), module)
    rng = np.random.default_rng(seed)

    # Roots: name -> {"lo", "hi", "uses": [(fn, lo, hi)]}; each dynamic position -> (root, fn).
    roots, positions = {}, {}
    for k, (x, spec) in enumerate(zip(sample, specs)):
        shape = tuple(int(s) for s in x.shape)
        for d, dim in _dims_of(spec, len(shape), k):
            size = shape[d]
            kind = _dim_kind(dim)
            if kind == "static":
                continue
            if kind == "hint":
                name = f"<hint input {k} dim {d}>"
                roots[name] = {"lo": 1, "hi": size, "uses": []}
                positions[(k, d)] = (name, _identity)
                continue
            if kind == "derived":
                root, fn = dim.root, dim.fn
                lo, hi = _bounds(dim, size)
            else:
                root, fn = dim, _identity
                lo, hi = None, None
            name = root.__name__
            r = roots.setdefault(name, {"lo": max(1, int(root.min)), "hi": _finite(root.max), "sizes": [], "uses": []})
            r["sizes"].append(size)
            if lo is not None:
                r["uses"].append((fn, lo, hi))
            positions[(k, d)] = (name, fn)

    choices = {}
    for name, r in roots.items():
        hi = r["hi"] if r["hi"] is not None else max(r.get("sizes") or [1])
        values = [v for v in range(r["lo"], hi + 1) if all(lo <= fn(v) <= hi2 and fn(v) >= 1 for fn, lo, hi2 in r["uses"])]
        if not values:
            raise ValueError(f"dynamic dim {name}: no size in {r['lo']}..{hi} fits every use")
        choices[name] = values

    calls = []
    for c in range(n):
        if c == 0 and n > 1:
            pick = {name: v[0] for name, v in choices.items()}
        elif c <= 1:
            pick = {name: v[-1] for name, v in choices.items()}
        else:
            pick = {name: v[int(rng.integers(len(v)))] for name, v in choices.items()}
        call = []
        for k, x in enumerate(sample):
            shape = [int(s) for s in x.shape]
            for d in range(len(shape)):
                if (k, d) in positions:
                    name, fn = positions[(k, d)]
                    shape[d] = int(fn(pick[name]))
            call.append(_random_like(x, tuple(shape), rng))
        calls.append(call[0] if single else tuple(call))
    return calls


def _identity(v):
    return v


def _finite(v):
    if not isinstance(v, int):  # torch's int_oo (an unbounded Dim) is a sympy infinity
        try:
            v = int(v)
        except Exception:
            return None
    return v if v < 2**62 else None


def _bounds(dim, size):
    hi = _finite(dim.max)
    return max(1, int(dim.min)), hi if hi is not None else size


def _dim_kind(dim):
    if dim is None:
        return "static"
    if hasattr(dim, "root") and hasattr(dim, "fn"):
        return "derived"
    if hasattr(dim, "min") and hasattr(dim, "max") and hasattr(dim, "__name__"):
        return "dim"
    text = repr(dim).upper()
    if "STATIC" in text:
        return "static"
    if "AUTO" in text or "DYNAMIC" in text:
        return "hint"
    if isinstance(dim, int):
        return "static"
    raise TypeError(f"unsupported dynamic_shapes entry {dim!r}")


def _per_input_specs(dynamic_shapes, count, module):
    if dynamic_shapes is None:
        return [None] * count
    if isinstance(dynamic_shapes, Mapping):
        keys = list(dynamic_shapes)
        if module is not None:
            params = [p for p in inspect.signature(getattr(module, "forward", module)).parameters if p != "self"]
            missing = [k for k in keys if k not in params]
            if missing:
                raise ValueError(f"dynamic_shapes names {missing} are not arguments of the module ({params})")
            keys = [p for p in params if p in dynamic_shapes][:count]
        specs = [dynamic_shapes[k] for k in keys]
    else:
        specs = list(dynamic_shapes)
    if len(specs) != count:
        raise ValueError(f"dynamic_shapes has {len(specs)} entries for {count} inputs")
    return specs


def _dims_of(spec, rank, k):
    if spec is None:
        return []
    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, (tuple, list)):
        items = list(enumerate(spec))
    else:
        raise TypeError(f"dynamic_shapes entry of input {k}: expected None, a dict or a sequence, got {spec!r}")
    out = []
    for d, dim in items:
        d = int(d)
        if not -rank <= d < rank:
            raise ValueError(f"dynamic_shapes entry of input {k}: dim {d} out of range for rank {rank}")
        out.append((d % rank, dim))
    return out


def _random_like(x, shape, rng):
    is_torch = hasattr(x, "detach")
    if is_torch:
        import torch

        dtype = x.dtype
        ref = x.detach().cpu()
        if ref.dtype == torch.bfloat16:
            ref = ref.float()
        ref = ref.numpy()
    else:
        ref = np.asarray(x)
    if ref.dtype.kind == "f":
        arr = rng.standard_normal(shape).astype(ref.dtype)
    elif ref.dtype.kind == "c":
        arr = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(ref.dtype)
    elif ref.dtype.kind in "iub":
        lo, hi = (int(ref.min()), int(ref.max())) if ref.size else (0, 0)
        arr = rng.integers(lo, hi, size=shape, endpoint=True).astype(ref.dtype)
    else:
        raise TypeError(f"cannot draw random values of dtype {ref.dtype}")
    if is_torch:
        return torch.from_numpy(arr).to(dtype)
    return arr


# --- export_pte ---------------------------------------------------------------------------------
def export_pte(module, sample, dynamic_shapes=None, *, require_dynamic_shapes=None, force_fp16=False):
    """The bytes of a `.pte` for `module` lowered with ExecuTorch's VulkanPartitioner (needs the
    `export` extra: torch and executorch). `require_dynamic_shapes` (default: whether
    `dynamic_shapes` is given) is the partitioner's option: False also delegates the ops that
    ExecuTorch's Vulkan runtime cannot resize. `force_fp16` is the partitioner's option too: the
    delegate holds its float32 tensors and constants as float16, its inputs and outputs stay
    float32 (their staging dtype). A module cast with `.half()` gives float16 inputs and outputs."""
    import torch
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from ..vulkan_patterns import cache_vulkan_pattern_graphs

    cache_vulkan_pattern_graphs()
    sample = tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)
    ep = torch.export.export(module, sample, dynamic_shapes=dynamic_shapes)
    if require_dynamic_shapes is None:
        require_dynamic_shapes = dynamic_shapes is not None
    partitioner = VulkanPartitioner({"require_dynamic_shapes": require_dynamic_shapes, "force_fp16": force_fp16})
    return bytes(to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer)
