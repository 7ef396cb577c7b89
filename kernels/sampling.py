"""Greedy sampling on the GPU, between the passes of a decode burst (async_runtime/greedy.py).

Not an operator of any graph: the runtime dispatches it after each ragged decode pass. One
workgroup per sequence takes the argmax of its logits row (the first index of the largest value,
as numpy's argmax, so the ids are those a host loop picks; NaN logits are passed over), writes the id into the token table
at the sequence's row as the next pass's input, advances that row's position by one, and records
the id for the host to read back once per burst. Its user prepends the alias LT naming the
logits' storage type, f32 or f16 (kernels/wgsl.py type_aliases).
"""

GREEDY_WG = 256

GREEDY_ADVANCE = f"""
struct P {{ seqs: u32, vocab: u32, stride: u32, step: u32 }}
@group(0) @binding(0) var<storage, read> logits: array<LT>;  // LT: the logits' storage type (f32, f16)
@group(0) @binding(1) var<storage, read> seq_last: array<i32>;
@group(0) @binding(2) var<storage, read_write> tokens: array<i32>;
@group(0) @binding(3) var<storage, read_write> row_pos: array<i32>;
@group(0) @binding(4) var<storage, read_write> ids: array<i32>;
@group(0) @binding(5) var<uniform> p: P;

var<workgroup> top_value: array<f32, {GREEDY_WG}>;
var<workgroup> top_index: array<u32, {GREEDY_WG}>;

// (value, index) pairs: the larger value wins, a tie goes to the smaller index.
fn better(v: f32, i: u32, w: f32, j: u32) -> bool {{ return v > w || (v == w && i < j); }}

@compute @workgroup_size({GREEDY_WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {{
    let b = wg.x;
    if (b >= p.seqs) {{ return; }}  // the load's warm-up dispatch: no sequence
    let base = b * p.stride;
    var v = bitcast<f32>(0xff800000u);  // -inf
    var i = 0xffffffffu;
    for (var k = lane; k < p.vocab; k = k + {GREEDY_WG}u) {{
        let x = f32(logits[base + k]);  // exact: f16 values keep their order in f32
        if (better(x, k, v, i)) {{ v = x; i = k; }}
    }}
    top_value[lane] = v;
    top_index[lane] = i;
    workgroupBarrier();
    for (var half = {GREEDY_WG // 2}u; half > 0u; half = half / 2u) {{
        if (lane < half && better(top_value[lane + half], top_index[lane + half], top_value[lane], top_index[lane])) {{
            top_value[lane] = top_value[lane + half];
            top_index[lane] = top_index[lane + half];
        }}
        workgroupBarrier();
    }}
    if (lane == 0u) {{
        let id = i32(top_index[0]);
        let row = u32(seq_last[b]);
        tokens[row] = id;
        row_pos[row] = row_pos[row] + 1;
        ids[p.step * p.seqs + b] = id;
    }}
}}
"""
