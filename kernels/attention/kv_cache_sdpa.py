"""`sdpa_with_kv_cache` and its ragged-batch form: writes this step's K and V into the session's
caches at the live position, then causal attention of the S query rows over the cache prefix,
with grouped-query heads.

The attention kernels stream the keys in blocks with an online softmax, so no scores matrix is
ever materialized, whatever the context length. Prefill-sized passes take the query-tiled kernel
("flash attention": one workgroup per query head and tile of TILE_ROWS rows, keys shared through
workgroup memory), or, for head dims it does not take, one workgroup per (query head, query row).
For a few rows (decode) that is too few workgroups for a long cache, so up to SPLIT_MAX_ROWS rows
take the split-K route ("flash decoding"): one workgroup per (head, row, key range) writes a
partial softmax state, and a second kernel merges the ranges; on GPUs a workgroup takes the query
heads of one key-value head together (reading its keys and values once) and the last of a row's
to finish merges. The hook picks the route. On a GPU,
a ragged pass takes split-K up to RAGGED_SPLIT_MAX_ROWS rows: its rows are mostly one decode step
each of different sessions, whose keys a query tile cannot share, and a few tiles leave the GPU
idle (on an H100, 64 SmolLM2 sessions spent 119 us a layer in 18 tiled workgroups, against 13.5 us
for 32 rows split).

Every kernel reads q and the caches, and writes its output, in their own storage types (f32 or
f16, named by WGSL aliases: `_typed`); scores, softmax statistics and sums are f32, and so is
split-K's scratch of partial states.

Kept as one module past 400 lines: its variants (tiled prefill, split-K decode for GPUs and CPUs, plain) share one bindings header, the online-softmax step and one route table.
"""

import math
import struct
import textwrap
from dataclasses import dataclass
from typing import NamedTuple

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..variants import ANY, CPU_ONLY, GPU, GPU_ONLY, Routes, Variant
from ..wgsl import LAST_TO_ARRIVE, fill, flat_grid, flat_kernel, type_aliases
from .kv_cache import CACHE_AT, key_row, table_entries

MAX_HEAD_DIM = 256
CHUNK = 64  # keys per chunk = workgroup size
MAX_SPLITS = 16  # split-K: the context is cut into this many key ranges (fewer if shorter)
SPLIT_MAX_ROWS = 32  # up to this many query rows (decode) use split-K
RAGGED_SPLIT_MAX_ROWS = 128  # the same for a ragged pass on a GPU (its scratch, 5 MB at SmolLM2 size, is pooled)

UPDATE_CACHE = flat_kernel(
    "n: u32, offset: u32, pad0: u32, pad1: u32",
    [("k", "KT", "read"), ("v", "VT", "read"), ("kc", "KCT", "read_write"), ("vc", "VCT", "read_write")],
    """
    kc[p.offset + i] = KCT(k[i]);
    vc[p.offset + i] = VCT(v[i]);
""",
)

# Ragged batches (async_runtime.ragged): row r of the batch is sequence row_seq[r] of the pass at
# absolute position row_pos[r], its keys in the paged caches through seq_blocks (kernels/attention/kv_cache.py's
# key_row); sequence -1 marks a padding row, which writes nothing (and attends, harmlessly, to
# sequence 0's first key).
RAGGED_TABLES = """
@group(0) @binding(5) var<storage, read> row_pos: array<i32>;
@group(0) @binding(6) var<storage, read> row_seq: array<i32>;
@group(0) @binding(7) var<storage, read> seq_blocks: array<i32>;
"""
# A plain cache (one sequence, positions in order): every key at its own row.
PLAIN_KEYS = "fn key_row(b: u32, j: u32) -> u32 { return j; }\n"

RAGGED_UPDATE_CACHE = flat_kernel(
    "n: u32, row: u32, blocks: u32, pad: u32",
    [("k", "KT", "read"), ("v", "VT", "read"), ("kc", "KCT", "read_write"), ("vc", "VCT", "read_write")],
    """
    let r = i / p.row;
    if (row_seq[r] < 0) { return; }  // a padding row
    let at = cache_at(r, i % p.row);
    kc[at] = KCT(k[i]);
    vc[at] = VCT(v[i]);
""",
    declarations=RAGGED_TABLES + CACHE_AT,
)

# The workgroup's max and sum of red[0..CHUNK) (both attention kernels), of type SV: a head's
# scores (f32), or those of a group of heads sharing a key-value head, one a component.
REDUCTIONS = fill(
    """
fn reduce_max(t: u32) -> SV {
    for (var stride = ${HALF}u; stride > 0u; stride = stride / 2u) {
        if (t < stride) { red[t] = max(red[t], red[t + stride]); }
        workgroupBarrier();
    }
    return red[0];
}

fn reduce_sum(t: u32) -> SV {
    for (var stride = ${HALF}u; stride > 0u; stride = stride / 2u) {
        if (t < stride) { red[t] = red[t] + red[t + stride]; }
        workgroupBarrier();
    }
    return red[0];
}
""",
    HALF=CHUNK // 2,
)

# A chunk's scores (`score`, -3e38 past the key range) into the running max m and sum l:
# probs[t] = exp(score - m_new), `corr` rescales what was accumulated, `n` keys are live.
ONLINE_SOFTMAX = fill(
    """        red[t] = score;
        workgroupBarrier();
        let m_new = max(m, reduce_max(t));
        workgroupBarrier();
        let e = select(SV(0.0), exp(score - m_new), j < k_end);
        probs[t] = e;
        red[t] = e;
        workgroupBarrier();
        let total = reduce_sum(t);
        let corr = exp(m - m_new);
        l = l * corr + total;
        let n = min(${CHUNK}u, k_end - base);""",
    CHUNK=CHUNK,
)


BINDINGS = """
struct P { s: u32, pos: u32, hq: u32, hkv: u32, d: u32, scale: f32, blocks: u32, splits: u32, span: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<storage, read> q: array<QT>;
@group(0) @binding(1) var<storage, read> kc: array<$KCACHE>;
@group(0) @binding(2) var<storage, read> vc: array<$VCACHE>;
@group(0) @binding(3) var<storage, read_write> out: array<OT>;
@group(0) @binding(4) var<uniform> p: P;
"""


def _bindings(vec4):
    """The attention kernels' uniform and bindings, the caches read as scalars or as vec4s (each
    kernel's $TABLES follow)."""
    return fill(BINDINGS, KCACHE="vec4<KCT>" if vec4 else "KCT", VCACHE="vec4<VCT>" if vec4 else "VCT")


F32_BINDINGS = _bindings(False)  # scalar loads (of f32 or f16 storage: the aliases QT, KCT, VCT, OT)
# The bindings of the kernels that read the caches as vec4s (split-K's SPLIT_VEC4 and TILED).
VEC4_BINDINGS = _bindings(True)

ATTENTION = F32_BINDINGS + """$TABLES
alias SV = f32;
var<workgroup> qs: array<f32, $MAX_HEAD_DIM>;
var<workgroup> probs: array<f32, $CHUNK>;
var<workgroup> red: array<f32, $CHUNK>;
var<workgroup> rows: array<u32, $CHUNK>;  // the cache rows of the chunk's keys (a block may be shorter than a chunk)

$REDUCTIONS
@compute @workgroup_size($CHUNK)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x;
    let s = wid.y;
    let t = lid.x;
    let kvh = h / (p.hq / p.hkv);
    let row = (s * p.hq + h) * p.d;
    for (var d = t; d < p.d; d = d + ${CHUNK}u) { qs[d] = f32(q[row + d]) * p.scale; }
    workgroupBarrier();
    let keys = $KEYS;  // causal: the row at absolute position P sees keys 0..P
    let seq = $SEQ;
$KEY_RANGE
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, $SLICES>();
    for (var base = k_begin; base < k_end; base = base + ${CHUNK}u) {
        let j = base + t;
        var score = -3.0e38;
        if (j < k_end) {
            rows[t] = key_row(seq, j);
            let kbase = (rows[t] * p.hkv + kvh) * p.d;
            var dot = 0.0;
            for (var d = 0u; d < p.d; d = d + 1u) { dot = dot + qs[d] * f32(kc[kbase + d]); }
            score = dot;
        }
$ONLINE_SOFTMAX
        for (var c = 0u; c < ${SLICES}u; c = c + 1u) {
            let d = t + c * ${CHUNK}u;
            if (d < p.d) {
                var sum = 0.0;
                for (var jj = 0u; jj < n; jj = jj + 1u) {
                    sum = sum + probs[jj] * f32(vc[(rows[jj] * p.hkv + kvh) * p.d + d]);
                }
                acc[c] = acc[c] * corr + sum;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
$FINISH
}
"""


WHOLE_RANGE = """    let k_begin = 0u;
    let k_end = keys;"""
WHOLE_FINISH = """    for (var c = 0u; c < ${SLICES}u; c = c + 1u) {
        let d = t + c * ${CHUNK}u;
        if (d < p.d) { out[row + d] = OT(acc[c] / l); }
    }"""
# Split-K ("flash decoding"): workgroup z takes one slice of the keys and writes its partial
# softmax state (acc[0..d), running max m, sum l) to `out`, here the op's scratch tensor.
# A row's keys are spread over the splits in whole chunks: a row of up to MAX_SPLITS chunks of keys
# takes one chunk a workgroup, a longer one ceil(keys / splits) rounded up to chunks (at most
# p.span, ceil(context / splits)). With p.span for every row, a row of 65-128 keys walked two
# chunks in one workgroup while the others idled: on an H100 a decode row's split-K and combine
# took 21 us a dispatch from 65 keys on (and at 1,000), 12 at 8 keys; now 16 at 120 and 1,000
# (`examples/profile_ragged_decode.py MODEL 1,32 --prompt P`).
SPLIT_RANGE = fill(
    """    let span = max(${CHUNK}u, ((keys + p.splits - 1u) / p.splits + ${CHUNK_MINUS_1}u) / ${CHUNK}u * ${CHUNK}u);
    let k_begin = min(keys, wid.z * span);
    let k_end = min(keys, k_begin + span);""",
    CHUNK=CHUNK,
    CHUNK_MINUS_1=CHUNK - 1,
)
SPLIT_FINISH = """    let part = ((s * p.hq + h) * p.splits + wid.z) * (p.d + 2u);
    for (var c = 0u; c < ${SLICES}u; c = c + 1u) {
        let d = t + c * ${CHUNK}u;
        if (d < p.d) { out[part + d] = OT(acc[c]); }
    }
    if (t == 0u) { out[part + p.d] = OT(m); out[part + p.d + 1u] = OT(l); }"""


# The split-K kernel for head dims of 4 * G with G dividing CHUNK (64 for SmolLM2 and Llama): a
# decode row's attention is latency-bound, and the kernel above walks 64-long serial loops (a dot
# product per key, a weighted sum per dim). Here the dot products read vec4s (G steps), and the
# weighted sum splits each chunk's keys over CHUNK / G invocations per vec4 of dims, whose partial
# sums are then added in a fixed order. Same partial-state layout as SPLIT_FINISH. A workgroup takes
# QG query heads of one key-value head (grouped-query attention), each key's and value's vec4 read
# once for all of them: their scores, maxima and sums are the components of SV, each head's the
# same operations in the same order as a workgroup of one head (bitwise, whatever QG). H200, greedy
# bursts, two rounds in one call, 1 / 2 / 4 / 16 streams: SmolLM2 4w (3 heads a group) 772-802 /
# 1,443-1,455 / 2,738-2,749 / 6,715-6,717 -> 797-841 / 1,539-1,557 / 2,882-2,937 / 6,988-7,065
# tokens/s; Llama-3.2-1B 4w (4) one stream 928-938 -> 954-959, 64 streams 7,554-7,741 -> 7,615-7,978
# (results/h200/kernel_choices/attention_head_groups/).
SPLIT_VEC4 = VEC4_BINDINGS + """$TABLES
alias SV = $SV;
var<workgroup> qs: array<vec4<f32>, $QS>;  // [head of the group][vec4 of dims]
var<workgroup> probs: array<SV, $CHUNK>;
var<workgroup> red: array<SV, $CHUNK>;
var<workgroup> part: array<vec4<f32>, $PARTS>;  // [head of the group][invocation]
var<workgroup> rows: array<u32, $CHUNK>;  // the cache rows of the chunk's keys (a block may be shorter than a chunk)
$MERGED
$REDUCTIONS
@compute @workgroup_size($CHUNK)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x * ${QG}u;  // the group's first head
    let s = wid.y;
    let t = lid.x;
    let kvh = h / (p.hq / p.hkv);
    let keys = $KEYS;  // causal: the row at absolute position P sees keys 0..P
    let seq = $SEQ;
$KEY_RANGE
    let used = (keys + span - 1u) / span;  // the splits the row's keys take; the rest leave, and the merge skips them
$MERGE_DISPATCH
    // the cache row of this invocation's first key, asked for before q's loads so that its latency
    // overlaps theirs (a decode row's attention is latency-bound: one more dependent load cost an H100 ~3%)
    var kr = key_row(seq, k_begin + t);
    for (var u = t; u < ${QS}u; u = u + ${CHUNK}u) {  // (4 heads of 128 dims are twice the invocations' vec4s)
        let i = (s * p.hq + h + u / ${G}u) * p.d + 4u * (u % ${G}u);
        qs[u] = vec4<f32>(f32(q[i]), f32(q[i + 1u]), f32(q[i + 2u]), f32(q[i + 3u])) * p.scale;
    }
    workgroupBarrier();
    if (wid.z >= used) { return; }
    let g = t % ${G}u;  // this invocation's vec4 of dims in the weighted sum
    let sub = t / ${G}u;  // and its share of each chunk's keys
    var m = SV(-3.0e38);
    var l = SV(0.0);
$ACC
    for (var base = k_begin; base < k_end; base = base + ${CHUNK}u) {
        let j = base + t;
        var score = SV(-3.0e38);
        if (j < k_end) {
            rows[t] = kr;
            let kb = (kr * p.hkv + kvh) * ${G}u;
            var sc = SV(0.0);
            for (var e = 0u; e < ${G}u; e = e + 1u) { let k4 = vec4<f32>(kc[kb + e]); sc = sc + $DOTS; }
            score = sc;
        }
$ONLINE_SOFTMAX
$SUMS
        for (var jj = sub; jj < n; jj = jj + ${SUBS}u) {
            let v4 = vec4<f32>(vc[(rows[jj] * p.hkv + kvh) * ${G}u + g]);
            let pr = probs[jj];
$WEIGH
        }
$PARTS_STORE
        workgroupBarrier();
        if (t < ${G}u) {
$FOLD
        }
        m = m_new;
        kr = key_row(seq, base + ${CHUNK}u + t);  // the next chunk's (past the table's rows: unused)
        workgroupBarrier();
    }
    if (used == 1u) {  // one split: its state merged alone is acc / l, written here without the merge
        if (t < ${G}u) {
$RESULTS
        }
        return;
    }
$STATES
$FINISH
}
"""


def split_vec4(dim, qg, key_range, merged, finish, merge_dispatch="", **common):
    """SPLIT_VEC4 for head dim `dim` and groups of `qg` query heads (q_group); `merge_dispatch`:
    MERGE_DISPATCH where a second dispatch merges."""
    g, subs = dim // 4, CHUNK // (dim // 4)
    c = (lambda i: "") if qg == 1 else (lambda i: "." + "xyzw"[i])  # head i's component of an SV

    def per_head(line):  # line(i, component, row): head i's statements
        return "\n".join(line(i, c(i), f"(s * p.hq + h + {i}u)") for i in range(qg))

    def store(buffer, to, acc):  # vec4 `acc` into `buffer` (of type alias `to`) at WGSL offset o
        return " ".join(f"{buffer}[o + {k}u] = {to}({acc}.{'xyzw'[k]});" for k in range(4))

    dots = ", ".join(f"dot(qs[{i * g}u + e], k4)" for i in range(qg))
    return fill(
        SPLIT_VEC4,
        SV="f32" if qg == 1 else f"vec{qg}<f32>",
        QG=qg,
        QS=qg * g,
        PARTS=qg * CHUNK,
        G=g,
        SUBS=subs,
        KEY_RANGE=key_range,
        MERGED=merged,
        FINISH=finish,
        MERGE_DISPATCH=merge_dispatch,
        ACC=per_head(lambda i, c, row: f"    var acc{i} = vec4<f32>(0.0);"),
        DOTS=dots if qg == 1 else f"SV({dots})",
        SUMS=per_head(lambda i, c, row: f"        var sum{i} = vec4<f32>(0.0);"),
        WEIGH=per_head(lambda i, c, row: f"            sum{i} = sum{i} + pr{c} * v4;"),
        PARTS_STORE=per_head(lambda i, c, row: f"        part[{i * CHUNK}u + t] = sum{i};"),
        FOLD=per_head(
            lambda i, c, row: f"            {{ var all = part[{i * CHUNK}u + t]; for (var k = 1u; k < {subs}u; k = k + 1u) {{ all = all + part[{i * CHUNK}u + k * {g}u + t]; }}"
            f" acc{i} = acc{i} * corr{c} + all; }}"
        ),
        RESULTS=per_head(lambda i, c, row: f"            {{ let r = acc{i} / l{c}; let o = {row} * p.d + 4u * t; {store('result', 'RT', 'r')} }}"),
        STATES=per_head(
            lambda i, c, row: f"    {{ let at = ({row} * p.splits + wid.z) * (p.d + 2u); let o = at + 4u * t;\n"
            f"      if (t < {g}u) {{ {store('out', 'OT', f'acc{i}')} }}\n"
            f"      if (t == 0u) {{ out[at + p.d] = OT(m{c}); out[at + p.d + 1u] = OT(l{c}); }} }}"
        ),
        **common,
    )


def online_softmax_step(dim, value):
    """WGSL folding one key into the online softmax state (max m, sum l, accumulator acc[0..dim))
    of a kernel that keeps it in registers: `score` is the key's score, `value` its value at d."""
    return fill(
        """        let m_new = max(m, score);
        let corr = exp(m - m_new);
        let e = exp(score - m_new);
        l = l * corr + e;
        for (var d = 0u; d < $DIM; d = d + 1u) { acc[d] = acc[d] * corr + e * $VALUE; }
        m = m_new;""",
        DIM=dim,
        VALUE=value,
    )


# The split-K kernel for CPU adapters (kernels/variants.py): no workgroup memory, no barrier. One
# invocation per (head, row, key range), invocation z of a workgroup of MAX_SPLITS taking range z
# (so SIMD lanes run different key ranges side by side), each key folded into its own online
# softmax state (max m, sum l, accumulator acc[0..d)) in registers. Same partial-state layout as
# SPLIT_FINISH, merged by COMBINE.
SPLIT_CPU = F32_BINDINGS + """$TABLES
@compute @workgroup_size($MAX_SPLITS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x;
    let s = wid.y;
    let z = lid.x;
    if (z >= p.splits) { return; }
    let kvh = h / (p.hq / p.hkv);
    let row = (s * p.hq + h) * p.d;
    let keys = $KEYS;  // causal: the row at absolute position P sees keys 0..P
    let seq = $SEQ;
    let k_begin = min(keys, z * p.span);
    let k_end = min(keys, k_begin + p.span);
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, $MAX_HEAD_DIM>();
    for (var j = k_begin; j < k_end; j = j + 1u) {
        let kbase = (key_row(seq, j) * p.hkv + kvh) * p.d;
        var score = 0.0;
        for (var d = 0u; d < p.d; d = d + 1u) { score = score + f32(q[row + d]) * p.scale * f32(kc[kbase + d]); }
$ONLINE_STEP
    }
    let at = ((s * p.hq + h) * p.splits + z) * (p.d + 2u);
    for (var d = 0u; d < p.d; d = d + 1u) { out[at + d] = OT(acc[d]); }
    out[at + p.d] = OT(m);
    out[at + p.d + 1u] = OT(l);
}
"""

# The merge of one (head, row)'s first `count` split partial states, rescaled to the overall max,
# by invocation t of CHUNK: from PARTS (f32) into RESULT (of type RT). COMBINE runs it in a
# dispatch of its own over every split; SPLIT_VEC4's fused form in the last of the row's
# workgroups to finish, over the splits the row's keys took (the others' states, an empty range's,
# would add exact zeros: the result is the same).
MERGE = """
fn merge(s: u32, h: u32, t: u32, count: u32) {
    let width = p.d + 2u;
    let base = (s * p.hq + h) * p.splits * width;
    var mx = -3.0e38;
    for (var g = 0u; g < count; g = g + 1u) { mx = max(mx, $PARTS[base + g * width + p.d]); }
    var total = 0.0;
    for (var g = 0u; g < count; g = g + 1u) {
        total = total + $PARTS[base + g * width + p.d + 1u] * exp($PARTS[base + g * width + p.d] - mx);
    }
    for (var d = t; d < p.d; d = d + ${CHUNK}u) {
        var sum = 0.0;
        for (var g = 0u; g < count; g = g + 1u) {
            sum = sum + $PARTS[base + g * width + d] * exp($PARTS[base + g * width + p.d] - mx);
        }
        $RESULT[(s * p.hq + h) * p.d + d] = RT(sum / total);
    }
}
"""

COMBINE = fill(
    """
struct P { s: u32, pos: u32, hq: u32, hkv: u32, d: u32, scale: f32, blocks: u32, splits: u32, span: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<storage, read> parts: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<RT>;
@group(0) @binding(2) var<uniform> p: P;
$MERGE
@compute @workgroup_size($CHUNK)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    merge(wid.y, wid.x, lid.x, p.splits);
}
""",
    MERGE=fill(MERGE, CHUNK=CHUNK, PARTS="parts", RESULT="out"),
    CHUNK=CHUNK,
)

# SPLIT_VEC4's finish on a GPU: the (head, row)'s workgroups that have keys count their arrivals,
# and the last merges their splits (MERGE) and sets the count back to 0, so split-K is one
# dispatch, not two (a decode step's attention was 60 of its 216 dispatches). Each workgroup's
# partial-state stores are ordered before its arrival by a storage barrier (device scope in naga's
# SPIR-V), and the last one's loads after it by another. WGSL promises only workgroup scope; where
# a compiler gives no more (`merge_apart`: Dawn's), a second dispatch merges (MERGE_DISPATCH). A row
# of up to 64 keys takes one split of 16: on an H100 the other 15 workgroups' stores, arrivals and
# merged zeros took attention a layer from 19.7 to 28.3 us at one decode row.
def _arrivals(first, apart):
    """The fused finish's bindings (the result, then the arrival counts unless merged `apart`,
    from binding `first`) and its merge."""
    counts = "" if apart else f"@group(0) @binding({first + 1}) var<storage, read_write> arrivals: array<atomic<u32>>;\n{LAST_TO_ARRIVE}"
    return fill(
        """@group(0) @binding($FIRST) var<storage, read_write> result: array<RT>;
$COUNTS$MERGE""",
        FIRST=first,
        COUNTS=counts,
        MERGE=fill(MERGE, CHUNK=CHUNK, PARTS="out", RESULT="result"),
    )


LAST_MERGES = """    if (last_to_arrive(t, s * p.hq + h, used)) {
        for (var i = 0u; i < ${QG}u; i = i + 1u) { merge(s, h + i, t, used); }
    }"""
# Merged apart: the splits leave their states, and a second dispatch of the kernel with one
# workgroup a (head group, row) merges them as soon as it knows the row's splits (a row of one split
# wrote its result in the first), where it computed split 0 again first: the same bits, no slower
# (H100, Dawn, Llama-3.2-1B 4w of f16 activations loaded with batch_invariant=False, greedy bursts
# over 9-72 keys, rounds old / new / new / old in one call, one / 16 streams 811 / 5,276, 803 /
# 5,471, 805 / 5,407, 754 / 5,398 tokens/s; results/h100/attention_merge_alone/).
MERGE_DISPATCH = """    if (groups.z == 1u && p.splits > 1u) {  // the merge's dispatch
        if (used > 1u) {
            for (var i = 0u; i < ${QG}u; i = i + 1u) { merge(s, h + i, t, used); }
        }
        return;
    }"""


# The query-tiled kernel ("flash attention") for head dims d = 4 * G up to TILED_MAX_DIM: one
# workgroup per (query head, tile of TILE_ROWS rows), SUBS invocations per row and dims half
# (HALVES). Each one keeps its row's q (pre-scaled) and its own online-softmax state (max m, sum l,
# accumulator a) in registers, as separate vec4 variables (a private array indexed in a loop
# spills to local memory), and takes keys sub * KPS .. sub * KPS + KPS - 1 of each block of BK
# keys, whose K and V rows the workgroup loads into `kv` together. Invocation t is row t % TILE_ROWS
# of sub t / TILE_ROWS % SUBS, so a warp's invocations read the same K and V vec4 at once (a
# broadcast). `kv` is indexed [half, sub][key][vec4] with constant inner indices: naga clamps each
# dynamic index into a workgroup array, and this way that is one clamp per kernel, not one per read.
# Every row's result is the same whatever the tile's other rows: blocks are aligned at key 0,
# masked keys add exact zeros.
#
# Past 64 dims q and a would take more than 2 * 64 registers: the row's dims are cut in two halves
# (dh = t / (TILE_ROWS * SUBS)), each invocation keeping q and a of its half. The two halves of a
# score meet in workgroup memory (`ps`) and are added in one order for both (p0 + p1 = p1 + p0), so
# both compute the same softmax state, each for its own dims.
TILE_ROWS = 32
TILE_SUBS = 4
TILED_MAX_DIM = 128
KV_BYTES = 16384  # workgroup storage of a block's K and V rows (and the halves' scores; WebGPU's default limit)
TILED = VEC4_BINDINGS + """$TABLES
// [half * SUBS + sub][i] is the K row half of key sub * KPS + i of the block, [HALVES * SUBS + half *
// SUBS + sub][i] its V row half; the merge's scratch afterwards, in rows of GH vec4s
var<workgroup> kv: array<array<array<vec4<f32>, $GH>, $KPS>, $ROWS2>;
$PS
fn hsum(x: vec4<f32>) -> f32 { return (x.x + x.y) + (x.z + x.w); }

@compute @workgroup_size($THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x;
    let r0 = ((p.s + ${BQ}u - 1u) / ${BQ}u - 1u - wid.y) * ${BQ}u;  // the last (longest) tiles first
    let r_end = min(r0 + ${BQ}u, p.s);
    let t = lid.x;
    let lane = t % ${BQ}u;
    $SUB
    let row = r0 + lane;
    let r = min(row, p.s - 1u);
    let kvh = h / (p.hq / p.hkv);
    let qi = $Q_ROW * ${D}u$HALF_OFFSET;
    $Q
    $ACC
    var m = -3.0e38;
    var l = 0.0;
$RANGES
    // Merge the row's SUBS states: rescaled to their common max, then summed pairwise in a
    // fixed order through kv (free: the last key block ended on a barrier).
    $MERGE
}
"""

# The key blocks of the rows `mine` (keys 0..keys-1 each) over sequence `seq`'s keys (vec4s of key_row's rows);
# `kmax` bounds every row's key count and is the same for the whole workgroup.
TILED_BLOCKS = """    for (var kb = 0u; kb < kmax; kb = kb + ${BK}u) {
        for (var i = t; i < ${BKG}u; i = i + ${THREADS}u) {
            let key = i / ${G}u;
            let j = min(kb + key, kmax - 1u);  // past kmax: a live key's row, masked below
            let at = $KEY_ROW * ${G}u + i % ${G}u;
            $STORE_KV
        }
        workgroupBarrier();
        let j0 = kb + sub * ${KPS}u;
        $PARTS
        if (mine && j0 < keys) {
            $SCORES
            let m_new = max(m, $MAX);
            let corr = exp(m - m_new);
            $PROBS
            l = l * corr + $TOTAL;
            $WEIGHTED
            m = m_new;
        }
        workgroupBarrier();
    }"""

# Every row sees all p.pos keys (an encoder's or a vision model's attention, not causal).
TILED_FULL = """    let keys = p.pos;
    let mine = row < p.s;
    let kmax = p.pos;
    let seq = 0u;
$BLOCKS"""

TILED_PLAIN = """    let keys = p.pos + row + 1u;  // causal: the row at absolute position P sees keys 0..P
    let mine = row < p.s;
    let kmax = p.pos + r_end;
    let seq = 0u;
$BLOCKS"""

# Ragged: the tile's segments (maximal runs of rows of one sequence) one after the other, each
# over its own sequence's keys; padding rows (sequence -1) attend to nothing and write zeros.
TILED_RAGGED = """    let keys = u32(row_pos[r]) + 1u;  // causal: the row at absolute position P sees keys 0..P
    var seg = r0;
    while (seg < r_end) {
        let owner = row_seq[seg];
        var e = seg + 1u;
        var kmax = u32(row_pos[seg]) + 1u;
        while (e < r_end && row_seq[e] == owner) {
            kmax = max(kmax, u32(row_pos[e]) + 1u);
            e = e + 1u;
        }
        if (owner >= 0) {
            let mine = row >= seg && row < e;
            let seq = u32(owner);
$BLOCKS
        }
        seg = e;
    }"""


@dataclass(frozen=True)
class TiledShape:
    """How the tiled kernel of head dim `dim` cuts a row's work: `halves` of its dims, `subs` key
    ranges of each block, `bk` keys a block (kps an invocation), in KV_BYTES of workgroup memory."""

    dim: int
    halves: int
    subs: int
    bk: int

    @property
    def g(self):
        return self.dim // 4

    @property
    def gh(self):  # vec4s of one half
        return self.g // self.halves

    @property
    def kps(self):
        return self.bk // self.subs

    @property
    def threads(self):
        return TILE_ROWS * self.subs * self.halves


def tiled_shape(dim):
    """The TiledShape of head dim `dim`, or None where the tiled kernel does not take it."""
    if dim % 4 or dim > TILED_MAX_DIM:
        return None
    if dim <= 64:
        return TiledShape(dim, 1, TILE_SUBS, min(64, KV_BYTES // (8 * dim)) // TILE_SUBS * TILE_SUBS)
    if dim % 8:
        return None  # halves of whole vec4s
    halves, subs = 2, 2  # a block's K and V rows (8 * dim bytes a key) and the halves' scores (threads * kps floats) share KV_BYTES
    bk = KV_BYTES // (8 * dim + 4 * TILE_ROWS * halves) // subs * subs
    return TiledShape(dim, halves, subs, bk)


# Where TILED reads row r of head h of q (and writes it), and the row of key j of kv head kvh (k's
# and v's rows alike): a cache's layout, [rows, heads, dim]; or an encoder's, any layout of rows of
# `dim` given by ENCODER_LAYOUT: head h is (h / heads, h % heads), and a tensor's row (b, h, r) is
# b * (its b) + h * (its h) + r * (its r) + its offset (k's and v's offsets apart, in vec4s).
CACHE_ROWS = ("(r * p.hq + h)", "(row * p.hq + h)", "(key_row(seq, j) * p.hkv + kvh)")
ENCODER_LAYOUT = """struct E { heads: u32, qb: u32, qh: u32, qr: u32, qo: u32, ob: u32, oh: u32, os: u32, oo: u32,
           kb: u32, kh: u32, kr: u32, k4: u32, v4: u32, pad0: u32, pad1: u32 }
@group(0) @binding(5) var<uniform> e: E;
"""
ENCODER_ROWS = (
    "((h / e.heads) * e.qb + (h % e.heads) * e.qh + r * e.qr + e.qo)",
    "((h / e.heads) * e.ob + (h % e.heads) * e.oh + row * e.os + e.oo)",
    "((kvh / e.heads) * e.kb + (kvh % e.heads) * e.kh + j * e.kr)",
)


def tiled_shader(ragged, dim, encoder=False):
    """TILED for head dim `dim` (tiled_shape's), its G-long loops written out; `encoder`: every row
    sees every key (TILED_FULL), tensors laid out as ENCODER_LAYOUT says (bound after the uniform)."""
    q_row, out_row, key_row = ENCODER_ROWS if encoder else CACHE_ROWS
    k_at, v_at = ("at + e.k4", "at + e.v4") if encoder else ("at", "at")
    sh = tiled_shape(dim)
    g, gh, bq, subs, kps, bk, halves = sh.g, sh.gh, TILE_ROWS, sh.subs, sh.kps, sh.bk, sh.halves
    n = "\n            "
    vis = [f"j0 + {i}u < keys" for i in range(kps)]
    dots = [f"hsum({' + '.join(f'q{e} * kv[ks][{i}][{e}]' for e in range(gh))})" for i in range(kps)]
    if halves == 1:
        store_kv = (
            f"kv[key / {kps}u][key % {kps}u][i % {g}u] = vec4<f32>(kc[{k_at}]);\n"
            f"            kv[{subs}u + key / {kps}u][key % {kps}u][i % {g}u] = vec4<f32>(vc[{v_at}]);"
        )
        parts, scores = "", [f"let s{i} = select(-3.0e38, {dots[i]}, {vis[i]});" for i in range(kps)]
    else:  # vec4 c of the key's row is vec4 c % GH of half c / GH
        kv_row = f"(i % {g}u / {gh}u) * {subs}u + key / {kps}u"
        store_kv = (
            f"kv[{kv_row}][key % {kps}u][i % {gh}u] = vec4<f32>(kc[{k_at}]);\n"
            f"            kv[{halves * subs}u + {kv_row}][key % {kps}u][i % {gh}u] = vec4<f32>(vc[{v_at}]);"
        )
        other = bq * subs  # the same row and sub in the other half
        parts = n.join([*(f"ps[{i}][t] = {dots[i]};" for i in range(kps)), "workgroupBarrier();"])
        scores = [f"let s{i} = select(-3.0e38, ps[{i}][t] + ps[{i}][t ^ {other}u], {vis[i]});" for i in range(kps)]
    blocks = fill(
        TILED_BLOCKS, BK=bk, BKG=bk * g, G=g, KPS=kps, THREADS=sh.threads, STORE_KV=store_kv, PARTS=parts, KEY_ROW=key_row,
        SCORES=n.join(scores),
        MAX=_max_tree([f"s{i}" for i in range(kps)]),
        PROBS=n.join(f"let p{i} = select(0.0, exp(s{i} - m_new), {vis[i]});" for i in range(kps)),
        TOTAL=" + ".join(f"p{i}" for i in range(kps)),
        WEIGHTED=n.join(
            f"a{e} = a{e} * corr + {' + '.join(f'p{i} * kv[vs][{i}][{e}]' for i in range(kps))};" for e in range(gh)
        ),
    )
    if ragged:
        ranges = fill(TILED_RAGGED, BLOCKS=textwrap.indent(blocks, " " * 8))
    else:
        ranges = fill(TILED_FULL if encoder else TILED_PLAIN, BLOCKS=blocks)

    def at(i):  # kv as rows of GH vec4s: row i
        return f"kv[{i} / {kps}u][{i} % {kps}u]"

    def flat(i):  # vec4 i of kv
        return f"kv[{i} / {gh * kps}u][{i} / {gh}u % {kps}u][{i} % {gh}u]"

    assert sh.threads <= 2 * bk * g, "kv must hold every invocation's (m, l)"
    states = [f"st{k}" for k in range(subs)]
    first = "dh * " + str(bq * subs) + "u + " if halves > 1 else ""
    merge = [f"{flat('t')} = vec4<f32>(m, l, 0.0, 0.0);", "workgroupBarrier();"]
    merge += [f"let st{k} = {flat(f'({first}{k * bq}u + lane)')};" for k in range(subs)]
    merge.append(f"let mx = {_max_tree([f'{s}.x' for s in states])};")
    merge.append(f"let total = {' + '.join(f'{s}.y * exp({s}.x - mx)' for s in states)};")
    merge.append("let c = exp(m - mx);")
    merge += [f"a{e} = a{e} * c;" for e in range(gh)]
    rows = 2 * bk * halves  # kv's rows of GH vec4s
    half = subs // 2
    while half:  # subs [half, 2 * half) hand their a to subs [0, half), chunk by chunk of the dims
        slots = half * bq * halves
        chunk = min(gh, rows * gh // slots)
        assert chunk, "kv must hold a chunk of the merge"
        base = f"dh * {half * bq}u + " if halves > 1 else ""
        for c0 in range(0, gh, chunk):
            dims = range(c0, min(gh, c0 + chunk))
            if chunk == gh:  # one row a slot
                put = " ".join(f"{at('at')}[{e}] = a{e};" for e in dims)
                add = " ".join(f"a{e} = a{e} + {at('at')}[{e}];" for e in dims)
            else:
                put = " ".join(f"{flat(f'(at * {chunk}u + {e - c0}u)')} = a{e};" for e in dims)
                add = " ".join(f"a{e} = a{e} + {flat(f'(at * {chunk}u + {e - c0}u)')};" for e in dims)
            merge += [
                "workgroupBarrier();",
                f"if (sub >= {half}u && sub < {2 * half}u) {{ let at = {base}(sub - {half}u) * {bq}u + lane; {put} }}",
                "workgroupBarrier();",
                f"if (sub < {half}u) {{ let at = {base}sub * {bq}u + lane; {add} }}",
            ]
        half //= 2
    # a real row's total is at least 1 (its largest score's exp(0)); a padding row's is 0, a = 0
    writes = " ".join(f"out[o + {4 * e + c}u] = OT(a{e}.{'xyzw'[c]} / w);" for e in range(gh) for c in range(4))
    half_offset = f" + dh * {4 * gh}u" if halves > 1 else ""  # the first of this invocation's dims in a row
    merge.append(f"if (sub == 0u && row < p.s) {{ let o = {out_row} * {dim}u{half_offset}; let w = max(total, 1e-30); {writes} }}")
    n = "\n    "
    q = [", ".join(f"f32(q[qi + {4 * e + c}u])" for c in range(4)) for e in range(gh)]
    if halves == 1:
        sub = f"let sub = t / {bq}u;\n    let ks = sub;\n    let vs = {subs}u + sub;"
    else:
        sub = (
            f"let sub = t / {bq}u % {subs}u;\n    let dh = t / {bq * subs}u;  // the dims half\n"
            f"    let ks = dh * {subs}u + sub;\n    let vs = {halves * subs}u + ks;"
        )
    return fill(
        TILED,
        TABLES=ENCODER_LAYOUT if encoder else _tables(ragged),
        PS=f"var<workgroup> ps: array<array<f32, {sh.threads}>, {kps}>;  // [key][t]: t's part of the key's score\n" if halves > 1 else "",
        GH=gh, KPS=kps, ROWS2=2 * subs * halves, THREADS=sh.threads, BQ=bq, D=dim, SUB=sub,
        HALF_OFFSET=half_offset, Q_ROW=q_row,
        Q=n.join(f"let q{e} = vec4<f32>({q[e]}) * p.scale;" for e in range(gh)),
        ACC=n.join(f"var a{e} = vec4<f32>(0.0);" for e in range(gh)),
        RANGES=ranges,
        MERGE=n.join(merge),
    )


def _max_tree(terms):
    """WGSL of the max of `terms`, as a balanced tree of max() calls."""
    while len(terms) > 1:
        terms = [f"max({a}, {b})" for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) - len(terms) % 2 :]
    return terms[0]


def _merges_itself(dim):
    """Whether split-K of head dim `dim` is SPLIT_VEC4, which merges its splits itself."""
    return dim % 4 == 0 and CHUNK % (dim // 4) == 0


def _attention_shader(ragged, split=False, merges=False, dim=None, apart=False, qg=1):
    """The whole-range kernel, or the split-K one: SPLIT_VEC4, merging its own splits, with
    `merges` (where `_merges_itself(dim)`; its result and arrival counts bound after the tables;
    `apart`: merged by a second dispatch, no counts; `qg` query heads a workgroup)."""
    common = dict(
        _row_exprs(ragged),
        REDUCTIONS=REDUCTIONS,
        ONLINE_SOFTMAX=ONLINE_SOFTMAX,
        CHUNK=CHUNK,
    )
    if split and merges:
        merged = _arrivals(8 if ragged else 5, apart)
        finish, merge_dispatch = ("", fill(MERGE_DISPATCH, QG=qg)) if apart else (fill(LAST_MERGES, QG=qg), "")
        return split_vec4(dim, qg, SPLIT_RANGE, merged, finish, merge_dispatch=merge_dispatch, **common)
    return fill(
        ATTENTION,
        KEY_RANGE=SPLIT_RANGE if split else WHOLE_RANGE,
        FINISH=fill(SPLIT_FINISH if split else WHOLE_FINISH, SLICES=MAX_HEAD_DIM // CHUNK, CHUNK=CHUNK),
        MAX_HEAD_DIM=MAX_HEAD_DIM,
        SLICES=MAX_HEAD_DIM // CHUNK,
        **common,
    )


def _whole_range(ragged, dim):
    """(shader, query rows per workgroup) of the route for more rows than split-K takes."""
    if tiled_shape(dim) is not None:
        return tiled_shader(ragged, dim), TILE_ROWS
    return _attention_shader(ragged), 1


def _attention_args(b):
    """Checks shared by both forms; returns (context, kv heads, head dim, q heads, scale)."""
    if not b.is_none(7):
        b.fail("an explicit attn_mask is not supported (causal only)")
    if b.scalar(8, 0):
        b.fail("dropout is not supported")
    _, context, hkv, dim = b.tensor(3).dims
    hq = b.tensor(0).dims[2]
    if dim > MAX_HEAD_DIM or hq % hkv:
        b.fail(f"head dim {dim} (max {MAX_HEAD_DIM}) or heads {hq}/{hkv} unsupported")
    scale = b.scalar(10, None)
    b.writes(b.args[3])
    b.writes(b.args[4])
    return context, hkv, dim, hq, 1.0 / math.sqrt(dim) if scale is None else float(scale)


def _rows(b, ctx):
    s = ctx.dims(b.args[0])[1]
    if ctx.dims(b.args[1])[1] != s or ctx.dims(b.args[2])[1] != s:
        b.fail(f"q, k, v have {s}, {ctx.dims(b.args[1])[1]}, {ctx.dims(b.args[2])[1]} rows")
    return s


class Rows(NamedTuple):
    """The shape the attention variants choose by: live query rows, and up to how many of them
    this op takes split-K."""

    n: int
    split_max: int


class _Launch:
    """A route of dispatches with their grids for a live row count, as a variant's route."""

    def __init__(self, *dispatches_and_grids):
        self.parts = dispatches_and_grids

    def set(self, ctx, rows, on):
        for d, grid in self.parts:
            ctx.set_grid(d, grid(rows.n) if on else (0, 0, 0))


def q_group(hq, hkv):
    """The query heads a workgroup of SPLIT_VEC4 takes: the most, up to 4 (an SV vector), that
    divide the query heads of a key-value head."""
    return next(qg for qg in (4, 3, 2, 1) if (hq // hkv) % qg == 0)


def _split_route(cpu):
    """Split-K decode and its combine; on CPU adapters one invocation per key range (SPLIT_CPU)."""

    def build(b, att):
        merges = not cpu and _merges_itself(att.dim)
        if cpu:
            step = online_softmax_step("p.d", "f32(vc[kbase + d])")
            shader = fill(SPLIT_CPU, MAX_SPLITS=MAX_SPLITS, MAX_HEAD_DIM=MAX_HEAD_DIM, ONLINE_STEP=step, **att.common)
            grid = lambda s: (att.hq, s, 1)  # noqa: E731
        else:
            qg = q_group(att.hq, att.hkv) if merges else 1
            shader = _attention_shader(att.ragged, split=True, merges=merges, dim=att.dim, apart=b.merge_apart, qg=qg)
            grid = lambda s: (att.hq // qg, s, att.splits)  # noqa: E731
        shader = type_aliases(b.graph.values, QT=att.q, KCT=att.k_cache, VCT=att.v_cache, OT=att.scratch, RT=b.out) + shader
        bindings = [att.q, att.k_cache, att.v_cache, att.scratch, att.params, *att.tables]
        if merges and b.merge_apart:  # the same kernel again, one split a row: it merges
            split, merge = (b.dispatch(shader, [*bindings, b.out]) for _ in range(2))
            return _Launch((split, grid), (merge, lambda s: (att.hq // qg, s, 1) if att.splits > 1 else (0, 0, 0)))
        if merges:
            return _Launch((b.dispatch(shader, [*bindings, b.out, b.arrival_counts(att.rows * att.hq)]), grid))
        split = b.dispatch(shader, bindings)
        combine = b.dispatch(type_aliases(b.graph.values, RT=b.out) + COMBINE, [att.scratch, b.out, att.params])
        return _Launch((split, grid), (combine, lambda s: (att.hq, s, 1)))

    return build


def _whole_route(b, att):
    shader, rows_per_group = _whole_range(att.ragged, att.dim)
    shader = type_aliases(b.graph.values, QT=att.q, KCT=att.k_cache, VCT=att.v_cache, OT=b.out) + shader
    whole = b.dispatch(shader, [att.q, att.k_cache, att.v_cache, b.out, att.params, *att.tables])
    return _Launch((whole, lambda s: (att.hq, -(-s // rows_per_group), 1)))


# The variants of attention by live query rows s, first match wins (kernels/variants.py).
ATTENTION_VARIANTS = (
    Variant("decode_split", GPU_ONLY, lambda r: r.n <= r.split_max, _split_route(cpu=False)),
    Variant("decode_split_cpu", CPU_ONLY, lambda r: r.n <= r.split_max, _split_route(cpu=True)),
    Variant("whole", ANY, lambda s: True, _whole_route),
)


@dataclass
class _Attention:
    """What the variants' builds need of one op."""

    q: int
    k_cache: int
    v_cache: int
    scratch: int
    params: object
    tables: tuple
    hq: int
    hkv: int
    dim: int
    splits: int
    rows: int  # the most query rows split-K takes

    @property
    def ragged(self):
        return bool(self.tables)

    @property
    def common(self):
        return _row_exprs(self.ragged)


def _tables(ragged):
    """The bindings of the ragged tables and `key_row`, or a plain cache's `key_row`."""
    return RAGGED_TABLES + key_row() if ragged else PLAIN_KEYS


def _row_exprs(ragged):
    """The per-row WGSL pieces of the one-row-per-(workgroup y) kernels: tables, key count, sequence."""
    return dict(
        TABLES=_tables(ragged),
        KEYS="u32(row_pos[s]) + 1u" if ragged else "p.pos + s + 1u",
        SEQ="u32(max(row_seq[s], 0))" if ragged else "0u",  # padding rows: sequence 0
    )


def _add_attention(b, context, hkv, dim, hq, scale, tables=(), split_max=SPLIT_MAX_ROWS):
    """Record the attention variants (one pass, query-tiled where the head dim allows; split-K and
    its combine for up to `split_max` rows); returns `set_attention(ctx, s, pos, blocks)` for the
    hook (`blocks`: the entries of a sequence's block table, ragged)."""
    splits = min(MAX_SPLITS, context)
    span = -(-context // splits)
    scratch = b.scratch("float32", split_max * hq * splits * (dim + 2))  # the splits' partial states
    params = b.params(48)
    att = _Attention(b.args[0], b.args[3], b.args[4], scratch, params, tuple(tables), hq, hkv, dim, splits, split_max)
    routes = Routes(ATTENTION_VARIANTS, b, att)

    def set_attention(ctx, s, pos, blocks):
        ctx.set_params(params, struct.pack("<5If5I", s, pos, hq, hkv, dim, scale, blocks, splits, span, 0, 0))
        routes.set(ctx, Rows(s, split_max))

    return set_attention


@op("sdpa_with_kv_cache.default", half=True)
def sdpa_with_kv_cache(b):
    q, k, v, k_cache, v_cache, input_pos = b.args[:6]
    context, hkv, dim, hq, scale = _attention_args(b)
    p_update = b.params(16)
    shader = type_aliases(b.graph.values, KT=k, VT=v, KCT=k_cache, VCT=v_cache) + UPDATE_CACHE
    d_update = b.dispatch(shader, [k, v, k_cache, v_cache, p_update])
    set_attention = _add_attention(b, context, hkv, dim, hq, scale)

    def resize(ctx):
        s = _rows(b, ctx)
        pos = ctx.int_value(input_pos)
        if pos < 0 or pos + s > context:
            raise ValueError(
                f"sdpa_with_kv_cache: positions {pos}..{pos + s - 1} do not fit the KV cache of {context} positions"
            )
        n = numel_of(ctx.dims(k))
        ctx.set_params(p_update, struct.pack("<4I", n, pos * hkv * dim, 0, 0))
        ctx.set_grid(d_update, flat_grid(n))
        set_attention(ctx, s, pos, 0)
        ctx.set_dims(b.out, ctx.dims(q))

    b.hook(resize)


@op("pte_wgpu.ragged_sdpa", "pte_wgpu.ragged_sdpa_cached", half=True)
def ragged_sdpa(b):
    """`sdpa_with_kv_cache` over a ragged batch: args 5 and 6 are the row_pos and row_seq tables,
    the one before the output the sequences' block tables, and the caches are pools of blocks (the
    runtime checks positions and takes the blocks before a pass). `pte_wgpu.ragged_sdpa_cached`
    finds k and v already in the caches (pte_wgpu.rope_into_cache)."""
    q, k, v, k_cache, v_cache, row_pos, row_seq = b.args[:7]
    seq_blocks = b.args[-2]
    context, hkv, dim, hq, scale = _attention_args(b)
    blocks = table_entries(context)
    cached = b.name == "pte_wgpu.ragged_sdpa_cached"
    if not cached:
        p_update = b.params(16)
        shader = type_aliases(b.graph.values, KT=k, VT=v, KCT=k_cache, VCT=v_cache) + RAGGED_UPDATE_CACHE
        d_update = b.dispatch(shader, [k, v, k_cache, v_cache, p_update, row_pos, row_seq, seq_blocks])
    split_max = RAGGED_SPLIT_MAX_ROWS if b.adapter == GPU else SPLIT_MAX_ROWS
    set_attention = _add_attention(b, context, hkv, dim, hq, scale, (row_pos, row_seq, seq_blocks), split_max)

    def resize(ctx):
        s = _rows(b, ctx)
        if ctx.dims(row_pos)[0] != s:
            b.fail(f"{s} rows but {ctx.dims(row_pos)[0]} row positions")
        if not cached:
            n = numel_of(ctx.dims(k))
            ctx.set_params(p_update, struct.pack("<4I", n, hkv * dim, blocks, 0))
            ctx.set_grid(d_update, flat_grid(n))
        set_attention(ctx, s, 0, blocks)
        ctx.set_dims(b.out, ctx.dims(q))

    b.hook(resize)
