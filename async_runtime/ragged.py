"""Which graphs can run many sessions' steps as one ragged pass, and the graph of that pass.

A decoder exported for batch 1 takes tokens `[1, S]` and a start position, keeps its KV caches as
state tensors, and returns the last row's logits. Most of its ops treat the S rows independently
(linear, norms, elementwise, RoPE given each row's frequencies), so the steps of several sessions
can run as one pass over their concatenated rows. Only a few ops are per sequence: the slice of a
position table at the start position, `sdpa_with_kv_cache` (each session's own cache and length),
and the selection of a sequence's last row. `plan_ragged` finds, from the graph alone, the token
axis flowing through every op, and rewrites the per-sequence ops to read per-row tables:

- `row_pos[r]`: the absolute position of row r in its sequence (a table slice becomes a gather, and
  so do the cos and sin tables that Hugging Face's RoPE reads from a start position);
- `row_seq[r]`: the sequence of the pass row r belongs to, and `seq_blocks`: each sequence's block
  table (the caches become pools of blocks of positions, kernels/attention/kv_cache.py);
- `seq_last[b]`: the row index of sequence b's last row (the last-row select becomes a gather, and
  the batch-1 axis before it becomes the sequence axis, up to `max_seqs`);
- `seq_slots[b]`: the slot of sequence b's session in the pools of recurrent states, for a graph
  with short convolutions (LFM2, Qwen3.5) or gated delta rules (Qwen3.5): async_runtime/ragged_states.py.

The token axis may move inward through permutes (a short convolution's channels-first layout)
for elementwise ops; any other op must find it outermost. A graph with any op that mixes rows
(attention without a cache, a reduction over tokens, a view that moves the token axis, a recurrent
state other than a short convolution's or a delta rule's, ...) does not qualify; `plan_ragged` says
why, and it runs per session.
"""

import dataclasses
import math
from dataclasses import dataclass

from pte_wgpu.kernels import OPS, fusion
from pte_wgpu.kernels.attention.kv_cache import table_entries
from pte_wgpu.kernels.tensor import elementwise
from pte_wgpu.resize.values import Scalar, Tensor, ValueList

from .program.graph import Graph, recurrent_states
from .ragged_states import MOVE, SLICE, NotRagged, RecurrentStates

INTS = {"int32", "int64"}
# the ragged graph's inputs, in order (SEQ_SLOTS only where it keeps recurrent states)
TOKENS, ROW_POS, ROW_SEQ, SEQ_LAST, SEQ_BLOCKS, SEQ_SLOTS = range(6)
ELEMENTWISE_MODULES = {elementwise.__name__, fusion.__name__}  # ops registered there map elements to elements
# Ops that map each row to a row: their labelled inputs carry the token axis before the last dim
# (features) or anywhere (integer indices), and their outputs keep it at the same position.
ROW_WISE = {
    "aten.linear.default",
    "pte_wgpu.linear_group",
    "pte_wgpu.linear_silu_mul",
    "pte_wgpu.rms_linear_group",
    "pte_wgpu.linear_bias_group",
    "pte_wgpu.rms_linear_bias_group",
    "pte_wgpu.rms_linear_silu_mul",
    "pte_wgpu.rms_norm_for_gemm",
    "pte_wgpu.rms_norm_for_q4",
    "pte_wgpu.rms_norm_pair",
    "pte_wgpu.q4_linear_group",
    "pte_wgpu.q4_linear_silu_mul",
    "pte_wgpu.rms_q4_linear_group",
    "pte_wgpu.q4_linear_bias_group",
    "pte_wgpu.rms_q4_linear_bias_group",
    "pte_wgpu.rms_q4_linear_silu_mul",
    "et_vk.linear_q4gsw.default",
    "et_vk.linear_dq8ca_q4gsw.default",
    "torchao.choose_qparams_affine.default",
    "pte_wgpu.quantized_rows",
    "pte_wgpu.rms_norm_quantized_rows",
    "et_vk.rms_norm.default",
    "aten.native_layer_norm.default",
    "aten.embedding.default",
    "pte_wgpu.embedding_parts",
    "et_vk.embedding_q4gsw.default",
    "quantized_decomposed.embedding_byte.dtype",
    "quantized_decomposed.embedding_2bit.dtype",
    "quantized_decomposed.embedding_4bit.dtype",
    "et_vk.apply_rotary_emb.default",
}
LAYER_NORM = "aten.native_layer_norm.default"
# row-wise; the output has the residual's shape (the residual: this argument)
LINEAR_RESIDUAL = {"pte_wgpu.linear_residual": 2, "pte_wgpu.linear_bias_residual": 3, "pte_wgpu.q4_linear_residual": 4, "pte_wgpu.q4_linear_dq8_residual": 6}
SAME_SHAPE = {"aten.clone.default", "aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default"}
SELECT = "aten.select_copy.int"
SDPA = "sdpa_with_kv_cache.default"
VIEW = "aten.view_copy.default"
PERMUTE = "aten.permute_copy.default"
SYMINTS = ("et_vk.select_as_symint.default", "add", "sym_size.int", "executorch_prim::neg.Scalar")
NEG = SYMINTS[-1]
FLAGS = ("aten.select_copy.int", "aten.eq.Scalar", "aten._to_copy.default", "aten.clone.default", "aten.sub.Tensor")  # ragged_states._flag
ALONG_LAST = {"aten.cat.default": 1, "aten.split_with_sizes_copy.default": 2, "aten::split_with_sizes_copy.out": 2}  # -> its dim argument
UNSQUEEZE = ("aten.unsqueeze_copy.default", "aten::unsqueeze_copy.out")
EXPAND = ("aten.expand_copy.default", "aten::expand_copy.out")
AFTER_THE_TOKEN_AXIS = (*UNSQUEEZE, *EXPAND, "aten.sum.dim_IntList", "aten::sum.IntList_out")
GATHER_ROWS = "aten.embedding.default"  # table rows by index: what a position slice becomes
ROPE_FROM = "et_vk.apply_rotary_emb_hf.default"  # its cos and sin tables read from a start position


def _is(name, names):
    """Whether op `name` is one of `names` or another name of the same kernel: an op ExecuTorch left
    outside the delegate comes as its portable kernel's name (`aten::embedding.out` for
    `aten.embedding.default`, as a Llama 3's 128k-token embedding does), with the same arguments
    and its output last."""
    return name in names or ("::" in name and name in OPS and any(OPS[name] is OPS.get(n) for n in names))


@dataclass
class Ragged:
    graph: Graph  # the rewritten graph: inputs (tokens, row_pos, row_seq, seq_last, seq_blocks[, seq_slots])
    tokens_input: int  # index of the token input among the method's inputs
    pos_input: int  # index of the start-position input
    output_axes: tuple  # per output: ("rows" | "seqs", axis)
    caches: tuple  # value ids of the KV-cache state tensors (pools of blocks)
    context: int  # positions every cache and position table holds
    max_rows: int
    max_seqs: int
    states: tuple = ()  # value ids of the recurrent states kept a slot a session (pools of slots)


def plan_ragged(graph, max_seqs):
    """The ragged form of `graph`, or NotRagged with the reason it does not qualify."""
    return _Analysis(graph, max_seqs).run()


class _Analysis(RecurrentStates):
    def __init__(self, graph, max_seqs):
        self.g, self.values = graph, graph.values
        # vid -> ("rows"|"seqs", axis) for tensors; "pos", "end", "count" or "-count" for SymInts;
        # "pos", "start" or "keep" for the values of a flag (ragged_states._flag)
        self.labels = {}
        self.calls = []
        self.max_seqs = max_seqs
        self.caches, self.context = [], []
        self.inner = set()  # labelled values whose token axis is not their outermost dim (past a permute)
        self.merged = {}  # labelled values whose token axis holds this many entries a row (a view [-1, ...])

    def run(self):
        self._start_states(recurrent_states(self.g))
        tokens, pos = self._inputs()
        self.max_rows = self.values[self.g.inputs[tokens]].dims[1]
        self.max_seqs = max(1, min(self.max_seqs, self.max_rows))
        values = self.values = list(self.values)
        self.row_pos = self._new(Tensor("int32", (self.max_rows,)))
        self.row_seq = self._new(Tensor("int32", (self.max_rows,)))
        self.seq_last = self._new(Tensor("int32", (self.max_seqs,)))
        self.seq_blocks = self._new(Tensor("int32", (1,)))  # sized below, from the caches' context
        self.seq_slots = self._new(Tensor("int32", (self.max_seqs,))) if self.recurrent else None
        for name, args in self.g.calls:
            self._call(name, args)
        axes = []
        for vid in self.g.outputs:
            label = self.labels.get(vid)
            if not isinstance(label, tuple) or vid in self.merged:
                raise NotRagged(f"output value {vid} does not carry the token axis")
            axes.append(label)
        read_elsewhere = {a for name, args in self.calls if name != "pte_wgpu.ragged_sdpa" for a in args}
        if read_elsewhere & set(self.caches):
            raise NotRagged("a KV cache is read by an op other than sdpa_with_kv_cache")
        for vid, label in self.labels.items():
            if label[0] == "seqs":
                v = values[vid]
                dims = list(v.dims)
                dims[label[1]] = self.max_seqs
                values[vid] = dataclasses.replace(v, dims=tuple(dims))
        if not self.caches:
            raise NotRagged("no sdpa_with_kv_cache: nothing keeps per-session state")
        if set(self.states) != self.recurrent:
            raise NotRagged(f"recurrent state(s) {sorted(self.recurrent - set(self.states))} not written back from their new values")
        contexts = {values[c].dims[1] for c in self.caches}
        if len(contexts) != 1:
            raise NotRagged(f"the KV caches hold different position counts {sorted(contexts)}: one block table cannot serve them")
        values[self.seq_blocks] = Tensor("int32", (self.max_seqs * table_entries(contexts.pop()),))
        inputs = (self.g.inputs[tokens], self.row_pos, self.row_seq, self.seq_last, self.seq_blocks)
        inputs += (self.seq_slots,) if self.states else ()
        graph = Graph(values, inputs, self.g.outputs, self.calls, self.g.delegate_ops, self.g.kernel_ops, self.g.compile_specs)
        return Ragged(
            graph, tokens, pos, tuple(axes), tuple(self.caches), min(self.context), self.max_rows, self.max_seqs, tuple(self.states)
        )

    def _new(self, value):
        self.values.append(value)
        return len(self.values) - 1

    def _inputs(self):
        tokens = pos = None
        for i, vid in enumerate(self.g.inputs):
            v = self.values[vid]
            if not (isinstance(v, Tensor) and v.dtype in INTS):
                raise NotRagged(f"input {i} is not an integer tensor")
            if len(v.dims) == 2 and v.dims[0] == 1 and v.dims[1] > 1 and tokens is None:
                tokens = i
                self.labels[vid] = ("rows", 1)
            elif len(v.dims) == 1 and v.dims[0] == 1 and pos is None:
                pos = i
                self.labels[vid] = "pos"
            else:
                raise NotRagged(f"input {i} {v.dtype}{list(v.dims)} is neither tokens [1, S] nor a position [1]")
        if tokens is None or pos is None:
            raise NotRagged("the method does not take tokens [1, S] and a start position [1]")
        return tokens, pos

    # --- one call -------------------------------------------------------------------------------
    def _call(self, name, args):
        operands = list(self._operands(args))
        if self._state_call(name, args, operands):
            return
        touched = [a for a in operands if a in self.labels]
        if not touched:
            self.calls.append((name, args))
            return
        if name in SYMINTS:
            return self._symint(name, args)
        if name in FLAGS and all(self.labels[a] in ("pos", "start") for a in touched):
            return self._flag(name, args)
        elementwise = getattr(OPS.get(name), "__module__", None) in ELEMENTWISE_MODULES or _is(name, SAME_SHAPE)
        inner = [a for a in touched if a in self.inner]
        if inner and not (elementwise or name == PERMUTE or name == SLICE):
            raise NotRagged(f"{name} reads value {inner[0]}, whose token axis is not its outermost dim")
        if name == PERMUTE:
            return self._permute(args)
        if name == SLICE:
            return self._tail_slice(args) if args[0] in self.labels else self._position_slice(args)
        if name == SDPA:
            return self._sdpa(args)
        if name == SELECT:
            return self._last_row(args)
        if name == ROPE_FROM:
            return self._rope_from_position(args)
        if name in AFTER_THE_TOKEN_AXIS:
            return self._after_the_token_axis(name, args)
        kinds = {self.labels[a] for a in touched}
        if name == VIEW:
            self._view(args)
        elif any(not isinstance(k, tuple) for k in kinds):
            raise NotRagged(f"{name} reads a position or a token count")
        elif elementwise:
            self._elementwise(name, args)
        elif _is(name, ROW_WISE):
            self._row_wise(name, args)
        elif name in ALONG_LAST and self._along_last(args[ALONG_LAST[name]], args[-1]):
            self._row_wise(name, args)
        elif name in LINEAR_RESIDUAL and args[LINEAR_RESIDUAL[name]] in self.labels:
            self._row_wise(name, args)
            self._label(args[-1], *self.labels[args[LINEAR_RESIDUAL[name]]])
        else:
            raise NotRagged(f"{name} is not row-wise along the token axis")
        self.calls.append((name, args))

    def _along_last(self, dim, out):
        """Whether a join or split along `dim` is along its last dim (a linear cut into parts of
        rows, async_runtime/program/tables.py; Qwen3.5's parts of a projection): row-wise."""
        dim, rank = self.values[dim].value, len(self.values[self._outputs(out)[0]].dims)
        return isinstance(dim, int) and dim in (-1, rank - 1)

    def _operands(self, args):
        for a in args[:-1]:
            v = self.values[a]
            if isinstance(v, ValueList):
                yield from (i for i in v.items if i >= 0)
            else:
                yield a

    def _label(self, vid, kind, axis, inner=False, merged=1):
        """Label `vid` as carrying the token axis at `axis`, its outermost non-unit dim unless
        `inner` (a value past a permute, which only elementwise ops and permutes may read), with
        `merged` entries of that axis a row."""
        v = self.values[vid]
        if axis >= len(v.dims) or (not inner and any(d != 1 for d in v.dims[:axis])):
            raise NotRagged(f"value {vid} {list(v.dims)}: the token axis {axis} is not its outermost non-unit dim")
        self.labels[vid] = (kind, axis)
        if inner and any(d != 1 for d in v.dims[:axis]):
            self.inner.add(vid)
        if merged > 1:
            self.merged[vid] = merged

    def _outputs(self, out):
        v = self.values[out]
        return [i for i in v.items if i >= 0] if isinstance(v, ValueList) else [out]

    def _symint(self, name, args):
        out = args[-1]
        labels = [self.labels.get(a) for a in args[:-1]]
        if name == "sym_size.int" and labels[0] == ("rows", 1) and self.values[args[1]].value in (1, -1):
            self.labels[out] = "count"
            self.calls.append((name, args))
        elif name == "et_vk.select_as_symint.default" and labels[0] == "pos":
            self.labels[out] = "pos"
        elif name == "add" and sorted(map(str, labels)) == ["count", "pos"]:
            self.labels[out] = "end"
        elif name == NEG and labels[0] == "count":
            self.labels[out] = "-count"
        else:
            raise NotRagged(f"{name} combines positions or token counts in a way a ragged pass cannot")

    def _position_slice(self, args):
        table, dim, start, end = args[:4]
        v = self.values[table]
        step = self.values[args[4]].value if len(args) > 5 else 1
        if table in self.labels or self.values[dim].value != 0 or step not in (1, None):
            raise NotRagged("a slice along the token axis that is not a position-table lookup")
        float_table = len(v.dims) == 2 and v.dtype in ("float32", "float16")
        if self.labels.get(start) != "pos" or self.labels.get(end) != "end" or not float_table:
            raise NotRagged("a slice of positions that is not table[pos : pos + S] of a 2-d float table")
        self.context.append(v.dims[0])
        self.calls.append((GATHER_ROWS, (table, self.row_pos, args[-1])))
        self._label(args[-1], "rows", 0)

    def _rope_from_position(self, args):
        """Hugging Face's RoPE (Qwen, Phi) reads rows start_pos + s of its cos and sin tables: it
        reads them at row 0 + r of the tables' rows gathered by each row's position."""
        q, k, cos, sin, start = args[:5]
        if any(self.labels.get(t) != ("rows", 1) for t in (q, k)) or self.labels.get(start) != "pos" or cos in self.labels or sin in self.labels:
            raise NotRagged(f"{ROPE_FROM} whose q, k or start position are not per row")
        gathered = []
        for table in (cos, sin):
            v = self.values[table]
            self.context.append(v.dims[0])
            rows = self._new(Tensor(v.dtype, (self.max_rows, *v.dims[1:])))
            self.calls.append((GATHER_ROWS, (table, self.row_pos, rows)))
            self._label(rows, "rows", 0)
            gathered.append(rows)
        self.calls.append((ROPE_FROM, (q, k, *gathered, self._new(Scalar(0)), *args[5:])))
        for out in self._outputs(args[-1]):
            self._label(out, "rows", 1)

    def _sdpa(self, args):
        q, k, v, k_cache, v_cache, start = args[:6]
        if any(self.labels.get(t) != ("rows", 1) for t in (q, k, v)) or self.labels.get(start) != "pos":
            raise NotRagged("sdpa_with_kv_cache whose q, k, v or start position are not per row")
        for cache in (k_cache, v_cache):
            c = self.values[cache]
            if cache in self.labels or c.constant is None or cache in self.caches:
                raise NotRagged(f"KV cache {cache} is not a state tensor of its own")
            self.caches.append(cache)
            self.context.append(c.dims[1])
        self.calls.append(("pte_wgpu.ragged_sdpa", (q, k, v, k_cache, v_cache, self.row_pos, self.row_seq, *args[7:-1], self.seq_blocks, args[-1])))
        self._label(args[-1], "rows", 1)

    def _last_row(self, args):
        src, dim, index = args[:3]
        label = self.labels.get(src)
        axis = label[1] if isinstance(label, tuple) else -1
        if label != ("rows", axis) or self.values[dim].value not in (axis, axis - len(self.values[src].dims)):
            raise NotRagged("a select that is not along the token axis")
        if self.values[index].value != -1 or axis < 1:
            raise NotRagged("a select along the token axis of another row than the last")
        axis_value = self._new(Scalar(axis))
        self.calls.append(("pte_wgpu.last_rows", (src, axis_value, self.seq_last, args[-1])))
        self._label(args[-1], "seqs", axis - 1)

    def _view(self, args):
        """A view that keeps the token count as a dim, or that makes the token axis the outermost
        of [-1, ...] with the dims after it (Qwen3.5's norm of each head's output rows): a row
        then holds several entries of that axis (`merged`), until a view splits them out again."""
        src, sizes, out = args
        kind, axis = self.labels[src]
        v = self.values[sizes]
        items = v.items if isinstance(v, ValueList) else ()
        at = [j for j, i in enumerate(items) if self.labels.get(i) == "count"]
        src_dims, out_dims = self.values[src].dims, self.values[out].dims
        entries = math.prod(src_dims[axis + 1 :]) * self.merged.get(src, 1)  # elements a row
        if kind == "rows" and not at and self._ints(sizes)[:1] == (-1,) and entries % math.prod(out_dims[1:]) == 0:
            return self._label(out, "rows", 0, merged=entries // math.prod(out_dims[1:]))
        if kind != "rows" or len(at) != 1:
            raise NotRagged(f"a view of value {src} that does not keep the token count as a dim")
        j = at[0]
        lead = all(isinstance(self.values[i], Scalar) and self.values[i].value == 1 for i in items[:j])
        if not lead or entries != math.prod(out_dims[j + 1 :]):
            raise NotRagged(f"a view of value {src} that mixes the token axis with others")
        self._label(out, "rows", j)

    def _elementwise(self, name, args):
        tensors = [a for a in args[:-1] if isinstance(self.values[a], Tensor)]
        out = args[-1]
        rank = len(self.values[out].dims)
        found = set()
        for t in tensors:
            dims = self.values[t].dims
            if t in self.labels:
                kind, axis = self.labels[t]
                found.add((kind, axis - len(dims), self.merged.get(t, 1)))
            else:
                found.add(None)
        labelled = {f for f in found if f is not None}
        if len(labelled) != 1:
            raise NotRagged(f"{name} combines tensors with the token axis at different places")
        kind, from_right, merged = labelled.pop()
        for t in tensors:
            dims = self.values[t].dims
            if t not in self.labels and len(dims) >= -from_right and dims[from_right] != 1:
                raise NotRagged(f"{name} broadcasts a tensor along the token axis")
        self._label(out, kind, rank + from_right, inner=any(t in self.inner for t in tensors), merged=merged)

    def _row_wise(self, name, args):
        kinds, axis, merged = set(), None, set()
        for t in self._operands(args):
            if t not in self.labels:
                continue
            kind, a = self.labels[t]
            v = self.values[t]
            if a == len(v.dims) - 1 and v.dtype not in INTS and axis is None:
                raise NotRagged(f"{name} reduces along the token axis")
            kinds.add(kind)
            merged.add(self.merged.get(t, 1))
            axis = a if axis is None else axis
        if len(kinds) != 1 or len(merged) != 1:
            raise NotRagged(f"{name} mixes per-row and per-sequence tensors, or rows of different entries")
        if name == LAYER_NORM and len(self.values[args[1]].items) != 1:
            raise NotRagged(f"{name} normalizes over more than the last dim")
        (kind,), (entries,) = kinds, merged
        for out in self._outputs(args[-1]):
            self._label(out, kind, axis, merged=entries)

    # --- permutes and ops along the dims after the token axis ---------------------------------
    def _ints(self, vid):
        v = self.values[vid]
        return tuple(int(self.values[i].value) for i in v.items) if isinstance(v, ValueList) else tuple(v.items)

    def _permute(self, args):
        src, dims, out = args
        kind, axis = self.labels[src]
        order = [d % len(self.values[src].dims) for d in self._ints(dims)]
        self._label(out, kind, order.index(axis), inner=True)
        self.calls.append((PERMUTE, args))

    def _tail_slice(self, args):
        """x[..., -S:] along the token axis, S the step's token count (Qwen3.5's short convolution
        keeping the last S of its S + 1 outputs, which the ragged convolution gives one a row):
        every labelled value has one entry a row there, so the slice is a copy."""
        src, dim, start, end = args[:4]
        kind, axis = self.labels[src]
        step = self.values[args[4]].value if len(args) > 5 else 1
        rank = len(self.values[src].dims)
        if self.values[dim].value % rank != axis or self.labels.get(start) != "-count" or step not in (1, None):
            raise NotRagged(f"a slice of value {src} along its token axis other than of its last S rows")
        if not isinstance(self.values[end].value, int) or self.values[end].value < self.values[src].dims[axis]:
            raise NotRagged(f"a slice of value {src} along its token axis that stops before its end")
        self.calls.append((MOVE, (src, args[-1])))
        self._label(args[-1], kind, axis, inner=src in self.inner)

    def _after_the_token_axis(self, name, args):
        """unsqueeze, expand and sum along dims past the token axis: row-wise."""
        src, out = args[0], args[-1]
        if not isinstance(self.labels.get(src), tuple):
            raise NotRagged(f"{name} reads a position or a token count")
        kind, axis = self.labels[src]
        if src in self.inner or src in self.merged:
            raise NotRagged(f"{name} reads value {src}, whose token axis is not its outermost dim")
        rank = len(self.values[src].dims)
        if name in UNSQUEEZE:
            at = self.values[args[1]].value % (rank + 1)
            self._label(out, kind, axis + (at <= axis))
        elif name in EXPAND:
            sizes = self.values[args[1]].items
            kept = len(sizes) - rank + axis  # the token axis among the expanded dims
            if self.labels.get(sizes[kept]) != "count" and getattr(self.values[sizes[kept]], "value", None) != -1:
                raise NotRagged(f"{name} of value {src} along its token axis")
            self._label(out, kind, kept)
        else:
            dims = {d % rank for d in self._ints(args[1])}
            if min(dims) <= axis:
                raise NotRagged(f"{name} reduces along the token axis")
            self._label(out, kind, axis)
        self.calls.append((name, args))
