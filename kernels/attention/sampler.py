"""Greedy sampling on the GPU, between the passes of a decode burst (async_runtime/greedy.py).

Not an operator of any graph: the runtime dispatches it after each ragged decode pass. The
workgroups of a sequence take the argmax of its logits row (the first index of the largest value,
as numpy's argmax, so the ids are those a host loop picks; NaN logits are passed over), write the
id into the token table at the sequence's row as the next pass's input, advance that row's
position by one, and record the id for the host to read back once per burst. Its user prepends the alias LT naming the
logits' storage type, f32 or f16 (kernels/wgsl.py type_aliases).
"""

from ..wgsl import fill

GREEDY_WG = 256

GREEDY_SLICE = 2048  # logits a workgroup scans (8 an invocation): a SmolLM2 row takes 24 workgroups


def greedy_advance(slice_=GREEDY_SLICE):
    """The sampler's WGSL: workgroup (x, y) takes slice x of `slice_` logits of sequence y. On an
    H100 one workgroup a row took 64 us of each decode pass (49,152 logits). Each slice's best
    (value, index) goes to `parts`; the last of a row's workgroups to arrive (an atomic count, as
    split-K attention's merge) takes the best of the parts, writes the id and sets the count back
    to 0. `better` is a total order, so the id is the same whatever the order of the reduction."""
    return fill(
        """
struct P { seqs: u32, vocab: u32, stride: u32, step: u32 }
@group(0) @binding(0) var<storage, read> logits: array<LT>;  // LT: the logits' storage type (f32, f16)
@group(0) @binding(1) var<storage, read> seq_last: array<i32>;
@group(0) @binding(2) var<storage, read_write> tokens: array<i32>;
@group(0) @binding(3) var<storage, read_write> row_pos: array<i32>;
@group(0) @binding(4) var<storage, read_write> ids: array<i32>;
@group(0) @binding(5) var<uniform> p: P;
@group(0) @binding(6) var<storage, read_write> parts: array<vec2<u32>>;  // (value bits, index) a slice
@group(0) @binding(7) var<storage, read_write> arrivals: array<atomic<u32>>;  // a sequence's, 0 between dispatches

var<workgroup> top_value: array<f32, $GREEDY_WG>;
var<workgroup> top_index: array<u32, $GREEDY_WG>;
var<workgroup> arrived_last: u32;

// (value, index) pairs: the larger value wins, a tie goes to the smaller index.
fn better(v: f32, i: u32, w: f32, j: u32) -> bool { return v > w || (v == w && i < j); }

// The best of every invocation's (v, i), left in top_value[0], top_index[0].
fn best_of_workgroup(lane: u32, v: f32, i: u32) {
    top_value[lane] = v;
    top_index[lane] = i;
    workgroupBarrier();
    for (var half = ${HALF}u; half > 0u; half = half / 2u) {
        if (lane < half && better(top_value[lane + half], top_index[lane + half], top_value[lane], top_index[lane])) {
            top_value[lane] = top_value[lane + half];
            top_index[lane] = top_index[lane + half];
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size($GREEDY_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let b = wg.y;
    if (b >= p.seqs) { return; }  // the load's warm-up dispatch: no sequence
    let base = b * p.stride;
    let end = min(p.vocab, (wg.x + 1u) * ${SLICE}u);
    var v = bitcast<f32>(0xff800000u);  // -inf
    var i = 0xffffffffu;
    for (var k = wg.x * ${SLICE}u + lane; k < end; k = k + ${GREEDY_WG}u) {
        let x = f32(logits[base + k]);  // exact: f16 values keep their order in f32
        if (better(x, k, v, i)) { v = x; i = k; }
    }
    best_of_workgroup(lane, v, i);
    if (nwg.x > 1u) {
        if (lane == 0u) { parts[b * nwg.x + wg.x] = vec2<u32>(bitcast<u32>(top_value[0]), top_index[0]); }
        storageBarrier();
        if (lane == 0u) { arrived_last = u32(atomicAdd(&arrivals[b], 1u) == nwg.x - 1u); }
        if (workgroupUniformLoad(&arrived_last) == 0u) { return; }
        storageBarrier();
        v = bitcast<f32>(0xff800000u);
        i = 0xffffffffu;
        for (var s = lane; s < nwg.x; s = s + ${GREEDY_WG}u) {
            let part = parts[b * nwg.x + s];
            if (better(bitcast<f32>(part.x), part.y, v, i)) { v = bitcast<f32>(part.x); i = part.y; }
        }
        workgroupBarrier();
        best_of_workgroup(lane, v, i);
    }
    if (lane == 0u) {
        let id = i32(top_index[0]);
        let row = u32(seq_last[b]);
        tokens[row] = id;
        row_pos[row] = row_pos[row] + 1;
        ids[p.step * p.seqs + b] = id;
        atomicStore(&arrivals[b], 0u);
    }
}
""",
        GREEDY_WG=GREEDY_WG,
        HALF=GREEDY_WG // 2,
        SLICE=slice_,
    )
