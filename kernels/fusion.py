"""Graph rewrites that merge ops into one kernel where that is cheap and exact.

A decode step of a small model is bound by the number of dispatches (each costs microseconds on
the GPU and on the host, whatever its size), so the rewrites below cut that number:

- First, a clone of an activation goes, its readers reading the activation: ExecuTorch's Vulkan
  lowering copies a tensor where its storage changes (buffer or texture, packed dim), and such a
  copy between two ops hid them from the patterns below (memory planning aliases the copies, so
  none ran).
- SiLU arrives decomposed (`aten.silu` is not in Vulkan's registry): s = sigmoid(a), g = a * s,
  y = g * b. When s and g feed nothing else, the three become one `pte_wgpu.silu_mul` dispatch at
  the place of the last multiply (b is often computed in between).
- SwiGLU: silu_mul of two bias-free linears of one input (gate and up) becomes
  `pte_wgpu.linear_silu_mul` (kernels/matmul/fused_linear.py).
- A bias-free linear whose result only feeds `residual + linear(x)` becomes
  `pte_wgpu.linear_residual`, the residual added in the linear's epilogue (an 8da4w one
  `pte_wgpu.q4_linear_dq8_residual`); one with a bias of its N outputs (ViT's, BERT's)
  `pte_wgpu.linear_bias_residual`, the residual added after the bias, to the linear's value
  rounded to its type, as the add read it: the same sums, but not bit for bit (on lavapipe 1-2
  units in the last place of some outputs: the compiler contracts the epilogue's two adds and the
  product otherwise than the two ops').
- A bias-free linear whose result only feeds an add of a vector of its N outputs (the output
  projection that the rewrite below makes of ViT's bmm, its bias added apart) takes that vector as
  its bias, where the result is stored f32 (the same f32 add).
- A linear (bias or not) whose result only feeds a GELU (through views of its shape: ViT's,
  BERT's and GPT-2's MLPs) becomes `pte_wgpu.linear_gelu`, the GELU in the linear's epilogue on
  the value the GELU would have read.
- Bias-free linears of one input (attention's q, k and v) become one `pte_wgpu.linear_group`.
- The same three over bias-free 4-bit linears (`et_vk.linear_q4gsw`) of one group size and K
  become `pte_wgpu.q4_linear_silu_mul`, `pte_wgpu.q4_linear_residual` and
  `pte_wgpu.q4_linear_group` (kernels/matmul/q4_fused_linear.py); float and 4-bit products never
  mix. Linears with biases of their outputs (Qwen2.5's q, k and v) group with their like,
  `pte_wgpu.linear_bias_group` and `pte_wgpu.q4_linear_bias_group`. A residual joins a linear only where the product and the sum
  are of one type (an f32 product added into an f16 sum stays apart: the epilogue rounds once).
- An RMS norm that only feeds one of those (through a view or not) is computed again inside
  their GEMV (`pte_wgpu.rms_linear_group`, `pte_wgpu.rms_linear_silu_mul`), and the norm op itself
  runs only when the rows are too many for the GEMV (`pte_wgpu.rms_norm_for_gemm`; before a
  4-bit one `pte_wgpu.rms_norm_for_q4`, which CPU adapters run at every row count).

- Two RMS norms one right after the other, of one eps and row length (Qwen3's of q's and k's
  heads), become one `pte_wgpu.rms_norm_pair` dispatch, each row normalized as alone.

After the ragged rewrite (async_runtime.ragged), `fuse_ragged` lets RoPE store this step's k and
v in the KV caches (`pte_wgpu.rope_into_cache`, the rotate-half RoPE's `pte_wgpu.rope_hf_into_cache`),
so attention skips its own cache update; where
q, k and v are one group (float or 4-bit, normalizing or not) that only the RoPE reads (v also
attention), the group takes the RoPE too (`pte_wgpu.linear_group_rope` and its forms,
kernels/matmul/qkv_rope.py: on GPUs its GEMV rotates and stores in its epilogue), unless that
kernel would bind more storage buffers than the device allows (Dawn's Vulkan adapters: 16). A
group whose products and rotated k nothing else reads (the ragged attention finds k and v in the
caches) takes a lean epilogue that binds and stores neither: 16 for a normalizing 4-bit group, 13
for a float one. The rotate-half RoPE (Qwen2.5's, Phi-4-mini's of part of each head) joins its
group as `..._rope_hf`, q's and k's weight rows (scales, biases) laid out at load with each head's
rotated dims d and d + rd / 2 side by side, so that its pairs meet in one invocation as the
interleaved RoPE's do.
The rotary tables' gathers the ragged rewrite made move up to where their inputs are ready, so
that the first layer's come before its group as every other layer's do. An RMS norm pair (Qwen3's
of q's and k's heads) that only a rotate-half RoPE reads joins it
(`pte_wgpu.rms_norm_pair_rope_hf_into_cache`, kernels/tensor/reduce.py).

- PyTorch's `_safe_softmax` (scaled_dot_product_attention's decomposition: ViT's, BERT's) arrives
  as softmax(x) and six ops over the scores that zero the rows of x that are -inf only (eq,
  logical_not, any, logical_not, full_like, where); they become one `pte_wgpu.safe_softmax`, the
  softmax kernel writing those rows' zeros itself.
- A batched product of an expanded, transposed weight, bmm(x, expand(permute(w))) (how torch's
  multi-head attention exports its output projection of a 3-D input: ViT's), becomes
  `aten.linear(x, w)`, which reads w in place where the copies wrote it once per batch every
  call (the same sums, but for how the GEMM splits K at the two shapes).

- A float clamp between a dequantize and a quantize of numbers for parameters (the ReLU6 of an
  int8 MobileNet: ExecuTorch's static int8 flow leaves it in float, the partitioner does not fuse
  it) becomes one `pte_wgpu.requantized_clamp` over the bytes (kernels/quant/quantize.py): the three
  ops' f32 arithmetic in one dispatch, where they ran three and moved floats between.

- A ReLU, or a clamp by numbers (ReLU6's hardtanh), of a convolution's result that nothing else
  reads becomes `et_vk.conv_with_clamp`, the clamp in the convolution's epilogue: ExecuTorch fuses
  those itself in its delegates, but leaves convolutions over a batch to the portable kernels while
  it delegates the ReLU after (ResNet's and MobileNet's at batch 8). A residual block's end,
  conv(x) + r (and the ReLU after), becomes `pte_wgpu.conv_residual`, r added in the epilogue of
  the implicit GEMM, where that always takes the convolution; other relu(a + b), the sum read by
  nothing else, one `pte_wgpu.add_relu`. The same values, NaN, infinities and the sign of a zero
  included (every clamp compares, kernels/wgsl.py's `clamped`).

- A permute of a permute that nothing else reads becomes one permute by the composed order (ViT's
  attention output takes three in a row, two of them each other's inverse).

- A dynamic quantization's choose_qparams of the same input and arguments as an earlier one goes,
  its readers reading the earlier one's scales and zero points (an 8da4w export quantizes the
  input of q, k and v three times, that of gate and up twice).
- Then, unless the device multiplies int8 subgroup matrices, the 8da4w products of one such input
  become 4-bit linears of its rows quantized and dequantized once (`pte_wgpu.quantized_rows`, or
  `pte_wgpu.rms_norm_quantized_rows` with the RMS norm before it, whose squares sum in another
  order), the same values, and fuse as 4-bit ones below; last, rows of a multiple of 16 that
  only those read keep their int8 values beside (`_int8_rows`), which the subgroup kernels
  multiply as integers.

- Attention exported as bmm(q', transpose(k')) -> softmax (safe or not) over the keys -> bmm(., v),
  q' and k' each q and k or a number times them (scaled_dot_product_attention's decomposition:
  ViT's), becomes one `pte_wgpu.attention(q, k, v, scale)` (kernels/attention/sdpa.py), the
  query-tiled flash-attention kernel: the scores [heads, S, L] are never written, the transpose's
  copy and the multiplies go. Where q, k and v are slices of one projection's [B, S, 3, H, D] and
  the result goes on transposed to [B, S, H, D] (timm's attention: ViT's, DeiT's),
  `pte_wgpu.attention_packed` reads and writes those in place: no slice or permute copies either.
  Its sums run in another order (an online softmax, the scales multiplied into q first): within
  f32 rounding of the ops it replaces, not bit for bit.

Views that only fed a fused op are dropped with it. Each rewrite but the attention's and a norm
joining a quantization keeps every row's sums in the order of the ops it replaces (the biased
residual's to a rounding, above).
"""


import dataclasses
import functools
from collections import Counter

from pte_wgpu.resize.values import NONE, IntList, Scalar, Tensor, ValueList

from .attention.kv_cache_sdpa import tiled_shape
from .attention.rope import LEAN_UNBOUND, ROPE_NAMES  # what the RoPE adds to a q/k/v group's bindings
from .attention.sdpa import ATTENTION, ATTENTION_PACKED
from .matmul.fused_linear import fused_operands
from .matmul.linear import LINEAR_GELU
from .matmul.qkv_rope import GROUPS as ROPE_GROUPS  # the q/k/v groups that take a RoPE
from .matmul.routes import q4_splits_k
from .quant.quantize import REQUANTIZED_CLAMP
from .registry import op, value_uses
from .tensor.elementwise import add_elementwise
from .tensor.reduce import SAFE_SOFTMAX
from .vision.conv import CONV_RESIDUAL, takes_residual
from .wgsl import int8_rows_dim, relu

SIGMOID = ("aten.sigmoid.default",)
MUL = ("aten.mul.Tensor",)
LINEAR = "aten.linear.default"
Q4_LINEAR = "et_vk.linear_q4gsw.default"
# Ops that only reshape (the runtime aliases them): fusion looks through them
VIEWS = ("aten.view_copy.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim", "aten.unsqueeze_copy.default")
ADD = "aten.add.Tensor"
SILU_MUL = "pte_wgpu.silu_mul"
ADD_RELU = "pte_wgpu.add_relu"
LINEAR_SILU_MUL = "pte_wgpu.linear_silu_mul"
LINEAR_RESIDUAL = "pte_wgpu.linear_residual"
LINEAR_BIAS_RESIDUAL = "pte_wgpu.linear_bias_residual"
LINEAR_GROUP = "pte_wgpu.linear_group"
DQ8_LINEAR = "et_vk.linear_dq8ca_q4gsw.default"
DQ8_LINEAR_RESIDUAL = "pte_wgpu.q4_linear_dq8_residual"
QUANTIZED_ROWS = "pte_wgpu.quantized_rows"  # an 8da4w product's rows, quantized and dequantized
RMS_NORM_QUANTIZED_ROWS = "pte_wgpu.rms_norm_quantized_rows"
# each rewrite's op for float linears and for 4-bit ones
FUSED = {
    None: {"silu_mul": LINEAR_SILU_MUL, "residual": LINEAR_RESIDUAL, "group": LINEAR_GROUP},
    "q4": {"silu_mul": "pte_wgpu.q4_linear_silu_mul", "residual": "pte_wgpu.q4_linear_residual", "group": "pte_wgpu.q4_linear_group"},
}
LINEAR_BIAS_GROUP, Q4_BIAS_GROUP = "pte_wgpu.linear_bias_group", "pte_wgpu.q4_linear_bias_group"
NORM_READERS = (LINEAR_GROUP, LINEAR_SILU_MUL, FUSED["q4"]["group"], FUSED["q4"]["silu_mul"], LINEAR_BIAS_GROUP, Q4_BIAS_GROUP)  # ops a norm folds into
RMS_NORM = "et_vk.rms_norm.default"
RMS_NORM_FOR_GEMM = "pte_wgpu.rms_norm_for_gemm"
RMS_NORM_FOR_Q4 = "pte_wgpu.rms_norm_for_q4"  # before a fused 4-bit linear
RMS_NORM_PAIR = "pte_wgpu.rms_norm_pair"
RMS_NORM_PAIR_ROPE = "pte_wgpu.rms_norm_pair_rope_hf_into_cache"  # the pair, then the rotate-half RoPE of the two
ROPE = "et_vk.apply_rotary_emb.default"
CLONE = "aten.clone.default"
ROPE_INTO_CACHE = "pte_wgpu.rope_into_cache"
ROPE_HF, ROPE_HF_INTO_CACHE = "et_vk.apply_rotary_emb_hf.default", "pte_wgpu.rope_hf_into_cache"  # rotate-half's (rope.py)
RAGGED_SDPA = "pte_wgpu.ragged_sdpa"
RAGGED_SDPA_CACHED = "pte_wgpu.ragged_sdpa_cached"
MAX_GROUP = 4  # products per linear_group (the kernel's code grows with each)
FLOATS = ("float32", "float16")  # the dtypes the fused linears store as they are (f32, f16)


@op(SILU_MUL, half=True, capacity=True)
def silu_mul(b):
    add_elementwise(b, [0, 1], "a / (1.0 + exp(-a)) * b")


@op(ADD_RELU, half=True, capacity=True)
def add_relu(b):
    """[a, b, alpha, out]: relu(a + alpha * b), broadcasting as add does."""
    add_elementwise(b, [0, 1], relu("(a + alpha * b)", "$CT(0)"), b.scalar(2, 1))


def _producers(graph):
    return {args[-1]: i for i, (_, args) in enumerate(graph.calls) if args}


def _made(calls, producer, uses, vid, names, drop=(), users=1):
    """The index of the call in `names` that makes `vid`, where `vid` is read `users` times (by
    default by the caller alone) and the call is not in `drop`; None."""
    i = producer.get(vid)
    return i if i is not None and i not in drop and calls[i][0] in names and uses[vid] == users else None


def _readers(graph):
    """The calls that read each value, in order."""
    readers = {}
    for i, (_, args) in enumerate(graph.calls):
        for a in args[:-1]:
            readers.setdefault(a, []).append(i)
    return readers


def _alike(values, a, b):
    """Whether tensors a and b have the same dims and dtype (an op between them changes neither)."""
    return values[a].dims == values[b].dims and values[a].dtype == values[b].dtype


# What a rewrite meets in a malformed file (a scalar where a pattern expects a tensor, an id out
# of range): the graph is then left unfused, and the ops' own builds name what is wrong.
MALFORMED = (AttributeError, TypeError, IndexError, KeyError)


def _unless_malformed(rewrite, graph, *args):
    """`rewrite(graph, *args)`, or, when it meets a malformed graph, the calls as they were and 0."""
    original = list(graph.calls)
    try:
        return rewrite(graph, *args)
    except MALFORMED:
        graph.calls[:] = original
        return 0


def fuse(graph, int8_matrices=False):
    """Rewrite `graph.calls` in place; returns how many patterns were fused. With `int8_matrices`
    (the device multiplies int8 subgroup matrices) 8da4w products keep their int8 activations,
    which their prompts' products take to the matrices."""
    return _unless_malformed(_fuse_all, graph, int8_matrices)


def _fuse_all(graph, int8_matrices):
    _read_through_clones(graph)  # not a fusion: the patterns below then meet no clone
    fused = _share_repeats(graph, CHOOSE_QPARAMS)
    fused += 0 if int8_matrices else _quantize_rows(graph)
    fused += _fuse_permutes(graph)
    fused += _fuse_safe_softmax(graph)
    fused += _fuse_attention(graph)
    fused += _fuse_requantized_clamps(graph)
    fused += _fuse_conv_clamps(graph)
    fused += _fuse_conv_residual(graph)
    fused += _fuse_batched_weight(graph)
    fused += _fuse_bias(graph)
    fused += _fuse_silu(graph)
    fused += _fuse_gelu(graph)
    fused += _fuse_swiglu(graph)
    fused += _fuse_residual(graph)
    fused += _fuse_groups(graph)
    fused += _fuse_add_relu(graph)
    _drop_dead_views(graph)
    fused += _fuse_norms(graph)
    fused += _pair_norms(graph)
    _int8_rows(graph)  # not a fusion: the rows' storage
    return fused


def _read_through_clones(graph):
    """A clone of a value that one earlier call made and none writes again (an activation: a
    functional graph writes those once) goes, its readers reading the value itself, where they
    read the clone directly (not through a list). ExecuTorch's Vulkan lowering leaves clones at the
    edges of one layer of an LLM (Llama-3.2-1B's and Llama-3.1-8B's exports: after the SwiGLU's
    products, around the residual add, of the rotary tables), which kept that layer's SwiGLU, down
    product and residual add apart. Memory planning made such clones aliases (no dispatch): no value
    changes."""
    values, calls, writes, direct = graph.values, graph.calls, _writes(graph), _read_directly(graph)
    edges = set(graph.inputs) | set(graph.outputs)
    rename, drop = {}, set()
    for k, (name, args) in enumerate(calls):
        if name != CLONE or len(args) != 3:
            continue
        x, out = rename.get(args[0], args[0]), args[-1]
        if not (isinstance(values[x], Tensor) and isinstance(values[out], Tensor) and _alike(values, x, out)):
            continue
        if {x, out} & edges or values[x].constant is not None or not direct(out):
            continue
        if len(writes.get(x, ())) != 1 or writes[x][0] > k or writes.get(out) != [k]:
            continue
        rename[out] = x
        drop.add(k)
    _drop_renaming(graph, drop, rename)


def _read_directly(graph):
    """Whether a value is read by calls alone, each reading it directly: not through a list, not as
    one of the graph's outputs (a predicate)."""
    uses, direct = value_uses(graph), Counter(a for _, args in graph.calls for a in args[:-1])
    return lambda vid: uses[vid] == direct[vid]


def _drop_renaming(graph, drop, rename):
    """The graph's calls but those of `drop`, each reading rename[v] where it read a value v of `rename`."""
    graph.calls[:] = [(name, (*(rename.get(a, a) for a in args[:-1]), args[-1])) for k, (name, args) in enumerate(graph.calls) if k not in drop]


GATHERS = ("aten.embedding.default",)  # rows of a table by index: what the ragged pass makes of the rotary tables' slices
# Dynamic quantization's parameter ops (kernels/quant/quantize.py): each gives its input's scales and
# zero points (a ValueList of two outputs)
CHOOSE_QPARAMS = ("torchao.choose_qparams_affine.default", "quantized_decomposed.choose_qparams_per_token_asymmetric.default")


def _share_repeats(graph, names):
    """A call of `names` with the same inputs and arguments as an earlier one is dropped, its
    readers reading the earlier one's outputs: an 8da4w export quantizes the input of q, k and v
    three times, that of gate and up twice (a dispatch each, in every decode step); a ragged pass
    gathers the rotary tables' rows at its positions in every layer of the families that slice
    them there (the Hugging Face RoPE's: Qwen2.5, Qwen3, Phi-4-mini). Only where the dropped
    outputs are read directly by calls (not through a list, not as the graph's outputs) and no
    call between the two writes an input."""
    values, calls, writes, direct = graph.values, graph.calls, _writes(graph), _read_directly(graph)
    first, rename, drop = {}, {}, set()
    for k, (name, args) in enumerate(calls):
        if name not in names or not args:
            continue
        key = (name, *(a if isinstance(values[a], Tensor) else values[a] for a in args[:-1]))
        mine = values[args[-1]].items if isinstance(values[args[-1]], ValueList) else (args[-1],)
        if key not in first:
            first[key] = k, mine
            continue
        at, theirs = first[key]
        if len(mine) != len(theirs) or not all(direct(o) for o in mine) or any(at < w < k for a in args[:-1] for w in writes.get(a, ())):
            continue
        rename.update(zip(mine, theirs))
        drop.add(k)
    _drop_renaming(graph, drop, rename)
    return len(drop)


def _writes(graph):
    """The calls that write each value, in order."""
    writes = {}
    for k, (_, args) in enumerate(graph.calls):
        for o in _outputs(graph.values, args):
            writes.setdefault(o, []).append(k)
    return writes


def _quantize_rows(graph):
    """A choose_qparams_affine of whole rows (of a multiple of 4) whose scales and zero points
    only 8da4w products of its input read (directly, no call between writing the input) becomes
    `pte_wgpu.quantized_rows`, the rows quantized and dequantized once as the products did it
    (kernels/quant/quantized_rows.py), and the products 4-bit linears of those rows, which the
    rewrites after fuse as 4-bit ones (an 8da4w decode step then takes about the 4w export's
    dispatches). An RMS norm only it reads joins it (`pte_wgpu.rms_norm_quantized_rows`)."""
    values, calls, uses = graph.values, graph.calls, value_uses(graph)
    readers, writes, replace, fused = _readers(graph), _writes(graph), {}, 0
    for k, (name, args) in enumerate(calls):
        if name != CHOOSE_QPARAMS[0] or len(args) != 11 or not isinstance(values[args[-1]], ValueList) or len(values[args[-1]].items) != 2:
            continue
        x, (scale, zp) = args[0], values[args[-1]].items
        block, dims = values[args[2]], values[x].dims
        if not (isinstance(block, IntList) and dims and block.items[-1] == dims[-1] and dims[-1] % 4 == 0):
            continue
        if values[x].dtype not in FLOATS or values[scale].dtype not in FLOATS or values[zp].dtype not in ("int8", "int32"):
            continue
        products = sorted(set(readers.get(scale, ())) | set(readers.get(zp, ())))
        if not products or any(uses[o] != len(readers.get(o, ())) for o in (scale, zp)) or any(k < w < products[-1] for w in writes.get(x, ())):
            continue
        if any(calls[i][0] != DQ8_LINEAR or len(calls[i][1]) != 9 or tuple(calls[i][1][:3]) != (x, scale, zp) for i in products):
            continue
        values += [Tensor("float32", dims), Scalar(values[scale].dtype), Scalar(values[zp].dtype)]
        rows, scale_dtype, zp_dtype = len(values) - 3, len(values) - 2, len(values) - 1
        replace[k] = (QUANTIZED_ROWS, (*args[:7], scale_dtype, zp_dtype, args[9], rows))
        for i in products:
            _, _, _, w, _, scales, gs, bias, out = calls[i][1]
            replace[i] = (Q4_LINEAR, (rows, w, scales, gs, bias, out))
        fused += 1
    graph.calls[:] = [replace.get(i, c) for i, c in enumerate(calls)]
    return fused + _join_norms(graph)


# The 4-bit ops that read their input (args[0]) as int8 rows too (kernels/wgsl.py's Int8Rows)
INT8_ROW_READERS = (Q4_LINEAR, *FUSED["q4"].values())


def _int8_rows(graph):
    """Quantized rows of a multiple of 16 that only 4-bit ops read, as their input, are written
    with their int8 values, scale and zero point beside the floats (an int32 tensor [..., K + K /
    4 + 2]: kernels/wgsl.py's Int8Rows): the GPUs' and CPU adapters' 4-bit subgroup kernels then
    multiply the int8 values with dot4I8Packed (kernels/matmul/q4_linear.py's sg_body), the other
    routes read the floats as before."""
    values, calls, readers = graph.values, graph.calls, _readers(graph)
    outputs = set(graph.outputs)
    for k, (name, args) in enumerate(calls):
        rows = args[-1] if name in (QUANTIZED_ROWS, RMS_NORM_QUANTIZED_ROWS) else None
        if rows is None or rows in outputs or values[rows].dims[-1] % 16:
            continue
        users = readers.get(rows, ())
        if not users or any(calls[i][0] not in INT8_ROW_READERS or calls[i][1].count(rows) != 1 or calls[i][1][0] != rows for i in users):
            continue
        dims = values[rows].dims
        values.append(Tensor("int32", (*dims[:-1], int8_rows_dim(dims[-1]))))
        words = len(values) - 1
        calls[k] = (name, (*args[:-1], words))
        for i in users:
            calls[i] = (calls[i][0], (words, *calls[i][1][1:]))


def _join_norms(graph):
    """rms_norm(x, gamma, eps) that only a quantized_rows reads: one rms_norm_quantized_rows at
    the norm's place."""
    calls, values, uses, producer = graph.calls, graph.values, value_uses(graph), _producers(graph)
    drop = set()
    for k, (name, args) in enumerate(calls):
        i = producer.get(args[0]) if name == QUANTIZED_ROWS else None
        if i is None or calls[i][0] != RMS_NORM or len(calls[i][1]) != 4 or uses[args[0]] != 1:
            continue
        x, gamma, eps, normed = calls[i][1]
        if not _alike(values, x, normed) or values[x].dtype not in FLOATS or len(values[gamma].dims) != 1:
            continue
        calls[i] = (RMS_NORM_QUANTIZED_ROWS, (x, *args[1:-1], gamma, eps, args[-1]))
        drop.add(k)
    graph.calls[:] = [c for k, c in enumerate(calls) if k not in drop]
    return len(drop)


def _fuse_silu(graph):
    uses = value_uses(graph)
    producer = _producers(graph)
    calls, drop, fused = graph.calls, set(), 0
    for k, (name, args) in enumerate(calls):
        if name not in MUL or len(args) != 3:
            continue
        for g, other in ((args[0], args[1]), (args[1], args[0])):
            i = _made(calls, producer, uses, g, MUL, drop)
            if i is None:
                continue
            ga, gb = calls[i][1][:2]
            for a, s in ((ga, gb), (gb, ga)):
                j = _made(calls, producer, uses, s, SIGMOID, drop)
                if j is not None and calls[j][1][0] == a:
                    drop.update((i, j))
                    calls[k] = (SILU_MUL, (a, other, args[-1]))
                    fused += 1
                    break
            else:
                continue
            break
    graph.calls[:] = [c for i, c in enumerate(calls) if i not in drop]
    return fused


def _fuse_bias(graph):
    """add(view(linear(x, w)), bias) (either order, alpha 1), bias of [N], the linear's f32 result
    read by nothing else: linear(x, w, bias). The twin of _fuse_residual for a vector."""
    f = _Linears(graph)
    values, replace, drop = graph.values, {}, set()

    def float_linear(i):
        return graph.calls[i][0] == LINEAR and f.linear(i)

    for k, (name, args) in enumerate(graph.calls):
        if name != ADD or len(args) != 4 or not isinstance(values[args[2]], Scalar) or values[args[2]].value != 1:
            continue
        out = values[args[-1]]
        for e, bias in ((args[0], args[1]), (args[1], args[0])):
            i, views = f.through_views(e, float_linear)
            if i is None or f.uses[e] != 1:
                continue
            x, w, product, _ = f.linear(i)
            v = values[bias]
            if not isinstance(v, Tensor) or tuple(v.dims) != (out.dims[-1],) or not (values[product].dims == values[e].dims == out.dims):
                continue
            if {values[product].dtype, out.dtype, v.dtype} != {"float32"}:
                continue
            replace[k] = (LINEAR, (x, w, bias, args[-1]))
            drop.update((i, *views))
            break
    f.rewrite(replace, drop)
    return len(replace)


GELUS = ("aten.gelu.default",)


def _fuse_gelu(graph):
    """gelu(view(linear(x, w, b))) of one shape, the linear's result read by nothing else:
    pte_wgpu.linear_gelu(x, w, b, approximate)."""
    f = _Linears(graph)
    values, replace, drop = graph.values, {}, set()

    def any_linear(i):  # with a bias or without
        return graph.calls[i][0] == LINEAR and len(graph.calls[i][1]) == 4

    for k, (name, args) in enumerate(graph.calls):
        if name not in GELUS or len(args) not in (2, 3):
            continue
        i, views = f.through_views(args[0], any_linear)
        if i is None or f.uses[args[0]] != 1:
            continue
        x, w, bias, product = graph.calls[i][1]
        if len({tuple(values[v].dims) for v in (product, args[0], args[-1])}) != 1 or values[args[-1]].dtype not in FLOATS:
            continue
        if len(args) == 3:
            approximate = args[1]
        else:
            values.append(Scalar("none"))
            approximate = len(values) - 1
        replace[k] = (LINEAR_GELU, (x, w, bias, approximate, args[-1]))
        drop.update((i, *views))
    f.rewrite(replace, drop)
    return len(replace)


DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"
CLAMPS = ("aten.hardtanh.default", "aten.clamp.default")


CONVS = ("aten.convolution.default", "aten::convolution.out")
CONV_WITH_CLAMP = "et_vk.conv_with_clamp.default"
RELU = "aten.relu.default"


def _fuse_conv_clamps(graph):
    """A ReLU, or a clamp by numbers (ReLU6's hardtanh), of a convolution's result that nothing
    else reads: et_vk.conv_with_clamp, the clamp in the convolution's epilogue (a convolution over
    a batch, which the partitioner leaves to the portable kernels while it delegates the ReLU)."""
    values, uses, producer = graph.values, value_uses(graph), _producers(graph)
    calls, drop, fused = graph.calls, set(), 0
    for k, (name, args) in enumerate(calls):
        relu = name == RELU and len(args) == 2
        if not relu and not (name in CLAMPS and len(args) == 4 and all(isinstance(values[a], Scalar) for a in args[1:3])):
            continue
        i = _made(calls, producer, uses, args[0], CONVS)
        if i is None or len(calls[i][1]) != 10 or not _alike(values, args[0], args[-1]):
            continue
        if relu:
            values += [Scalar(0.0), NONE]
        bounds = (len(values) - 2, len(values) - 1) if relu else args[1:3]
        calls[k] = (CONV_WITH_CLAMP, (*calls[i][1][:9], *bounds, args[-1]))
        drop.add(i)
        fused += 1
    graph.calls[:] = [c for n, c in enumerate(calls) if n not in drop]
    return fused


def _fuse_conv_residual(graph):
    """conv(x) + residual (either order, alpha 1, the same shape), the convolution's result read by
    nothing else and the convolution one the implicit GEMM always takes: pte_wgpu.conv_residual,
    the residual added in its epilogue; with the ReLU after, where only that reads the sum."""
    values, uses, producer, readers = graph.values, value_uses(graph), _producers(graph), _readers(graph)
    calls, drop, fused = graph.calls, set(), 0
    for k, (name, args) in enumerate(calls):
        if name != ADD or len(args) != 4 or values[args[2]].value not in (1, None):
            continue
        for e, residual in ((args[0], args[1]), (args[1], args[0])):
            i = _made(calls, producer, uses, e, CONVS, drop)
            if i is None or len(calls[i][1]) != 10:
                continue
            conv = calls[i][1]
            weight, transposed, groups = values[conv[1]].dims, values[conv[6]].value, values[conv[8]].value
            if not takes_residual(weight, bool(transposed), int(groups or 1)):
                continue
            out, at = args[-1], k
            if not (_alike(values, e, out) and values[residual].dims == values[out].dims):
                continue
            j = readers[out][0] if uses[out] == 1 and out in readers else None  # the sum's one reader
            relu = j is not None and calls[j][0] == RELU and len(calls[j][1]) == 2 and _alike(values, out, calls[j][1][-1])
            values += [Scalar(0.0) if relu else NONE, NONE]
            if relu:
                out, at = calls[j][1][-1], j
                drop.add(k)
            calls[at] = (CONV_RESIDUAL, (*conv[:9], len(values) - 2, len(values) - 1, residual, out))
            drop.add(i)
            fused += 1
            break
    graph.calls[:] = [c for n, c in enumerate(calls) if n not in drop]
    return fused


def _fuse_add_relu(graph):
    """relu(a + alpha * b) of tensors, the sum read by nothing else: one pte_wgpu.add_relu (a
    residual block's end: ResNet's)."""
    values, uses, producer = graph.values, value_uses(graph), _producers(graph)
    calls, drop, fused = graph.calls, set(), 0
    for k, (name, args) in enumerate(calls):
        if name != RELU or len(args) != 2:
            continue
        i = _made(calls, producer, uses, args[0], (ADD,))
        if i is None or len(calls[i][1]) != 4:
            continue
        a, b, alpha, _ = calls[i][1]
        if not (isinstance(values[b], Tensor) and isinstance(values[alpha], Scalar) and _alike(values, args[0], args[-1])):
            continue
        calls[k] = (ADD_RELU, (a, b, alpha, args[-1]))
        drop.add(i)
        fused += 1
    graph.calls[:] = [c for n, c in enumerate(calls) if n not in drop]
    return fused


def _fuse_requantized_clamps(graph):
    values, uses, producer = graph.values, value_uses(graph), _producers(graph)
    calls, drop, fused = graph.calls, set(), 0
    numbers = lambda args: all(isinstance(values[a], Scalar) for a in args)  # noqa: E731
    for k, (name, args) in enumerate(calls):
        if name != QUANTIZE or len(args) != 7 or not numbers(args[1:5]):
            continue
        j = _made(calls, producer, uses, args[0], CLAMPS)
        if j is None or not numbers(calls[j][1][1:3]):
            continue
        clamped = calls[j][1][0]
        i = _made(calls, producer, uses, clamped, (DEQUANTIZE,))
        if i is None or len(calls[i][1]) != 8 or not numbers(calls[i][1][1:3]):
            continue
        if {values[clamped].dtype, values[args[0]].dtype} != {"float32"}:  # f16 between would round
            continue
        q, scale, zp = calls[i][1][:3]
        calls[k] = (REQUANTIZED_CLAMP, (q, scale, zp, *calls[j][1][1:3], *args[1:5], args[-1]))
        drop.update((i, j))
        fused += 1
    graph.calls[:] = [c for n, c in enumerate(calls) if n not in drop]
    return fused


SOFTMAX = ("aten._softmax.default", "aten::_softmax.out")
# _safe_softmax's pieces, as the delegate and the portable program name them
WHERE = ("aten.where.self", "aten::where.self_out")
EQ = ("aten.eq.Scalar", "aten::eq.Scalar_out")
NOT = ("aten.logical_not.default", "aten::logical_not.out")
ANY = ("aten.any.dim", "aten::any.out", "aten::any.dims_out")
FULL_LIKE = ("aten.full_like.default", "aten::full_like.out")


def _fuse_safe_softmax(graph):
    """where(not(any(not(x == -inf), dim, keepdim)), full_like(s, 0), s) with s = softmax(x, dim):
    one pte_wgpu.safe_softmax where nothing else reads the pieces."""
    uses, producer, values = value_uses(graph), _producers(graph), graph.values
    calls, drop, fused = graph.calls, set(), 0

    def made(vid, names, users=1):
        i = _made(calls, producer, uses, vid, names, drop, users)
        return (i, calls[i][1]) if i is not None else (None, None)

    def scalar(vid):
        v = values[vid]
        return v.value if isinstance(v, Scalar) else None

    for k, (name, args) in enumerate(calls):
        if name not in WHERE or len(args) != 4:
            continue
        cond, zeros, s = args[:3]
        chain, vid = [], cond
        for names in (NOT, ANY, NOT, EQ):  # the condition, back to x == -inf
            i, a = made(vid, names)
            if i is None:
                break
            chain.append((i, a))
            vid = a[0]
        (i_s, a_s), (i_z, a_z) = made(s, SOFTMAX, users=2), made(zeros, FULL_LIKE)
        if len(chain) < 4 or None in (i_s, i_z) or a_z[0] != s or scalar(a_z[1]) != 0:
            continue
        a_a, a_e = chain[1][1], chain[3][1]
        if scalar(a_e[1]) != float("-inf") or a_e[0] != a_s[0]:
            continue
        rank = len(values[s].dims)
        dim, any_dim = scalar(a_s[1]), scalar(a_a[1])
        if any_dim is None or dim % rank != any_dim % rank or not scalar(a_a[2]):
            continue
        drop.update((i_s, i_z, *(i for i, _ in chain)))
        calls[k] = (SAFE_SOFTMAX, (*a_s[:-1], args[-1]))
        fused += 1
    graph.calls[:] = [c for i, c in enumerate(calls) if i not in drop]
    return fused


PERMUTES = ("aten.permute_copy.default", "aten.permute.default", "aten::permute_copy.out")


def _order(values, vid):
    """A permute's order fixed in the file, each dim from 0 (None: not a permutation of fixed ints)."""
    v = values[vid]
    items = v.items if isinstance(v, IntList) else [values[k].value if isinstance(values[k], Scalar) else None for k in v.items]
    if not all(isinstance(d, int) for d in items):
        return None
    order = [d % len(items) for d in items]
    return order if sorted(order) == list(range(len(order))) else None


def _fuse_permutes(graph):
    """permute(permute(x, p), q), the inner one read by nothing else: permute(x, [p[i] for i in q]),
    one strided copy where there were two (a chain folds from its first permute on)."""
    values, calls, producer, uses = graph.values, graph.calls, _producers(graph), value_uses(graph)
    drop, fused = set(), 0
    for k, (name, args) in enumerate(calls):
        i = _made(calls, producer, uses, args[0], PERMUTES) if name in PERMUTES and len(args) == 3 else None
        if i is None or len(calls[i][1]) != 3:
            continue
        inner, outer = _order(values, calls[i][1][1]), _order(values, args[1])
        if inner is None or outer is None or len(inner) != len(outer):
            continue
        values.append(IntList(tuple(inner[d] for d in outer)))
        calls[k] = (name, (calls[i][1][0], len(values) - 1, args[-1]))
        drop.add(i)
        fused += 1
    graph.calls[:] = [c for n, c in enumerate(calls) if n not in drop]
    return fused


BMM = ("aten.bmm.default", "aten::bmm.out")
MUL_SCALAR = ("aten.mul.Scalar", "aten::mul.Scalar_out")


def _fuse_attention(graph):
    """bmm(softmax(bmm(q', k'), dim=-1), v), each piece read once, k' the transpose (a permute of
    the last two dims) of k or a number times it, q' q or a number times it (views, clones and
    expands that keep the shape between), where q, k and v end in [S, D], [L, D] and [L, D] with D
    a head dim the tiled kernel takes: pte_wgpu.attention(q, k, v, the numbers' product), or
    pte_wgpu.attention_packed where they are timm's slices of one projection (_packed_attention)."""
    values, calls, uses, producer = graph.values, graph.calls, value_uses(graph), _producers(graph)
    drop, fused = set(), 0

    def made(vid, names, chain):
        """The args of the call of `names` that makes `vid`, read once, the call added to `chain`."""
        i = _made(calls, producer, uses, vid, names, drop)
        if i is None:
            return None
        chain.append(i)
        return calls[i][1]

    def viewed(vid, chain):
        """The value `vid` is a view of (itself where it is none), the views' calls added to `chain`;
        a clone is one too, and an expand to its input's own shape (a matmul's broadcast of equal
        batch dims)."""
        while True:
            mark = len(chain)
            args = made(vid, VIEWS + EXPAND + (CLONE,), chain)
            if args is None:
                return vid
            if calls[chain[-1]][0] in EXPAND and values[args[0]].dims != values[vid].dims:
                del chain[mark:]
                return vid
            vid = args[0]

    def scaled(vid, chain):
        """(value, factor): a number's multiply of the value before `vid`'s views, or it and 1."""
        vid = viewed(vid, chain)
        mark = len(chain)
        args = made(vid, MUL_SCALAR, chain)
        if args is not None and isinstance(values[args[1]], Scalar) and isinstance(values[args[1]].value, (int, float)):
            return viewed(args[0], chain), float(values[args[1]].value)
        del chain[mark:]
        return vid, 1.0

    def ends(vid, tail):
        v = values[vid]
        return isinstance(v, Tensor) and v.dtype in FLOATS and tuple(v.dims[-2:]) == tuple(tail)

    for n, (name, args) in enumerate(calls):
        if name not in BMM or len(args) != 3:
            continue
        chain = []
        soft = made(viewed(args[0], chain), (SAFE_SOFTMAX, *SOFTMAX), chain)
        if soft is None or not isinstance(values[soft[1]], Scalar):
            continue
        rank = len(values[soft[0]].dims)
        first = made(viewed(soft[0], chain), BMM, chain)
        if first is None or values[soft[1]].value % rank != rank - 1:
            continue
        (_, s, dim), (_, _, keys) = values[first[0]].dims, values[first[1]].dims
        q, q_scale = scaled(first[0], chain)
        kt, k_scale = scaled(first[1], chain)
        transpose = made(kt, PERMUTES, chain)
        order = _order(values, transpose[1]) if transpose is not None and len(transpose) == 3 else None
        k, v = (transpose[0] if order else None), viewed(args[1], chain)
        if order != [*range(len(order or ()) - 2), len(order or ()) - 1, len(order or ()) - 2] or tiled_shape(dim) is None:
            continue
        if not (ends(q, (s, dim)) and ends(k, (keys, dim)) and ends(v, (keys, dim)) and values[args[1]].dims[-1] == dim):
            continue
        values.append(Scalar(q_scale * k_scale))
        mark = len(chain)
        packed = _packed_attention(values, calls, uses, producer, (q, viewed(k, chain), v), args[-1], chain, made)
        if packed is not None:
            calls[n] = (ATTENTION_PACKED, (packed[0], len(values) - 1, packed[1]))
        else:
            del chain[mark:]  # k's views stay
            calls[n] = (ATTENTION, (q, k, v, len(values) - 1, args[-1]))
        drop.update(chain)
        fused += 1
    graph.calls[:] = [c for i, c in enumerate(calls) if i not in drop]
    return fused


SLICES = ("aten.slice_copy.Tensor", "aten::slice_copy.Tensor_out")


def _packed_attention(values, calls, uses, producer, qkv_parts, out, chain, made):
    """(qkv, result) where q, k and v (`qkv_parts`) are slices 0, 1 and 2 along dim 0 of permute(qkv
    [B, S, 3, H, D], [2, 0, 3, 1, 4]) read by nothing else (timm's attention: ViT's, DeiT's), and
    the only reader of `out` [B * H, S, D], through views, is a permute of its [B, H, S, D] to
    `result` [B, S, H, D]: their calls added to `chain`; else None (`chain` then holds calls that
    must stay)."""
    sources = set()
    for c, vid in enumerate(qkv_parts):
        args = made(vid, SLICES, chain)
        if args is None or len(args) != 6 or not all(isinstance(values[a], Scalar) for a in args[1:5]):
            break
        if tuple(values[a].value for a in args[1:5]) != (0, c, c + 1, 1):
            break
        sources.add(args[0])
    else:
        i = producer.get(next(iter(sources))) if len(sources) == 1 else None
        if i is not None and calls[i][0] in PERMUTES and len(calls[i][1]) == 3 and uses[calls[i][1][-1]] == 3:
            qkv, dims = calls[i][1][0], values[calls[i][1][0]].dims
            after = _permuted_reader(values, calls, uses, out)
            if _order(values, calls[i][1][1]) == [2, 0, 3, 1, 4] and len(dims) == 5 and dims[2] == 3 and after is not None:
                permute, result, views = after
                if tuple(values[result].dims) == (dims[0], dims[1], dims[3], dims[4]):
                    chain += [i, permute, *views]
                    return qkv, result
    return None


def _permuted_reader(values, calls, uses, vid):
    """(call, result, views' calls): the permute [0, 2, 1, 3] of a 4-D view of `vid` that is its only
    reader, through views each read once; or None."""
    views = []
    while uses[vid] == 1:
        readers = [j for j, (_, args) in enumerate(calls) if vid in args[:-1]]
        if len(readers) != 1:
            return None
        j = readers[0]
        name, args = calls[j]
        if name in VIEWS:
            views.append(j)
            vid = args[-1]
        elif name in PERMUTES and len(args) == 3 and len(values[vid].dims) == 4 and _order(values, args[1]) == [0, 2, 1, 3]:
            return j, args[-1], views
        else:
            return None
    return None
TRANSPOSES = ("aten.permute_copy.default", "aten::permute_copy.out", "aten.t_copy.default", "aten::t_copy.out")
EXPAND = ("aten.expand_copy.default", "aten::expand_copy.out")


def _fuse_batched_weight(graph):
    """bmm(x [B, M, K], expand(transpose(w [N, K]), [B, K, N])), through views: aten.linear(x, w),
    which reads w in place where the copies wrote it B times every call (how the output projection
    of torch's multi-head attention exports: ViT-B/16 at batch 8, 19 MB a layer). The copies go
    where nothing else reads them."""
    f = _Linears(graph)
    producer, values, calls = f.producer, graph.values, graph.calls
    fused, none, fed = 0, None, set()

    def through_views(vid, chain):
        """The call that makes `vid` through views (None: an input), the views' calls added to `chain`."""
        src, viewed = _viewed(f, vid)
        chain.extend(producer[v] for v in viewed[:-1])
        return producer.get(src)

    def transposes_2d(i):
        name, args = calls[i]
        if name not in TRANSPOSES or len(values[args[0]].dims) != 2:
            return False
        return name in TRANSPOSES[2:] or _order(values, args[1]) == [1, 0]

    for k, (name, args) in enumerate(calls):
        if name not in BMM or len(args) != 3:
            continue
        chain = []
        i_e = through_views(args[1], chain)
        if i_e is None or calls[i_e][0] not in EXPAND:
            continue
        i_t = through_views(calls[i_e][1][0], chain)
        if i_t is None or not transposes_2d(i_t):
            continue
        w, e = calls[i_t][1][0], calls[i_e][1]
        (n, kw), x = values[w].dims, tuple(values[args[0]].dims)
        shapes = [tuple(values[v].dims) for v in (calls[i_t][1][-1], e[0], e[-1], args[1], args[-1])]
        if len(x) != 3 or shapes != [(kw, n), (kw, n), (*shapes[2][:-2], kw, n), (x[0], kw, n), (x[0], x[1], n)] or x[2] != kw:
            continue
        if none is None:
            values.append(NONE)
            none = len(values) - 1
        calls[k] = (LINEAR, (args[0], w, none, args[-1]))
        fused += 1
        fed.update((*chain, i_e, i_t))
    dead = set()
    while True:
        uses = value_uses(graph, dead)
        more = {i for i in fed - dead if uses[calls[i][1][-1]] == 0}
        if not more:
            break
        dead |= more
    graph.calls[:] = [c for i, c in enumerate(calls) if i not in dead]
    return fused


class _Linears:
    """Lookups over the current calls for the linear rewrites."""

    def __init__(self, graph):
        self.g, self.values, self.calls = graph, graph.values, graph.calls
        self.uses = value_uses(graph)
        self.producer = _producers(graph)

    def linear(self, i, biased=False):
        """(x, weight, out, kind) of call i if it is a bias-free linear with a 2-D weight: f32 or
        f16 (kind None, weight a value), or 4-bit of f32 or f16 rows (weight the (packed weight,
        scales, group size) values, kind ("q4", group size, the weight's row bytes, the scales' groups,
        whether its subgroup kernels split K: matmul/routes.py's q4_splits_k):
        products fuse only with their own kind. With `biased`, a linear with a bias of its N outputs
        instead (Qwen2.5's q/k/v): weight the (weight, bias) or (packed weight, scales, group size,
        bias) values, "bias" the last of its kind."""
        if i is None:
            return None
        name, args = self.calls[i]
        v = self.values
        if name == LINEAR and len(args) == 4:
            x, w, bias, out = args
            weights, kind = (w,), None
        elif name == Q4_LINEAR and len(args) == 6:
            x, w, scales, gs, bias, out = args
            if not isinstance(v[gs], Scalar) or len(v[scales].dims) != 3:  # q4_linear.py's scales_in_row_quads
                return None
            weights, kind = (w, scales, gs), ("q4", v[gs].value, v[w].dims[1:], v[scales].dims[1], q4_splits_k(v[w].dims[0]))
        else:
            return None
        q4 = kind is not None
        if biased:
            if not (isinstance(v[bias], Tensor) and v[bias].dtype in FLOATS and v[bias].dims == v[w].dims[:1]):
                return None
            weights, kind = (*weights, bias), (*(kind or ("float",)), "bias")
        elif not (isinstance(v[bias], Scalar) and v[bias].value is None):
            return None
        if len(v[w].dims) != 2 or any(v[t].dtype not in FLOATS for t in (x, *weights[:2], out) if not q4 or t != w):
            return None
        return x, (w if kind is None else weights), out, kind

    def biased_linear(self, i):
        """(x, weight, bias, out) of call i if it is a float linear with a bias of its N outputs."""
        found = self.linear(i, biased=True)
        if found is None or found[3][0] != "float":
            return None
        x, (w, bias), out, _ = found
        return x, w, bias, out

    def dq8_linear(self, i):
        """(x, input_scale, input_zp, weight, scales, group_size) of call i if it is a bias-free
        `et_vk.linear_dq8ca_q4gsw` (8da4w) of f32 or f16 rows and scales laid out for the kernels."""
        if i is None or self.calls[i][0] != DQ8_LINEAR or len(self.calls[i][1]) != 9:
            return None
        x, xs, xz, w, _, scales, gs, bias, out = self.calls[i][1]
        v = self.values
        if not (isinstance(v[bias], Scalar) and v[bias].value is None) or not isinstance(v[gs], Scalar) or len(v[scales].dims) != 3:
            return None
        return (x, xs, xz, w, scales, gs) if v[x].dtype in FLOATS and v[out].dtype in FLOATS else None

    def before_all(self, weight, i):
        """Whether a linear's weight (and scales) exist before call i."""
        return all(self.before(w, i) for w in (weight if isinstance(weight, tuple) else (weight,)))

    def before(self, vid, i):
        """Whether `vid` exists before call i (an input, a constant, or produced earlier)."""
        p = self.producer.get(vid)
        return p is None or p < i

    def through_views(self, vid, takes=None):
        """(call index, views between) when `vid` is the result of call i seen through views that
        nothing else reads, and `takes(i)` (by default `linear`: a bias-free linear); (None, [])."""
        takes = takes or self.linear
        views = []
        while True:
            i = self.producer.get(vid)
            if i is None:
                return None, []
            name, args = self.calls[i]
            if name in VIEWS and self.uses[args[0]] == 1:
                views.append(i)
                vid = args[0]
                continue
            return (i, views) if takes(i) and self.uses[vid] == 1 else (None, [])

    def view_root(self, vid):
        """The value `vid` views, through views that keep the last dim."""
        while (i := self.producer.get(vid)) is not None and self.calls[i][0] in VIEWS:
            src = self.calls[i][1][0]
            if self.values[src].dims[-1:] != self.values[vid].dims[-1:]:
                break
            vid = src
        return vid

    def new_list(self, items):
        self.values.append(ValueList(tuple(items)))
        return len(self.values) - 1

    def rewrite(self, replace, drop):
        self.calls[:] = [replace.get(i, c) for i, c in enumerate(self.calls) if i not in drop]


def _fuse_swiglu(graph):
    """silu_mul(view(linear(x, w_gate)), view(linear(x', w_up))), x and x' views of one value."""
    f = _Linears(graph)
    values, replace, drop = graph.values, {}, set()
    for k, (name, args) in enumerate(graph.calls):
        if name != SILU_MUL:
            continue
        gate, up, out = args
        (ig, vg), (iu, vu) = f.through_views(gate), f.through_views(up)
        if ig is None or iu is None or {ig, iu} & drop or f.uses[gate] != 1 or f.uses[up] != 1:
            continue
        (xg, wg, _, kind), (xu, wu, _, kind_u) = f.linear(ig), f.linear(iu)
        root = f.view_root(xg)
        w0, u0 = (wg, wu) if kind is None else (wg[0], wu[0])
        dims = values[root].dims[:-1] + values[w0].dims[:1]
        if f.view_root(xu) != root or values[u0].dims != values[w0].dims or kind != kind_u:
            continue
        if not (values[out].dims == values[gate].dims == values[up].dims == dims):
            continue
        # gate and up hold the two products when the rows are too many for the fused GEMV
        weights = (wg, wu) if kind is None else (wg[2], *wg[:2], *wu[:2])
        replace[k] = (FUSED[kind and "q4"]["silu_mul"], (root, *weights, f.new_list((out, gate, up))))
        drop.update((ig, iu, *vg, *vu))
    f.rewrite(replace, drop)
    return len(replace)


def _fuse_residual(graph):
    """residual + view(linear(x, w)) (either order, alpha 1), the residual computed before it; a
    float linear with a bias too (pte_wgpu.linear_bias_residual)."""
    f = _Linears(graph)
    values, replace, drop = graph.values, {}, set()
    for k, (name, args) in enumerate(graph.calls):
        if name != ADD or len(args) != 4 or values[args[2]].value not in (1, None):
            continue
        out = args[-1]
        for e, residual in ((args[1], args[0]), (args[0], args[1])):
            i, views = f.through_views(e, lambda i: f.linear(i) or f.dq8_linear(i) or f.biased_linear(i))
            if i is None or i in drop or not f.before(residual, i) or f.uses[e] != 1:
                continue
            if not (values[residual].dims == values[e].dims == values[out].dims) or values[out].dtype not in FLOATS:
                continue
            if values[e].dtype != values[out].dtype:  # the epilogue rounds the product to the sum's type, as the add read it
                continue
            if dq8 := f.dq8_linear(i):
                replace[i] = (DQ8_LINEAR_RESIDUAL, (*dq8, residual, out))
            elif biased := f.biased_linear(i):
                x, w, bias, _ = biased
                replace[i] = (LINEAR_BIAS_RESIDUAL, (x, w, bias, residual, out))
            else:
                x, w, _, kind = f.linear(i)
                replace[i] = (FUSED[kind and "q4"]["residual"], (x, *(w if kind else (w,)), residual, out))
            drop.update((k, *views))
            break
    f.rewrite(replace, drop)
    return len(replace)


def _fuse_groups(graph):
    """Linears of views of one value (same dims), placed at the first, which gets all weights;
    ones with biases of their outputs group with their like (`pte_wgpu.linear_bias_group`,
    `pte_wgpu.q4_linear_bias_group`)."""
    f = _Linears(graph)
    values, groups = graph.values, {}
    for i in range(len(graph.calls)):
        if found := f.linear(i) or f.linear(i, biased=True):
            x, kind = found[0], found[3]
            groups.setdefault((f.view_root(x), values[x].dims, kind), []).append(i)
    replace, drop = {}, set()
    for (_, _, kind), members in groups.items():
        biased = kind is not None and kind[-1] == "bias"
        linear = functools.partial(f.linear, biased=biased)
        while len(members) > 1:
            first, chunk = members[0], [members[0]]
            for i in members[1:]:
                if len(chunk) < MAX_GROUP and f.before_all(linear(i)[1], first):
                    chunk.append(i)
            members = [i for i in members if i not in chunk]
            if len(chunk) < 2:
                continue
            x = linear(first)[0]
            weights = [linear(i)[1] for i in chunk]
            outs = [linear(i)[2] for i in chunk]
            if kind is None:
                name = LINEAR_GROUP
            elif kind[0] == "float":  # each (weight, bias)
                name, weights = LINEAR_BIAS_GROUP, [v for w in weights for v in w]
            else:  # 4-bit: the group size, then each (weight, scales) or (weight, scales, bias)
                name = Q4_BIAS_GROUP if biased else FUSED["q4"]["group"]
                weights = [weights[0][2], *(v for w in weights for v in (*w[:2], *w[3:]))]
            replace[first] = (name, (x, *weights, f.new_list(outs)))
            drop.update(chunk[1:])
    f.rewrite(replace, drop)
    return len(replace)


def _fuse_norms(graph):
    """rms_norm(x, gamma, eps) whose result (or its one view, same last dim) only a fused linear
    reads, as its input."""
    calls, values, uses = graph.calls, graph.values, value_uses(graph)
    readers = _readers(graph)
    fused = 0
    for i, (name, args) in enumerate(calls):
        if name != RMS_NORM or len(args) != 4 or uses[args[-1]] != 1 or args[-1] not in readers:
            continue
        x, gamma, _, src = args
        j = readers[src][0]
        if calls[j][0] in VIEWS and values[calls[j][1][-1]].dims[-1:] == values[src].dims[-1:]:
            src = calls[j][1][-1]
            j = readers.get(src, [None])[0] if uses[src] == 1 else None
        if j is None or calls[j][0] not in NORM_READERS or calls[j][1][0] != src:
            continue
        # the fused GEMV rounds the normalized rows to the type the norm would write them as (an fp16
        # export's first norm reads the f32 embedding and writes halves)
        normed = values[args[-1]]
        if values[x].dims != normed.dims or {values[x].dtype, normed.dtype} - set(FLOATS) or len(values[gamma].dims) != 1:
            continue
        fused_name, fused_args = calls[j]
        calls[j] = (fused_name.replace("pte_wgpu.", "pte_wgpu.rms_"), (*fused_args[:-1], x, gamma, args[2], fused_args[-1]))
        calls[i] = (RMS_NORM_FOR_Q4 if "q4" in fused_name else RMS_NORM_FOR_GEMM, args)
        fused += 1
    return fused


def _pair_norms(graph):
    """Two RMS norms one right after the other (Qwen3's of q and k, over each head's dims), of one
    eps and row length and alike types, the second's input not the first's output: one
    `pte_wgpu.rms_norm_pair` at the first's place."""
    calls, values, drop = graph.calls, graph.values, set()
    for i in range(len(calls) - 1):
        (name, args), (name2, args2) = calls[i], calls[i + 1]
        if i in drop or name != RMS_NORM or name2 != RMS_NORM or len(args) != 4 or len(args2) != 4:
            continue
        (x, gamma, eps, out), (x2, gamma2, eps2, out2) = args, args2
        if x2 == out or not all(isinstance(values[v], Tensor) for v in (x, gamma, out, x2, gamma2, out2)):
            continue
        if values[eps].value != values[eps2].value or values[x].dims[-1:] != values[x2].dims[-1:]:
            continue
        if values[x].dtype != values[x2].dtype or values[out].dtype != values[out2].dtype or not _alike(values, gamma, gamma2):
            continue
        if len(values[gamma].dims) != 1:
            continue
        values.append(ValueList((out, out2)))
        calls[i] = (RMS_NORM_PAIR, (x, gamma, eps, x2, gamma2, len(values) - 1))
        drop.add(i + 1)
    graph.calls[:] = [c for k, c in enumerate(calls) if k not in drop]
    return len(drop)


def fuse_ragged(graph, max_storage_buffers=None):
    """RoPE whose rotated k (and q) feed a ragged_sdpa directly, with that sdpa's v computed before
    the RoPE: one dispatch fewer a layer; the RoPE joins the q/k/v products before it where their
    kernel then binds at most `max_storage_buffers` (None: no limit). Rewrites `graph.calls` in
    place; returns the count."""
    return _unless_malformed(_fuse_ragged, graph, max_storage_buffers)


def _fuse_ragged(graph, max_storage_buffers):
    fused = _share_repeats(graph, GATHERS)
    _hoist_gathers(graph)
    calls, producer = graph.calls, _producers(graph)
    rope_of, into_cache = {}, {ROPE: (5, ROPE_INTO_CACHE), ROPE_HF: (6, ROPE_HF_INTO_CACHE)}  # a RoPE's args (its output last), its ragged form
    for i, (name, args) in enumerate(calls):
        if name in into_cache and len(args) == into_cache[name][0]:
            rope_of.update((item, i) for item in graph.values[args[-1]].items[:2])
    for j, (name, args) in enumerate(calls):
        if name != RAGGED_SDPA:
            continue
        q, k, v, k_cache, v_cache, row_pos, row_seq = args[:7]
        i = rope_of.get(k)
        if i is None or rope_of.get(q) != i or not producer.get(v, -1) < i or len(graph.values[k_cache].dims) != 4:
            continue
        rope_name, rope_args = calls[i]
        calls[i] = (into_cache[rope_name][1], (*rope_args[:-1], v, k_cache, v_cache, row_pos, row_seq, args[-2], rope_args[-1]))
        calls[j] = (RAGGED_SDPA_CACHED, args)
        fused += 1
    return fused + _fuse_rope_into_groups(graph, max_storage_buffers) + _fuse_norms_into_rope(graph)


def _hoist_gathers(graph):
    """Move each gather that the ragged rewrite made (its output in no memory-planning group) to
    right after the last call that writes one of its inputs: the first layer's rotary gathers,
    which every layer reads (_share_repeats), then come before its q/k/v group, whose RoPE can
    then join it as every other layer's does. Not a fusion: the same calls in another order."""
    calls, values = graph.calls, graph.values
    for k in range(len(calls)):
        name, args = calls[k]
        if name not in GATHERS or not args or values[args[-1]].mem_obj is not None:
            continue
        writes = _writes(graph)  # anew: each move shifts the calls between
        at = 1 + max((j for a in args[:-1] for j in writes.get(a, ()) if j < k), default=-1)
        if at < k:
            calls.insert(at, calls.pop(k))


def _outputs(values, args):
    """The values a call of `args` writes."""
    return values[args[-1]].items if args and isinstance(values[args[-1]], ValueList) else args[-1:]


def _fuse_rope_into_groups(graph, max_storage_buffers=None):
    """rope_into_cache(view(q), view(k), fcos, fsin, v', ...) right after (views between) the q/k/v
    group that computes q, k and v (v' that v or a view of it), q and k read by nothing else; where
    the fused kernel's storage buffers (the group's tensors but one of a norm's rows and input, its
    three outputs and the RoPE's) are at most `max_storage_buffers`: 4 fewer where the group's
    epilogue is lean (v and rotated k read by nothing else but the ragged attention, which finds
    them in the caches: RopeEpilogue's `lean`, the fused op's last arg). The same for
    rope_hf_into_cache from table row 0, whose q and k weights then have their rows paired
    (_pair_rotary_rows)."""
    f = _Linears(graph)
    calls, values, drop, fused = graph.calls, graph.values, set(), 0
    groups = {values[args[-1]].items[0]: g for g, (name, args) in enumerate(calls) if name in ROPE_GROUPS}
    for i, (name, args) in enumerate(calls):
        if (name, len(args)) == (ROPE_HF_INTO_CACHE, 12):
            xq, xk, fcos, fsin, start, *rest = args
            hf = isinstance(values[start], Scalar) and values[start].value == 0
            if not hf:
                continue
        elif (name, len(args)) == (ROPE_INTO_CACHE, 11):
            (xq, xk, fcos, fsin, *rest), hf = args, False
        else:
            continue
        v, k_cache, v_cache, row_pos, row_seq, seq_blocks, out = rest
        (q, q_chain), (k, k_chain), (v_out, _) = (_viewed(f, x) for x in (xq, xk, v))
        g = groups.get(q)  # the group whose first product is q
        if g is None:
            continue
        tables, dim = (fcos, fsin), values[k_cache].dims[-1]
        if (
            values[calls[g][1][-1]].items != (q, k, v_out)
            or any(name not in VIEWS for name, _ in calls[g + 1 : i])
            or any(f.uses[x] != 1 for x in (*q_chain, *k_chain))
            or not all(f.before(t, g) for t in (*tables, row_pos, row_seq, seq_blocks))
            or values[q].dims[-1] % dim
        ):
            continue
        group_name, group_args = calls[g]
        oq, ok = values[out].items[:2]
        lean = all(_read_by_cached_attention_alone(f, x, i) for x in (v_out, ok))
        reads = sum(isinstance(values[a], Tensor) for a in group_args[:-1]) - (fused_operands(group_name, group_args)[2] is not None)  # the rows or their norm's input
        bound = reads + 3 + len(ROPE_NAMES) - (LEAN_UNBOUND if lean else 0)
        if max_storage_buffers is not None and bound > max_storage_buffers:
            continue
        rd = values[fcos].dims[-1]  # the rotate-half RoPE's rotated dims of a head (its table's width)
        if hf and not (rd % 2 == 0 and rd <= dim and _pair_rotary_rows(graph, f.uses, group_name, group_args, dim, rd)):
            continue
        outs = f.new_list((q, k, v_out, oq, ok))
        values.append(Scalar(lean))
        rope_args = (*tables, k_cache, v_cache, row_pos, row_seq, seq_blocks, len(values) - 1)
        calls[g] = (group_name + ("_rope_hf" if hf else "_rope"), (*group_args[:-1], *rope_args, outs))
        drop.add(i)
        fused += 1
    f.rewrite({}, drop)
    _drop_dead_views(graph)
    return fused


def _read_by_cached_attention_alone(f, vid, rope):
    """Whether no call but the RoPE at `rope` reads `vid` or a view of it, bar
    `pte_wgpu.ragged_sdpa_cached`'s k and v, which it finds in the caches instead."""
    viewed = [vid]
    while viewed:
        x = viewed.pop()
        for j, (name, args) in enumerate(f.calls):
            if j == rope or x not in args[:-1]:
                continue
            if name in VIEWS and args[0] == x:
                viewed.append(args[-1])
            elif not (name == RAGGED_SDPA_CACHED and x not in (args[0], *args[3:-1])):
                return False
    return True


def _fuse_norms_into_rope(graph):
    """rope_hf_into_cache(view(q'), view(k'), ...) of the two results of an rms_norm_pair (q' and k'
    read by nothing else, through views of their shape: Qwen3's q and k norms before its RoPE)
    becomes one `pte_wgpu.rms_norm_pair_rope_hf_into_cache` at the RoPE's place."""
    f = _Linears(graph)
    calls, values, drop = graph.calls, graph.values, set()
    pairs = {values[args[-1]].items: n for n, (name, args) in enumerate(calls) if name == RMS_NORM_PAIR}
    for i, (name, args) in enumerate(calls):
        if (name, len(args)) != (ROPE_HF_INTO_CACHE, 12):
            continue
        (q, q_chain), (k, k_chain) = _viewed(f, args[0]), _viewed(f, args[1])
        n = pairs.get((q, k))
        if n is None:
            continue
        x, gamma, eps, x2, gamma2, _ = calls[n][1]
        if any(f.uses[v] != 1 for v in (*q_chain, *k_chain)) or not (_alike(values, x, args[0]) and _alike(values, x2, args[1])):
            continue
        calls[i] = (RMS_NORM_PAIR_ROPE, (x, gamma, eps, x2, gamma2, *args[2:]))
        drop.add(n)
    f.rewrite({}, drop)
    _drop_dead_views(graph)
    return len(drop)


def _pair_rotary_rows(graph, uses, group_name, group_args, dim, rd):
    """Lay out the constants of the q and k products of a q/k/v group (weights [N, C], 4-bit
    scales in row quads, biases [N]) for a rotate-half RoPE of the first `rd` of each `dim` dims:
    a head's rows d and d + rd / 2 (d < rd / 2) at 2d and 2d + 1, the rest where they were, so that
    its pairs are the interleaved RoPE's (output n and n ^ 1). Each tensor in place, its rows
    taken in that order at load (Constant.order). Only where every one is a constant that the
    group alone reads; returns whether it did."""
    values, q4 = graph.values, "q4_" in group_name
    operands, per, _ = fused_operands(group_name, group_args)
    tensors, paired = [], []
    for product in (0, 1):
        mine = operands[product * per : (product + 1) * per]
        n = values[mine[0]].dims[0] if isinstance(values[mine[0]], Tensor) and values[mine[0]].dims else 0
        order = _pair_order(n, dim, rd) if n and n % dim == 0 else ()
        for at, vid in enumerate(mine):
            tensors.append(vid)
            paired.append(_paired(values[vid], order, q4 and at == 1) if order and uses[vid] == 1 else None)
    if None in paired:
        return False
    for vid, t in zip(tensors, paired):
        values[vid] = t
    return True


def _pair_order(n, dim, rd):
    """Which row of n = heads x `dim` rows each row of the paired layout holds (_pair_rotary_rows)."""
    half = rd // 2
    within = [half * (p % 2) + p // 2 if p < rd else p for p in range(dim)]
    return tuple(h * dim + d for h in range(n // dim) for d in within)


def _paired(t, order, scales):
    """Constant tensor t (4-bit `scales` in row quads [N / 4, groups, 4], else [N] or [N, C]) with its
    rows taken in `order` (of N) at load; None where t is not such a tensor."""
    c = t.constant if isinstance(t, Tensor) else None
    if c is None or c.rows is not None or c.order is not None or not t.dims:
        return None
    n = len(order)
    if scales:  # the file's [groups, N], laid out [N / 4, groups, 4] after (scales_in_row_quads)
        if len(t.dims) != 3 or 4 * t.dims[0] != n or c.permuted != ((t.dims[1], n // 4, 4), (1, 0, 2)):
            return None
        taken = ((t.dims[1], n), 1, order)
    else:
        if len(t.dims) > 2 or t.dims[0] != n or c.permuted is not None:
            return None
        taken = (t.dims, 0, order)
    return dataclasses.replace(t, constant=dataclasses.replace(c, order=taken))


def _viewed(f, vid):
    """(the value `vid` views through any views, [vid and each value between])."""
    chain = [vid]
    while (i := f.producer.get(vid)) is not None and f.calls[i][0] in VIEWS:
        vid = f.calls[i][1][0]
        chain.append(vid)
    return vid, chain


def _drop_dead_views(graph):
    """Views whose result nothing reads any more (they fed a fused op's former inputs)."""
    while True:
        uses = value_uses(graph)
        dead = {i for i, (name, args) in enumerate(graph.calls) if name in VIEWS and uses[args[-1]] == 0}
        if not dead:
            return
        graph.calls[:] = [c for i, c in enumerate(graph.calls) if i not in dead]
