"""Token choice on the GPU, after a ragged decode pass (async_runtime/bursts.py).

Not an operator of any graph: the runtime dispatches these kernels after a pass. Each sequence b of
the pass has a row of settings (`Row`): greedy, or sampled with its own temperature, top-k, top-p,
min-p, seed, penalties and logit bias. The chosen id is written into the token table at the
sequence's last row as the next pass's input, that row's position advances by one, and the id is
recorded for the host to read back once per burst. Up to three kernels run, one dispatch each,
every workgroup (x, y) taking slice x of SAMPLER_SLICE logits of sequence y; the last workgroup of
a sequence to arrive (an atomic count) finishes its step, as split-K attention's merge does, or,
`merge_apart` (where storage barriers order only a workgroup's own accesses: async_runtime/backend.py),
a second dispatch of the kernel, one workgroup a sequence:

- `pick`: the logits adjusted by the row's logit bias and penalties (from its slot's token counts)
  and divided by its temperature, kept for the kernels after it; their maximum and argmax. A
  greedy row's id is that argmax (the first index of the largest value, as numpy's argmax, NaN
  passed over): the ids of a host loop of `logits.argmax()`.
- `select` (once per radix round: four for top-k, four for top-p, as many dispatches as the
  pass's rows need): the exact cut, without sorting. Each logit has an order-preserving 32-bit
  key; a round counts, in 256 bins of the next 8 bits, the keys that share the bits found so far,
  with their probability mass (fixed point, 2^31 for the largest logit, summed in 64-bit integers
  so the result does not depend on the order of the sums), and picks the bin where the count from
  the top reaches top_k, or the mass top_p of the kept mass. After four rounds the key of the cut
  is known exactly; a tie with it is kept. Top-p is a fraction of what top-k kept (vLLM's and
  Hugging Face's order).
- `draw`: the mass of the kept logits (the cuts, and min-p: probability at least min_p times the
  largest), a uniform number from Philox-4x32-10 keyed by the row's seed with the new token's
  position as counter, and the id where the kept mass in vocabulary order passes it.

A sequence's ids depend only on its own logits, settings and position, so a seeded request gets
the same tokens alone or in any batch whose logits are those it gets alone. Its user prepends the
alias LT naming the logits' storage type, f32 or f16 (kernels/wgsl.py type_aliases).
"""

from ..wgsl import fill

SAMPLER_WG = 256
SAMPLER_SLICE = 2048  # logits a workgroup takes (8 an invocation): a SmolLM2 row takes 24 workgroups
RADIX_ROUNDS = 4  # 8 bits a round of a 32-bit key


def sampler_slices(vocab):
    """The workgroups a sequence's `vocab` logits take in every kernel."""
    return -(-vocab // SAMPLER_SLICE)

BURST_MAX = 32  # ids a sequence records at most between two readbacks

# Row.flags
PICKS = 1  # the sequence picks a token in this pass
ADJUSTS = 2  # its logits take bias and penalties from its slot's rows
ROW_WORDS = 12  # u32 words of a Row
STATE_WORDS = 12  # u32 words of a State

COMMON = """
struct P { seqs: u32, vocab: u32, stride: u32, slices: u32 }
struct Row {
    temperature: f32,  // 0: greedy
    top_k: u32,  // 0: every token
    top_p: f32,
    min_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    presence: f32,
    frequency: f32,
    repetition: f32,
    flags: u32,
    slot: u32,  // the session's slot: its rows of token counts and logit bias
    rounds: u32,  // radix rounds of its cuts: 0, 4 (top-k or top-p) or 8 (both)
}
struct State {
    top: f32,  // the largest adjusted logit
    top_index: u32,
    round: u32,
    prefix: u32,  // the key bits found so far
    above_count: u32,  // keys above the prefix's range
    above_lo: u32,
    above_hi: u32,
    cut: u32,  // the key of the cut: keys at or above it are kept
    base_lo: u32,  // the mass top-p is a fraction of (top-k's, or 0: the whole row's)
    base_hi: u32,
    pad0: u32,
    pad1: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> rows: array<Row>;
@group(0) @binding(2) var<storage, read_write> state: array<State>;
@group(0) @binding(3) var<storage, read_write> arrivals: array<atomic<u32>>;  // a sequence's, 0 between dispatches
@group(0) @binding(4) var<storage, read_write> z: array<f32>;  // adjusted logits, [seqs, vocab]

fn neg_inf() -> f32 { let bits = 0xff800000u; return bitcast<f32>(bits); }  // a let: WGSL refuses an infinite constant
$ARRIVAL

// An order-preserving key of a float: a larger float, a larger key.
fn order_key(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    return select(bits ^ 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

// A logit's probability mass relative to the largest, in fixed point (2^31 for the largest).
fn mass(x: f32, top: f32) -> u32 {
    if (x == neg_inf()) { return 0u; }
    return u32(exp(x - top) * 2147483648.0 + 0.5);
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {  // (lo, hi)
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn as_float(a: vec2<u32>) -> f32 { return f32(a.y) * 4294967296.0 + f32(a.x); }

fn less64(a: vec2<u32>, b: vec2<u32>) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
"""

FINISH = """
@group(0) @binding(5) var<storage, read> seq_last: array<i32>;
@group(0) @binding(6) var<storage, read_write> tokens: array<i32>;
@group(0) @binding(7) var<storage, read_write> row_pos: array<i32>;
@group(0) @binding(8) var<storage, read_write> ids: array<i32>;  // [seqs, BURST_MAX]
@group(0) @binding(9) var<storage, read_write> picked: array<u32>;  // ids a sequence recorded since the readback
@group(0) @binding(10) var<storage, read_write> counts: array<u32>;  // [slots, vocab]: generated count, bit 31 in the prompt

// Sequence b chose `id`: the next pass's input at its last row, the position after, the record.
fn finish(b: u32, id: u32) {
    let row = u32(seq_last[b]);
    tokens[row] = i32(id);
    row_pos[row] = row_pos[row] + 1;
    ids[b * ${BURST_MAX}u + picked[b]] = i32(id);
    picked[b] = picked[b] + 1u;
    let r = rows[b];
    if ((r.flags & ${ADJUSTS}u) != 0u) {
        let at = r.slot * p.vocab + id;
        counts[at] = counts[at] + 1u;
    }
}
"""

PICK = """
@group(0) @binding(11) var<storage, read> logits: array<LT>;  // LT: the logits' storage type (f32, f16)
@group(0) @binding(12) var<storage, read> bias: array<f32>;  // [slots, vocab]
@group(0) @binding(13) var<storage, read_write> parts: array<vec2<u32>>;  // (value bits, index) a slice

var<workgroup> top_value: array<f32, $WG>;
var<workgroup> top_index: array<u32, $WG>;

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

// Logit bias, then the repetition penalty (tokens of the prompt or generated: a positive logit
// divided by it, a negative one multiplied), then the frequency and presence penalties.
fn adjusted(x: f32, k: u32, r: Row) -> f32 {
    let at = r.slot * p.vocab + k;
    var v = x + bias[at];
    let c = counts[at];
    let n = c & 0x7fffffffu;
    if (c != 0u) { v = select(v * r.repetition, v / r.repetition, v > 0.0); }
    return v - r.frequency * f32(n) - select(0.0, r.presence, n > 0u);
}

@compute @workgroup_size($WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let b = wg.y;
    if (b >= p.seqs) { return; }  // the load's warm-up dispatch: no sequence
    let r = rows[b];
    if ((r.flags & ${PICKS}u) == 0u) { return; }
    let base = b * p.stride;
    let sampled = r.temperature > 0.0;
    let end = min(p.vocab, (wg.x + 1u) * ${SLICE}u);
    var v = neg_inf();
    var i = 0xffffffffu;
    for (var k = wg.x * ${SLICE}u + lane; k < end; k = k + ${WG}u) {
        var x = f32(logits[base + k]);  // exact: f16 values keep their order in f32
        if ((r.flags & ${ADJUSTS}u) != 0u) { x = adjusted(x, k, r); }
        if (sampled) {
            x = x / r.temperature;
            z[b * p.vocab + k] = select(x, neg_inf(), is_nan(x));  // NaN: never drawn
        }
        if (better(x, k, v, i)) { v = x; i = k; }
    }
    best_of_workgroup(lane, v, i);
    if (p.slices > 1u) {
        if (lane == 0u) { parts[b * p.slices + wg.x] = vec2<u32>(bitcast<u32>(top_value[0]), top_index[0]); }
        if (!last_to_arrive(lane, b, groups)) { return; }
        v = neg_inf();
        i = 0xffffffffu;
        for (var s = lane; s < p.slices; s = s + ${WG}u) {
            let part = parts[b * p.slices + s];
            if (better(bitcast<f32>(part.x), part.y, v, i)) { v = bitcast<f32>(part.x); i = part.y; }
        }
        workgroupBarrier();
        best_of_workgroup(lane, v, i);
    }
    if (lane == 0u) {
        atomicStore(&arrivals[b], 0u);
        if (!sampled) {
            finish(b, top_index[0]);
            return;
        }
        var s: State;
        s.top = top_value[0];
        s.top_index = top_index[0];
        state[b] = s;  // round 0, no bits found, nothing above, cut 0: every key kept
    }
}
"""

SELECT = """
@group(0) @binding(11) var<storage, read_write> histograms: array<vec3<u32>>;  // (count, mass lo, mass hi) [seqs, slices, 256], 16 bytes each

var<workgroup> bin_count: array<atomic<u32>, 256>;
var<workgroup> bin_lo: array<atomic<u32>, 256>;
var<workgroup> bin_hi: array<atomic<u32>, 256>;
var<workgroup> sum_count: array<u32, 256>;
var<workgroup> sum_mass: array<vec2<u32>, 256>;
var<workgroup> round_now: u32;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let b = wg.y;
    if (b >= p.seqs) { return; }
    let r = rows[b];
    let s = state[b];
    // the round through workgroup memory: WGSL counts a read_write load as non-uniform, and a
    // return that depends on it would put the barriers after it in non-uniform control flow
    if (lane == 0u) { round_now = s.round; }
    let round = workgroupUniformLoad(&round_now);
    if ((r.flags & ${PICKS}u) == 0u || r.temperature <= 0.0 || round >= r.rounds) { return; }
    let by_count = s.round < ${ROUNDS}u && r.top_k != 0u && r.top_k < p.vocab;  // else top-p's rounds
    let digit_round = s.round % ${ROUNDS}u;
    let shift = 24u - 8u * digit_round;
    let high = select(0xffffffffu << (32u - 8u * digit_round), 0u, digit_round == 0u);
    atomicStore(&bin_count[lane], 0u);
    atomicStore(&bin_lo[lane], 0u);
    atomicStore(&bin_hi[lane], 0u);
    workgroupBarrier();
    let end = min(p.vocab, (wg.x + 1u) * ${SLICE}u);
    for (var k = wg.x * ${SLICE}u + lane; k < end; k = k + 256u) {
        let x = z[b * p.vocab + k];
        let key = order_key(x);
        if ((key & high) == s.prefix) {
            let d = (key >> shift) & 255u;
            atomicAdd(&bin_count[d], 1u);
            let m = mass(x, s.top);
            if (atomicAdd(&bin_lo[d], m) + m < m) { atomicAdd(&bin_hi[d], 1u); }  // the carry
        }
    }
    workgroupBarrier();
    let h = (b * p.slices + wg.x) * 256u + lane;
    histograms[h] = vec3<u32>(atomicLoad(&bin_count[lane]), atomicLoad(&bin_lo[lane]), atomicLoad(&bin_hi[lane]));
    if (!last_to_arrive(lane, b, groups)) { return; }
    // bin `lane` over every slice, then suffix sums: sum_*[j] = the bins j..255
    var c = 0u;
    var m = vec2<u32>(0u, 0u);
    for (var t = 0u; t < p.slices; t = t + 1u) {
        let part = histograms[(b * p.slices + t) * 256u + lane];
        c = c + part.x;
        m = add64(m, part.yz);
    }
    sum_count[lane] = c;
    sum_mass[lane] = m;
    workgroupBarrier();
    for (var offset = 1u; offset < 256u; offset = offset * 2u) {
        if (lane + offset < 256u) {
            c = c + sum_count[lane + offset];
            m = add64(m, sum_mass[lane + offset]);
        }
        workgroupBarrier();
        sum_count[lane] = c;
        sum_mass[lane] = m;
        workgroupBarrier();
    }
    let above_mass = vec2<u32>(s.above_lo, s.above_hi);
    var goal = f32(r.top_k);
    var next = s;
    if (!by_count) {  // top-p of what top-k kept, or of the whole row (its first round's bins hold it all)
        if (s.base_lo == 0u && s.base_hi == 0u) {
            next.base_lo = sum_mass[0].x;
            next.base_hi = sum_mass[0].y;
        }
        goal = r.top_p * as_float(vec2<u32>(next.base_lo, next.base_hi));
    }
    let here = select(as_float(add64(above_mass, m)), f32(s.above_count + c), by_count) >= goal;
    var after = false;  // whether bin lane + 1 reaches the goal too
    if (lane < 255u) {
        after = select(as_float(add64(above_mass, sum_mass[lane + 1u])), f32(s.above_count + sum_count[lane + 1u]), by_count) >= goal;
    }
    if (!((here && !after) || (lane == 0u && !here))) { return; }  // the bin of the cut (bin 0 if none reaches it)
    next.round = s.round + 1u;
    next.prefix = s.prefix | (lane << shift);
    if (lane < 255u) {
        next.above_count = s.above_count + sum_count[lane + 1u];
        let above = add64(above_mass, sum_mass[lane + 1u]);
        next.above_lo = above.x;
        next.above_hi = above.y;
    }
    if (digit_round == ${LAST_ROUND}u) {  // the key of the cut, exact
        next.cut = max(s.cut, next.prefix);
        if (by_count) {  // what top-k kept: top-p's base
            let kept = add64(above_mass, m);
            next.base_lo = kept.x;
            next.base_hi = kept.y;
        }
        next.prefix = 0u;
        next.above_count = 0u;
        next.above_lo = 0u;
        next.above_hi = 0u;
    }
    state[b] = next;
    atomicStore(&arrivals[b], 0u);
}
"""

DRAW = """
@group(0) @binding(11) var<storage, read_write> slice_mass: array<vec2<u32>>;  // [seqs, slices]

var<workgroup> lane_mass: array<vec2<u32>, $WG>;
var<workgroup> chosen_slice: u32;
var<workgroup> remainder: vec2<u32>;
var<workgroup> chosen_id: u32;

fn kept(x: f32, s: State, floor_: f32) -> bool { return order_key(x) >= s.cut && x >= floor_; }

// (hi, lo) of a * b
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = ((a0 * b0) >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>(a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u), a * b);
}

// Philox-4x32-10 (Salmon et al., Random123) of counter `c` under key `k`.
fn philox(c_in: vec4<u32>, k_in: vec2<u32>) -> vec4<u32> {
    var c = c_in;
    var k = k_in;
    for (var i = 0u; i < 10u; i = i + 1u) {
        let m0 = mul_wide(0xD2511F53u, c.x);
        let m1 = mul_wide(0xCD9E8D57u, c.z);
        c = vec4<u32>(m1.x ^ c.y ^ k.x, m1.y, m0.x ^ c.w ^ k.y, m0.y);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

// The kept mass of invocation `lane`'s 8 logits of slice `slice`, in vocabulary order.
fn lane_sum(b: u32, slice: u32, lane: u32, s: State, floor_: f32) -> vec2<u32> {
    var sum = vec2<u32>(0u, 0u);
    let first = slice * ${SLICE}u + lane * 8u;
    for (var k = first; k < min(first + 8u, p.vocab); k = k + 1u) {
        let x = z[b * p.vocab + k];
        if (kept(x, s, floor_)) { sum = add64(sum, vec2<u32>(mass(x, s.top), 0u)); }
    }
    return sum;
}

// The sum of lane_mass over the workgroup, left in lane_mass[0].
fn sum_of_workgroup(lane: u32) {
    for (var half = ${HALF}u; half > 0u; half = half / 2u) {
        if (lane < half) { lane_mass[lane] = add64(lane_mass[lane], lane_mass[lane + half]); }
        workgroupBarrier();
    }
}

@compute @workgroup_size($WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let b = wg.y;
    if (b >= p.seqs) { return; }
    let r = rows[b];
    if ((r.flags & ${PICKS}u) == 0u || r.temperature <= 0.0) { return; }
    let s = state[b];
    let floor_ = select(neg_inf(), s.top + log(r.min_p), r.min_p > 0.0);
    lane_mass[lane] = lane_sum(b, wg.x, lane, s, floor_);
    workgroupBarrier();
    sum_of_workgroup(lane);
    if (lane == 0u) { slice_mass[b * p.slices + wg.x] = lane_mass[0]; }
    if (!last_to_arrive(lane, b, groups)) { return; }
    if (lane == 0u) {
        var total = vec2<u32>(0u, 0u);
        for (var t = 0u; t < p.slices; t = t + 1u) { total = add64(total, slice_mass[b * p.slices + t]); }
        let row = u32(seq_last[b]);
        let u = philox(vec4<u32>(u32(row_pos[row] + 1), 0u, 0u, 0u), vec2<u32>(r.seed_lo, r.seed_hi)).x;
        // floor(total * u / 2^32): below total
        let high = mul_wide(total.y, u);
        var goal = add64(vec2<u32>(high.y, high.x), vec2<u32>(mul_wide(total.x, u).x, 0u));
        chosen_slice = p.slices;
        for (var t = 0u; t < p.slices; t = t + 1u) {
            let part = slice_mass[b * p.slices + t];
            if (chosen_slice == p.slices) {
                if (less64(goal, part)) {
                    chosen_slice = t;
                    remainder = goal;
                } else {
                    goal = vec2<u32>(goal.x - part.x, goal.y - part.y - select(0u, 1u, goal.x < part.x));
                }
            }
        }
        chosen_id = s.top_index;  // nothing kept (every logit -inf or NaN): the argmax
    }
    let slice = workgroupUniformLoad(&chosen_slice);
    if (slice < p.slices) {
        let mine = lane_sum(b, slice, lane, s, floor_);
        lane_mass[lane] = mine;
        workgroupBarrier();
        // exclusive prefix of the lanes before this one, then the walk of the lane that holds it
        var before = vec2<u32>(0u, 0u);
        for (var t = 0u; t < lane; t = t + 1u) { before = add64(before, lane_mass[t]); }
        let want = remainder;
        let past = add64(before, mine);
        if (!less64(want, before) && less64(want, past)) {
            var at = before;
            let first = slice * ${SLICE}u + lane * 8u;
            for (var k = first; k < min(first + 8u, p.vocab); k = k + 1u) {
                let x = z[b * p.vocab + k];
                if (kept(x, s, floor_)) {
                    at = add64(at, vec2<u32>(mass(x, s.top), 0u));
                    if (less64(want, at)) {
                        chosen_id = k;
                        break;
                    }
                }
            }
        }
    }
    workgroupBarrier();
    if (lane == 0u) {
        atomicStore(&arrivals[b], 0u);
        finish(b, min(chosen_id, p.vocab - 1u));
    }
}
"""


# Whether this workgroup finishes sequence b's step, after its writes to storage: the last of the
# sequence's to arrive, or (merged apart) the one workgroup of the second dispatch.
LAST_TO_ARRIVE = """
var<workgroup> arrived_last: u32;

fn last_to_arrive(lane: u32, b: u32, groups: vec3<u32>) -> bool {
    if (p.slices == 1u) { return true; }
    storageBarrier();
    if (lane == 0u) { arrived_last = u32(atomicAdd(&arrivals[b], 1u) == p.slices - 1u); }
    if (workgroupUniformLoad(&arrived_last) == 0u) { return false; }
    storageBarrier();
    return true;
}
"""
MERGE_DISPATCH = """
fn last_to_arrive(lane: u32, b: u32, groups: vec3<u32>) -> bool {
    storageBarrier();  // this workgroup's own slice, written again, for its other invocations
    return groups.x == 1u;
}
"""


def _text(body, merge_apart, **values):
    return fill(COMMON + body, ARRIVAL=MERGE_DISPATCH if merge_apart else LAST_TO_ARRIVE, PICKS=PICKS, SLICE=SAMPLER_SLICE, **values)


def _finishing(body, merge_apart):
    """A kernel that finishes a sequence's step (FINISH): pick or draw."""
    return _text(FINISH + body, merge_apart, WG=SAMPLER_WG, HALF=SAMPLER_WG // 2, BURST_MAX=BURST_MAX, ADJUSTS=ADJUSTS)


def pick_kernel(merge_apart=False):
    """The first kernel: adjusted logits, their argmax, a greedy row's id."""
    return _finishing(PICK, merge_apart)


def select_kernel(merge_apart=False):
    """One radix round of the top-k and top-p cuts."""
    return _text(SELECT, merge_apart, ROUNDS=RADIX_ROUNDS, LAST_ROUND=RADIX_ROUNDS - 1)


def draw_kernel(merge_apart=False):
    """The draw of a sampled row's id from its kept logits."""
    return _finishing(DRAW, merge_apart)
