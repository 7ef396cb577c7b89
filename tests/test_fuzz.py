"""Fuzzing the loader with mutations of real exports: only ModelFormatError or
UnsupportedOperatorError may come out, in bounded time and memory.

The mutations are aimed by walking the files: every checked read of the `.pte` and VkGraph
readers is recorded (root offsets, vtables, tables, vectors, strings, the `eh00` header,
segments), and the cases truncate at those boundaries, flip bits in them, overwrite offsets and
lengths with hostile values, give tensors huge dims and value lists ids that are out of range
or point at the list itself.

Each case runs `read_program` + `link`; a case that gets through them runs the real
`Model._build` up to the point where it would open the device (the op build and the plan at
maximum shapes, no GPU), and a sample of those runs the full `ar.load` on the adapter.

Seeded (hypothesis `derandomize`); `PTE_WGPU_FUZZ_CASES` (default 10,000) is the total number of
cases, truncations included. Memory: the address space is capped at +4 GiB during the cases and
every 16th case is traced with tracemalloc; time: every case is timed, and a case that hangs
for 60 s dumps the stacks and ends the run (faulthandler).
"""

import contextlib
import faulthandler
import os
import resource
import struct
import time
import tracemalloc

import anyio
import numpy as np
import pytest
import torch
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import async_runtime as ar
import async_runtime.model as model_module
from async_runtime import ModelFormatError, UnsupportedOperatorError
from async_runtime.program import flatbuf
from async_runtime.program.graph import link
from async_runtime.program.pte import read_program

from .exporting import export_pte
from .models import MLP, Block

CASES = int(os.environ.get("PTE_WGPU_FUZZ_CASES", "10000"))
ALLOWED = (ModelFormatError, UnsupportedOperatorError)
CASE_SECONDS = 2.0  # the slowest case must stay under this (a real parse takes milliseconds)
HANG_SECONDS = 60  # a case this slow dumps every stack and ends the run
TRACE_EVERY = 16
TRACE_LIMIT = 64 << 20  # bytes a traced case may allocate at its peak
EXTRA_ADDRESS_SPACE = 4 << 30

# Shares of CASES per family, after the deterministic truncations.
SHARES = {"bitflip": 0.35, "overwrite": 0.30, "ids": 0.15, "dims": 0.12, "identifier": 0.08}


# -- the corpus: real exports and the structure of their bytes ------------------------------------


def _sources():
    s = torch.export.Dim("S", min=1, max=11)
    return {
        "mlp": export_pte("mlp", MLP, [torch.randn(5, 13)])[0],
        "block_dyn": export_pte("block_dyn", Block, [torch.randn(1, 11, 15)], dynamic_shapes=({1: s},))[0],
    }


class Layout:
    """Where things are in one file: every checked read and every vector, at absolute offsets."""

    def __init__(self, name, data):
        self.name, self.data = name, bytes(data)
        self.regions, self.vectors = _record(self.data)
        # The end of the last segment: a cut before it must be refused.
        program_size, segment_base = len(self.data), len(self.data)
        if self.data[8:12] == b"eh00":
            program_size, segment_base = struct.unpack_from("<QQ", self.data, 16)
        root = flatbuf.Buffer(self.data[:program_size], "program").root()
        self.content_end = max(
            [program_size] + [segment_base + s.scalar(0, "u64") + s.scalar(1, "u64") for s in root.tables(4, "segments")]
        )
        program = read_program(self.data)
        self.identifiers = [(4, b"ET12")]
        if self.data[8:12] == b"eh00":
            self.identifiers.append((8, b"eh00"))
        for m in program.methods.values():
            for d in m.delegates:
                at = _address(d.blob) - _address(self.data)
                self.identifiers.append((at + 4, b"VH00"))
                fb_off = struct.unpack_from("<I", self.data, at + 10)[0]
                self.identifiers.append((at + fb_off + 4, b"VK00"))
        boundaries = {0, len(self.data), program_size, self.content_end}
        for pos, size, _ in self.regions:
            boundaries.update((pos, pos + size))
        for start, n, elem, _ in self.vectors:
            boundaries.update((start - 4, start, start + n * elem))
        for at, _ in self.identifiers:
            boundaries.update((at, at + 4))
        boundaries.update(range(0, 40))  # the root offset, identifier and the eh00 header
        self.cuts = sorted({c + d for c in boundaries for d in (-1, 0, 1) if 0 <= c + d < len(self.data)})
        self.id_vectors = [v for v in self.vectors if _is_id_vector(v[3])]
        self.dims_vectors = [v for v in self.vectors if v[3].endswith(" dims") or v[3].endswith(" sizes")]
        self.fields = sorted({(pos, size) for pos, size, _ in self.regions if size in (1, 2, 4, 8)})


def _address(buf):
    return np.frombuffer(buf, np.uint8).ctypes.data if len(buf) else 0


def _record(data):
    """Parse and link `data`, recording every bounds-checked read and every vector."""
    base = _address(data)
    regions, vectors = [], []
    check, vector = flatbuf.Buffer.check, flatbuf.Table._vector

    def recording_check(self, pos, size, what):
        regions.append((_address(self.data) - base + pos, size, f"{self.what}: {what}"))
        return check(self, pos, size, what)

    def recording_vector(self, slot, elem_size, what):
        start, n = vector(self, slot, elem_size, what)
        if start is not None:
            vectors.append((_address(self.buf.data) - base + start, n, elem_size, f"{self.buf.what}: {what}"))
        return start, n

    flatbuf.Buffer.check, flatbuf.Table._vector = recording_check, recording_vector
    try:
        parse(data)
    finally:
        flatbuf.Buffer.check, flatbuf.Table._vector = check, vector
    return regions, sorted(set(vectors))


def _is_id_vector(label):
    return any(k in label for k in ("args", "input", "output", "value list", "int list", "tensor list"))


_LAYOUTS = {}


def layouts():
    if not _LAYOUTS:
        for name, data in _sources().items():
            _LAYOUTS[name] = Layout(name, data)
    return _LAYOUTS


# -- running one case ------------------------------------------------------------------------------


def parse(data):
    program = read_program(data)
    return [link(m, check=False) for m in program.methods.values()], program


class _NoDevice(Exception):
    """Raised where `Model._build` would open the device: everything before it ran."""


async def _build_without_device(data):
    async def no_device(*args, **kwargs):
        raise _NoDevice

    model = ar.Model()
    saved = model_module.open_device
    model_module.open_device = no_device
    try:
        await model._build(data, "forward", None)
    except _NoDevice:
        return model
    finally:
        model_module.open_device = saved
    raise AssertionError("_build got past open_device")


class Runner:
    """Runs cases; counts outcomes, times them and traces every TRACE_EVERY-th one."""

    def __init__(self, portal):
        self.portal = portal
        self.outcomes = {}
        self.slowest = (0.0, None)
        self.peak = (0, None)
        self.planned = []  # mutated files that got through the GPU-free build
        self.n = 0

    def run(self, data, label):
        self.n += 1
        traced = self.n % TRACE_EVERY == 0
        if traced:
            tracemalloc.start()
        t0 = time.perf_counter()
        try:
            outcome = self._run(data)
        except ALLOWED as e:
            outcome = type(e).__name__
        except BaseException as e:
            raise AssertionError(f"{label}: {type(e).__name__}: {e}") from e
        finally:
            elapsed = time.perf_counter() - t0
            if traced:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                if peak > self.peak[0]:
                    self.peak = (peak, label)
        if elapsed > self.slowest[0]:
            self.slowest = (elapsed, label)
        assert elapsed < CASE_SECONDS, f"{label}: took {elapsed:.2f} s"
        if traced:
            assert self.peak[0] < TRACE_LIMIT, f"{self.peak[1]}: allocated {self.peak[0]} bytes at its peak"
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return outcome

    def _run(self, data):
        parse(data)  # refused here, the real load refuses identically: its first steps are these
        self.portal.call(_build_without_device, data)
        if len(self.planned) < 64:
            self.planned.append(data)
        return "built"


@contextlib.contextmanager
def bounded():
    """A cap on the address space (huge allocations fail fast) and a hang watchdog."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    cap = vm + EXTRA_ADDRESS_SPACE
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module")
def runner():
    layouts()  # export (and walk) before the address space is capped
    with start_blocking_portal() as portal:
        r = Runner(portal)
        yield r
        summary = ", ".join(f"{k}: {v}" for k, v in sorted(r.outcomes.items()))
        print(
            f"\nfuzz: {r.n} cases ({summary}); slowest {r.slowest[0] * 1e3:.1f} ms ({r.slowest[1]}); "
            f"peak traced {r.peak[0] / 2**20:.1f} MiB ({r.peak[1]})"
        )


def _examples(family):
    truncations = sum(len(lay.cuts) for lay in layouts().values())
    return max(50, int((CASES - truncations) * SHARES[family]))


def _settings(family):
    return settings(
        max_examples=_examples(family),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


def _pick_layout(draw):
    return layouts()[draw(st.sampled_from(sorted(layouts())))]


def _put(data, pos, fmt, value):
    size = struct.calcsize(fmt)
    if 0 <= pos and pos + size <= len(data):
        struct.pack_into(fmt, data, pos, value)


# -- the families ----------------------------------------------------------------------------------


def test_the_corpus_parses_and_has_structure():
    for lay in layouts().values():
        parse(lay.data)
        assert len(lay.regions) > 100 and lay.id_vectors and lay.dims_vectors
        assert len(lay.identifiers) >= 3  # ET12, and VH00 and VK00 per delegate
    block = layouts()["block_dyn"]
    assert sum(1 for *_, label in block.vectors if "VkGraph: chain" in label) == 3  # three delegates


def test_truncation_at_every_structural_boundary(runner):
    """Cut before the end of the last segment: refused. Cut in trailing padding: still loads."""
    total = 0
    with bounded():
        for lay in layouts().values():
            for cut in lay.cuts:
                outcome = runner.run(lay.data[:cut], f"{lay.name} cut at {cut}")
                total += 1
                if cut < lay.content_end:
                    assert outcome in ("ModelFormatError",), f"{lay.name} cut at {cut}: {outcome}"
    assert total > 1000


@_settings("bitflip")
@given(st.data())
def test_bit_flips(runner, data):
    lay = _pick_layout(data.draw)
    buf = bytearray(lay.data)
    flips = []
    for _ in range(data.draw(st.integers(1, 8))):
        if data.draw(st.booleans()) or not lay.regions:
            pos = data.draw(st.integers(0, len(buf) - 1))
        else:
            at, size, _ = data.draw(st.sampled_from(lay.regions))
            pos = at + data.draw(st.integers(0, max(size, 1) - 1))
        bit = data.draw(st.integers(0, 7))
        buf[pos] ^= 1 << bit
        flips.append((pos, bit))
    with bounded():
        runner.run(bytes(buf), f"{lay.name} bit flips {flips}")


HOSTILE_U32 = [0, 1, 3, 4, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, 0x10000, 1 << 30]


@_settings("overwrite")
@given(st.data())
def test_offsets_and_lengths_pointing_anywhere(runner, data):
    """Any checked field (offsets, vtable entries, lengths, counts, scalars) gets a hostile value:
    outside the buffer, huge, pointing at itself, off by one, or random."""
    lay = _pick_layout(data.draw)
    buf = bytearray(lay.data)
    pos, size = data.draw(st.sampled_from(lay.fields))
    old = int.from_bytes(buf[pos : pos + size], "little")
    bits = 8 * size
    value = data.draw(
        st.one_of(
            st.sampled_from([v & ((1 << bits) - 1) for v in HOSTILE_U32]),
            st.sampled_from([(old + d) & ((1 << bits) - 1) for d in (-4, -1, 1, 4, len(buf), -pos)]),
            st.integers(0, (1 << bits) - 1),
        )
    )
    buf[pos : pos + size] = value.to_bytes(size, "little")
    with bounded():
        runner.run(bytes(buf), f"{lay.name}: field at {pos} (+{size}) {old:#x} -> {value:#x}")


@_settings("ids")
@given(st.data())
def test_value_ids_out_of_range_and_self_references(runner, data):
    """Ids in operator args, method inputs/outputs and value lists: past the end, negative, huge,
    or (for a value list) the list's own id; a vector's count made huge."""
    lay = _pick_layout(data.draw)
    buf = bytearray(lay.data)
    start, n, elem, label = data.draw(st.sampled_from(lay.id_vectors))
    fmt = {4: "<i", 8: "<q"}[elem]
    if n == 0 or data.draw(st.integers(0, 9)) == 0:
        count = data.draw(st.sampled_from([n + 1, 2 * n + 7, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 20]))
        _put(buf, start - 4, "<I", count)
        what = f"count {n} -> {count}"
    else:
        k = data.draw(st.integers(0, n - 1))
        own = [int(w) for w in label.split() if w.isdigit()]
        choices = [-1, -2, 10**6, 2**31 - 1, -(2**31), 4096, 257]
        if own and "list" in label:
            choices += [own[0]] * 4  # the list itself
        value = data.draw(st.one_of(st.sampled_from(choices), st.integers(-(2**31), 2**31 - 1)))
        _put(buf, start + k * elem, fmt, value)
        what = f"item {k} -> {value}"
    with bounded():
        runner.run(bytes(buf), f"{lay.name}: {label} {what}")


@_settings("dims")
@given(st.data())
def test_huge_and_zero_dims(runner, data):
    """Tensor dims (VkGraph u32) and sizes (.pte i32): huge, zero, negative as i32."""
    lay = _pick_layout(data.draw)
    buf = bytearray(lay.data)
    start, n, elem, label = data.draw(st.sampled_from(lay.dims_vectors))
    if n == 0:
        return
    changes = []
    for _ in range(data.draw(st.integers(1, n))):
        k = data.draw(st.integers(0, n - 1))
        value = data.draw(st.sampled_from([0, 1, 65536, 1 << 20, 2**31 - 1, 2**31, 2**32 - 1, 256]))
        _put(buf, start + 4 * k, "<I", value)
        changes.append((k, value))
    with bounded():
        runner.run(bytes(buf), f"{lay.name}: {label} {changes}")


@_settings("identifier")
@given(st.data())
def test_wrong_identifiers(runner, data):
    lay = _pick_layout(data.draw)
    buf = bytearray(lay.data)
    at, ident = data.draw(st.sampled_from(lay.identifiers))
    new = data.draw(
        st.one_of(
            st.sampled_from([b"ET11", b"ET13", b"VK01", b"VH01", b"eh01", b"\0\0\0\0", ident[::-1]]),
            st.binary(min_size=4, max_size=4),
        ).filter(lambda b: b != ident)
    )
    buf[at : at + 4] = new
    with bounded():
        outcome = runner.run(bytes(buf), f"{lay.name}: identifier {ident!r} at {at} -> {new!r}")
    if ident != b"eh00":  # without its eh00 header a file is read as one without segments
        assert outcome == "ModelFormatError"


def test_every_case_family_ran(runner):
    """The total count, and the GPU-free build reached by some mutations (not only refusals)."""
    assert runner.n >= CASES * 0.95
    assert runner.outcomes.get("built", 0) > 0 and runner.outcomes.get("ModelFormatError", 0) > 0


pytestmark_gpu = pytest.mark.usefixtures("adapter")


@pytestmark_gpu
async def test_full_load_of_mutations_that_build(runner):
    """Mutated files that got through the GPU-free build go through the full `ar.load`: loaded
    (and closed), or refused with a format error, within a bounded time."""
    sample = runner.planned[:: max(1, len(runner.planned) // 12)][:12]
    assert sample
    for data in sample:
        with anyio.fail_after(60):
            try:
                model = await ar.load(data)
            except ALLOWED:
                continue
            await model.aclose()


@pytestmark_gpu
async def test_a_tensor_claiming_4_tib_is_refused_before_any_allocation():
    """The input of block_dyn (in the .pte and in the delegate) claims [65536, 65536, 256] float32:
    `ar.load` raises ModelFormatError, and nothing near that size was ever allocated."""
    lay = layouts()["block_dyn"]
    buf = bytearray(lay.data)
    patched = 0
    for start, n, _, label in lay.dims_vectors:
        if n == 3 and struct.unpack_from("<3i", buf, start) == (1, 11, 15):
            struct.pack_into("<3I", buf, start, 65536, 65536, 256)
            patched += 1
    assert patched >= 2  # the method's value and the delegate's
    tracemalloc.start()
    try:
        with pytest.raises(ModelFormatError, match=r"65536, 65536, 256"):
            await ar.load(bytes(buf))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < TRACE_LIMIT, f"{peak} bytes allocated while refusing it"
