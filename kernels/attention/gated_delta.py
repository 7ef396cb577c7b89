"""`gated_delta_rule` (ExecuTorch's `llama::gated_delta_rule`, the recurrence of Qwen3.5's
linear-attention layers): for each batch and head, a state S [Dk, Dv] from `initial_state`; per
token t in order, S = S * decay_t; delta = (v_t - k_t S) * beta_t; S = S + k_t (x) delta; the
output row o_t = q_t S. Returns (the outputs [B, H, T, Dv], the final state [B, H, Dk, Dv]).

Each column j of S is updated from itself alone, so one invocation a (batch, head, column) keeps
its column in registers and runs the tokens in order; `decay` is a scalar a (head, token)
[B, H, T] or a value a key dim [B, H, T, Dk].
"""

import struct

from ..registry import op
from ..wgsl import fill, flat_grid, flat_kernel

SHADER = flat_kernel(
    "n: u32, t: u32, pad0: u32, pad1: u32",
    [("q", "f32", "read"), ("k", "f32", "read"), ("v", "f32", "read"), ("decay", "f32", "read"), ("beta", "f32", "read"),
     ("s0", "f32", "read"), ("o", "f32", "read_write"), ("s1", "f32", "read_write")],
    """
    let j = i % ${DV}u;
    let head = i / ${DV}u;
    var s: array<f32, $DK>;
    for (var a = 0u; a < ${DK}u; a = a + 1u) { s[a] = s0[(head * ${DK}u + a) * ${DV}u + j]; }
    for (var t = 0u; t < p.t; t = t + 1u) {
        let row = head * p.t + t;
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
    for (var a = 0u; a < ${DK}u; a = a + 1u) { s1[(head * ${DK}u + a) * ${DV}u + j] = s[a]; }
""",
)


@op("llama::gated_delta_rule.out")
def gated_delta_rule(b):
    query, key, value, decay, beta, initial = b.args[:6]
    b.float_storage(query, key, value, decay, beta, initial)
    out, state = b.outputs(2)
    dk, dv = b.tensor(5).dims[2:]
    channelwise = len(b.tensor(3).dims) == 4
    params = b.params(16)
    shader = fill(SHADER, DK=dk, DV=dv, DECAY=f"row * {dk}u + a" if channelwise else "row")
    d = b.dispatch(shader, [query, key, value, decay, beta, initial, out, state, params])

    def resize(ctx):
        q, k, v, g, bt, s = (ctx.dims(x) for x in (query, key, value, decay, beta, initial))
        lead, t = tuple(q[:2]), q[2] if len(q) == 4 else -1
        want = {"query": (q, (*lead, t, dk)), "key": (k, (*lead, t, dk)), "value": (v, (*lead, t, dv)), "beta": (bt, (*lead, t)),
                "decay": (g, (*lead, t, dk) if channelwise else (*lead, t)), "initial_state": (s, (*lead, dk, dv))}
        for name, (got, expected) in want.items():
            if tuple(got) != expected:
                b.fail(f"{name} of shape {list(got)}, expected {list(expected)} (query {list(q)}, state [B, H, {dk}, {dv}])")
        n = lead[0] * lead[1] * dv
        ctx.set_params(params, struct.pack("<4I", n, t, 0, 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(out, (*lead, t, dv))
        ctx.set_dims(state, (*lead, dk, dv))

    b.hook(resize)
