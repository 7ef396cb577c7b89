"""A short convolution's state in a ragged pass (LFM2's convolution layers, Qwen3.5's linear-attention
layers; async_runtime.ragged_states).

Exported for batch 1, such a layer joins its state (the last W inputs it saw, [1, C, W]) and the
step's inputs [1, C, S] along the token axis, runs a depthwise convolution without padding over
them (W + 1 taps: S outputs; or W taps, of whose S + 1 outputs the model keeps the last S), and
writes the last W columns back as the state. In a ragged pass the inputs
are the concatenated rows of several sequences, and each session's state is one slot of a pool:

- `pte_wgpu.ragged_short_conv`: each row's window is the W inputs before it within its own
  sequence, reaching into its session's slot where the sequence's rows in the pass begin;
- `pte_wgpu.ragged_state_update`: each sequence's slot takes its last W inputs (its old columns
  shifted where the pass gave it fewer rows).

A sequence's rows are those of `row_seq`, from the row after the previous sequence's last
(`seq_last`) to its own; `seq_slots` names each sequence's slot, -1 for a padding sequence. The
runtime starts a slot from the state's initial value when its sequence starts at position 0.
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import fill, flat_grid, flat_kernel, type_aliases

# The first row of sequence b in the pass.
SEQUENCE = """
    var first = 0u;
    if (b > 0u) { first = u32(seq_last[b - 1u] + 1); }"""


SHORT_CONV_BODY = f"""
    let c = i / p.rows;
    let r = i % p.rows;
    if (row_seq[r] < 0) {{ out[i] = OT(0.0); return; }}  // a padding row
    let b = u32(row_seq[r]);{SEQUENCE}
    let t = r - first;  // the row's place in its sequence's rows of the pass
    let slot = (u32(seq_slots[b]) * p.channels + c) * ${{WIDTH}}u;
    var acc = $BIAS;
    // tap j reads column w = t + width + 1 - taps + j of the row's window (the slot's W columns,
    // oldest first, then the sequence's rows of this pass): its last tap reads the row itself
    for (var j = 0u; j < ${{TAPS}}u; j++) {{
        let w = t + ${{WIDTH}}u + 1u - ${{TAPS}}u + j;
        var v: f32;
        if (w >= ${{WIDTH}}u) {{ v = f32(x[c * p.rows + first + w - ${{WIDTH}}u]); }} else {{ v = f32(state[slot + w]); }}
        acc += f32(weight[c * ${{TAPS}}u + j]) * v;
    }}
    out[i] = OT(acc);
"""


def short_conv_kernel(bias, width, taps):
    """The ragged short convolution's kernel over a state of `width` columns with `taps` taps (W or
    W + 1), adding `bias[c]` (an `array<BT>` binding after the weight) where it has one."""
    return fill(flat_kernel(
        "n: u32, rows: u32, channels: u32, pad0: u32",
        [("x", "XT", "read"), ("state", "ST", "read"), ("weight", "WT", "read"), *([("bias", "BT", "read")] if bias else []),
         ("row_seq", "i32", "read"), ("seq_last", "i32", "read"), ("seq_slots", "i32", "read"), ("out", "OT", "read_write")],
        SHORT_CONV_BODY,
    ), BIAS="f32(bias[c])" if bias else "0.0", WIDTH=width, TAPS=taps)


STATE_UPDATE = flat_kernel(
    "n: u32, rows: u32, channels: u32, width: u32",
    [("x", "XT", "read"), ("seq_last", "i32", "read"), ("seq_slots", "i32", "read"), ("state", "ST", "read_write")],
    f"""
    let b = i / p.channels;
    let c = i % p.channels;
    if (seq_slots[b] < 0) {{ return; }}  // a padding sequence{SEQUENCE}
    let count = u32(seq_last[b] + 1) - first;
    let slot = (u32(seq_slots[b]) * p.channels + c) * p.width;
    // column k takes input count + k - width of the sequence's rows; where that is before the
    // pass, the old column count + k, which lies past k: in ascending order it is read before
    // it is overwritten
    for (var k = 0u; k < p.width; k++) {{
        let u = count + k;
        if (u >= p.width) {{ state[slot + k] = ST(f32(x[c * p.rows + first + u - p.width])); }} else {{ state[slot + k] = state[slot + u]; }}
    }}
""",
)


def _short_conv_dims(b, x, state):
    """(channels, width) of a short convolution's inputs [1, C, rows] and state [1, C, W]."""
    xd, sd = b.graph.values[x].dims, b.graph.values[state].dims
    if len(xd) != 3 or len(sd) != 3 or xd[:2] != sd[:2] or xd[0] != 1:
        b.fail(f"inputs {list(xd)} and state {list(sd)}: expected [1, C, rows] and [1, C, W]")
    return sd[1], sd[2]


@op("pte_wgpu.ragged_short_conv", half=True)
def ragged_short_conv(b):
    """[x, state, weight, bias or None, row_seq, seq_last, seq_slots, out]: the depthwise
    convolution over each row's window within its sequence, one output a row: of W + 1 taps
    (weight [C, 1, W + 1]: LFM2's), or of W taps (Qwen3.5's, whose export keeps the last S of the
    S + 1 outputs over the state's W columns and the step's S rows)."""
    x, state, weight, bias, row_seq, seq_last, seq_slots = b.args[:7]
    channels, width = _short_conv_dims(b, x, state)
    taps = b.tensor(2).dims[-1]
    if tuple(b.tensor(2).dims) not in ((channels, 1, width + 1), (channels, 1, width)):
        b.fail(f"weight {list(b.tensor(2).dims)}: expected [{channels}, 1, {width + 1}] or [{channels}, 1, {width}]")
    biases = [] if b.is_none(3) else [bias]
    aliases = type_aliases(b.graph.values, XT=x, ST=state, WT=weight, OT=b.out, **{"BT": bias for bias in biases})
    params = b.params(16)
    d = b.dispatch(aliases + short_conv_kernel(biases, width, taps), [x, state, weight, *biases, row_seq, seq_last, seq_slots, b.out, params])

    def resize(ctx):
        dims = ctx.dims(x)
        n = numel_of(dims)
        ctx.set_params(params, struct.pack("<4I", n, dims[2], channels, 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, dims)

    b.hook(resize)


@op("pte_wgpu.ragged_state_update", half=True)
def ragged_state_update(b):
    """[x, seq_last, seq_slots, state]: each sequence's slot of the state pool takes its last W
    inputs of x [1, C, rows] (written in place: the state is the output)."""
    x, seq_last, seq_slots, state = b.args
    channels, width = _short_conv_dims(b, x, state)
    params = b.params(16)
    d = b.dispatch(type_aliases(b.graph.values, XT=x, ST=state) + STATE_UPDATE, [x, seq_last, seq_slots, state, params])

    def resize(ctx):
        n = ctx.dims(seq_last)[0] * channels
        ctx.set_params(params, struct.pack("<4I", n, ctx.dims(x)[2], channels, width))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(state, b.graph.values[state].dims)

    b.hook(resize)
