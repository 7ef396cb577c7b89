"""`gated_delta_rule` (ExecuTorch's `llama::gated_delta_rule`, the recurrence of Qwen3.5's
linear-attention layers): for each batch and head, a state S [Dk, Dv] from `initial_state`; per
token t in order, S = S * decay_t; delta = (v_t - k_t S) * beta_t; S = S + k_t (x) delta; the
output row o_t = q_t S. Returns (the outputs [B, H, T, Dv], the final state [B, H, Dk, Dv]).

Each column j of S is updated from itself alone, so one invocation a (batch, head, column) keeps
its column in registers and runs the tokens in order; `decay` is a scalar a (head, token)
[B, H, T] or a value a key dim [B, H, T, Dk].

In a ragged pass (async_runtime.ragged) the rows of several sequences run as one: each sequence's
state is a slot of a pool [slots, H, Dk, Dv], and `pte_wgpu.ragged_gated_delta` runs each
sequence's rows from its slot and leaves the final state there. Read from the pool's read_write
binding, the recurrence ran 1.85x its time from a read-only one on an H200 (a prompt of 512 rows,
16 heads of 128 x 128: 1.61 against 0.87 ms, the shaders otherwise the same): where the pass's
sequences have two rows or more on average (prompts), their states are first copied out of the
pool (`GATHER`, about 0.4 us a sequence for such a head's state) and read from that copy;
decode passes read the pool.
"""

import struct

from ..registry import op
from ..wgsl import fill, flat_grid, flat_kernel
from .short_conv import SEQUENCE

# Rows first .. end - 1 of head `head` ([H, rows, D] tensors, `p.rows` rows), from the state column
# at `in_at` of `state_in` to the one at `out_at` of `state_out`.
RECURRENCE = """
    var s: array<f32, $DK>;
    for (var a = 0u; a < ${DK}u; a = a + 1u) { s[a] = $STATE_IN[in_at + a * ${DV}u]; }
    for (var t = first; t < end; t = t + 1u) {
        let row = head * p.rows + t;
        var kv = 0.0;
        for (var a = 0u; a < ${DK}u; a = a + 1u) {
            s[a] = s[a] * decay[$DECAY];
            kv = kv + s[a] * k[row * ${DK}u + a];
        }
        let delta = (v[row * ${DV}u + j] - kv) * beta[row];
        var out = 0.0;
        for (var a = 0u; a < ${DK}u; a = a + 1u) {
            s[a] = s[a] + k[row * ${DK}u + a] * delta;
            out = out + s[a] * q[row * ${DK}u + a];
        }
        o[row * ${DV}u + j] = out;
    }
    for (var a = 0u; a < ${DK}u; a = a + 1u) { $STATE_OUT[out_at + a * ${DV}u] = s[a]; }
"""
INPUTS = [("q", "f32", "read"), ("k", "f32", "read"), ("v", "f32", "read"), ("decay", "f32", "read"), ("beta", "f32", "read")]
SHADER = flat_kernel(
    "n: u32, rows: u32, pad0: u32, pad1: u32",
    [*INPUTS, ("s0", "f32", "read"), ("o", "f32", "read_write"), ("s1", "f32", "read_write")],
    """
    let j = i % ${DV}u;
    let head = i / ${DV}u;
    let in_at = head * ${DK}u * ${DV}u + j;
    let out_at = in_at;
    let first = 0u;
    let end = p.rows;""" + RECURRENCE,
)


def ragged_shader(gathered):
    """The ragged rule reading each sequence's state from its slot of the pool, or (`gathered`) from
    `first_state` [seqs, H, Dk, Dv], GATHER's copy of them."""
    copy = [("first_state", "f32", "read")] if gathered else []
    return flat_kernel(
        "n: u32, rows: u32, heads: u32, pad0: u32",
        [*INPUTS, ("seq_last", "i32", "read"), ("seq_slots", "i32", "read"), *copy, ("o", "f32", "read_write"), ("pool", "f32", "read_write")],
        """
    let j = i % ${DV}u;
    let head = (i / ${DV}u) % p.heads;
    let b = i / (${DV}u * p.heads);
    if (seq_slots[b] < 0) { return; }  // a padding sequence""" + SEQUENCE + """
    let end = u32(seq_last[b] + 1);
    let out_at = (u32(seq_slots[b]) * p.heads + head) * ${DK}u * ${DV}u + j;
    let in_at = """ + ("(b * p.heads + head) * ${DK}u * ${DV}u + j;" if gathered else "out_at;") + RECURRENCE,
    )


# each sequence's state, [seqs, state], from its slot of the pool
GATHER = flat_kernel(
    "n: u32, size: u32, pad0: u32, pad1: u32",
    [("seq_slots", "i32", "read"), ("pool", "f32", "read"), ("first_state", "f32", "read_write")],
    """
    let slot = seq_slots[i / p.size];
    if (slot >= 0) { first_state[i] = pool[u32(slot) * p.size + i % p.size]; }
""",
)


def rule_shader(shader, dk, dv, channelwise, state_in, state_out):
    return fill(shader, DK=dk, DV=dv, DECAY=f"row * {dk}u + a" if channelwise else "row", STATE_IN=state_in, STATE_OUT=state_out)


def _check(b, dims, lead, rows, dk, dv, channelwise):
    """Fail unless query, key, value, decay and beta (`dims`, in that order) are those of `rows`
    tokens of the heads `lead` ([B, H])."""
    want = [(*lead, rows, dk), (*lead, rows, dk), (*lead, rows, dv), (*lead, rows, dk) if channelwise else (*lead, rows), (*lead, rows)]
    for name, got, expected in zip(("query", "key", "value", "decay", "beta"), dims, want):
        if tuple(got) != expected:
            b.fail(f"{name} of shape {list(got)}, expected {list(expected)} (query {list(dims[0])}, state [{lead[0]}, {lead[1]}, {dk}, {dv}])")


@op("llama::gated_delta_rule.out")
def gated_delta_rule(b):
    query, key, value, decay, beta, initial = b.args[:6]
    b.float_storage(query, key, value, decay, beta, initial)
    out, state = b.outputs(2)
    dk, dv = b.tensor(5).dims[2:]
    channelwise = len(b.tensor(3).dims) == 4
    params = b.params(16)
    d = b.dispatch(rule_shader(SHADER, dk, dv, channelwise, "s0", "s1"), [query, key, value, decay, beta, initial, out, state, params])

    def resize(ctx):
        q, s = ctx.dims(query), ctx.dims(initial)
        lead, t = tuple(q[:2]), q[2] if len(q) == 4 else -1
        _check(b, [ctx.dims(x) for x in (query, key, value, decay, beta)], lead, t, dk, dv, channelwise)
        if tuple(s) != (*lead, dk, dv):
            b.fail(f"initial_state of shape {list(s)}, expected {[*lead, dk, dv]} (query {list(q)})")
        n = lead[0] * lead[1] * dv
        ctx.set_params(params, struct.pack("<4I", n, t, 0, 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(out, (*lead, t, dv))
        ctx.set_dims(state, (*lead, dk, dv))

    b.hook(resize)


@op("pte_wgpu.ragged_gated_delta")
def ragged_gated_delta(b):
    """[query, key, value, decay, beta, pool, seq_last, seq_slots, out]: the rule over each
    sequence's rows of the pass ([1, H, rows, D] tensors, decay and beta [1, H, rows(, Dk)]), each
    from its slot of `pool` ([slots, H, Dk, Dv] behind a state's [1, H, Dk, Dv]), the final states
    written back there (seq_slots -1: a padding sequence, left alone)."""
    query, key, value, decay, beta, pool, seq_last, seq_slots = b.args[:8]
    b.float_storage(query, key, value, decay, beta, pool, b.out)
    _, heads, dk, dv = b.tensor(5).dims
    size = heads * dk * dv  # a sequence's state
    channelwise = len(b.tensor(3).dims) == 4
    params, gather_params = b.params(16), b.params(16)
    b.writes(pool)
    first_state = b.scratch("float32", b.tensor(6).dims[0] * size)
    inputs = [query, key, value, decay, beta, seq_last, seq_slots]
    in_place = b.dispatch(rule_shader(ragged_shader(False), dk, dv, channelwise, "pool", "pool"), [*inputs, b.out, pool, params])
    gather = b.dispatch(GATHER, [seq_slots, pool, first_state, gather_params])
    gathered = b.dispatch(rule_shader(ragged_shader(True), dk, dv, channelwise, "first_state", "pool"), [*inputs, first_state, b.out, pool, params])

    def resize(ctx):
        q = ctx.dims(query)
        rows = q[2] if len(q) == 4 else -1
        _check(b, [ctx.dims(x) for x in (query, key, value, decay, beta)], (1, heads), rows, dk, dv, channelwise)
        seqs = ctx.dims(seq_last)[0]
        n, copy = seqs * heads * dv, rows >= 2 * seqs
        ctx.set_params(params, struct.pack("<4I", n, rows, heads, 0))
        ctx.set_params(gather_params, struct.pack("<4I", seqs * size, size, 0, 0))
        ctx.set_grid(gather, flat_grid(seqs * size) if copy else (0, 0, 0))
        ctx.set_grid(gathered, flat_grid(n) if copy else (0, 0, 0))
        ctx.set_grid(in_place, (0, 0, 0) if copy else flat_grid(n))
        ctx.set_dims(b.out, (1, heads, rows, dv))

    b.hook(resize)
