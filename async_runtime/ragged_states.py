"""Recurrent states in a ragged pass: the part of `async_runtime.ragged`'s analysis that rewrites a
state carried whole from call to call (a short convolution's last inputs, a gated delta rule's
matrix) into a pool of slots, one a session, `seq_slots[b]` naming sequence b's.

A graph exported for batch 1 reads such a state, computes its new value from it and the step's
inputs, and writes that back (a `move` into it, or `aten::copy_`). Between the read and the
write, the analysis follows the state as the step starts from it (`views`: the state itself, a
copy of it, a whole-tensor `slice_scatter` of a view, the view times `keep`) and the state's new
value (`news`), and takes only these ops on them:

- a short convolution (LFM2's, Qwen3.5's): `aten.cat([state, x])` along the token axis (its
  window), a depthwise convolution over the window (W + 1 taps, or W taps whose first output the
  model drops) and the slice of the window's last W columns (the new state) become
  `pte_wgpu.ragged_short_conv` and `pte_wgpu.ragged_state_update`
  (kernels/attention/short_conv.py);
- Qwen3.5's `llama::gated_delta_rule` from a view: `pte_wgpu.ragged_gated_delta`, which runs each
  sequence's rows from its slot and leaves the final state there (its new value, written back
  already);
- Qwen3.5's reset at the start of a sequence, `state * keep` with `keep = c - (pos == 0)` of the
  start position, c a scalar tensor (1: a constant of the file, which the analysis does not read):
  the runtime starts a session's slots afresh when its sequence starts at position 0, so the
  product is the state as the sequence left it. The ops of the flag go.

Any other op that reads a view or a new value stops the pass (NotRagged, naming it).
"""

from .program.graph import COPY_INTO

CAT = "aten.cat.default"
SLICE = "aten.slice_copy.Tensor"
CONVOLUTION = "aten.convolution.default"
MOVE = "move"
SCATTER = ("aten.slice_scatter.default", "aten::slice_scatter.out")
DELTA_RULE = "llama::gated_delta_rule.out"


class NotRagged(Exception):
    """The graph cannot run ragged; the message says which op or value stops it."""


class RecurrentStates:
    """The state rewrites of `async_runtime.ragged._Analysis` (which this is a part of: its labels,
    values, calls and the pass's tables)."""

    def _start_states(self, recurrent):
        self.recurrent = set(recurrent)
        self.views = {s: s for s in recurrent}  # value -> the state it holds as the step starts from it
        self.news = {}  # value -> (state, the call writing it into the state's slots, or None: written)
        self.windows = {}  # a state joined with a step's inputs -> (state, inputs)
        self.states = []  # states written back, in order

    def _state_call(self, name, args, operands):
        """Take `name(args)` if it reads or writes a recurrent state; False for any other op."""
        if any(a in self.windows for a in operands):
            self._window_read(name, args)
        elif name == MOVE:
            return self._move(*args)
        elif name == COPY_INTO and args[0] in self.recurrent:
            self._written_into(args[1], args[0])
        elif not any(a in self.views or a in self.news for a in operands):
            return False
        elif name in SCATTER:
            self._scatter(args)
        elif name == CAT:
            self._window(args)
        elif name == "aten.mul.Tensor" and self._reset(args):
            pass
        elif name == DELTA_RULE and args[5] in self.views and not any(a in self.views or a in self.news for a in args[:5]):
            self._delta_rule(args)
        else:
            raise NotRagged(f"{name} reads a recurrent state other than as a short convolution's window or a gated delta rule's initial state")
        return True

    def _move(self, src, dst):
        if src in self.views:
            self.views[dst] = self.views[src]  # a copy of the state, read where the step starts
        elif src in self.news and dst in self.recurrent:
            self._written_into(src, dst)
        elif src in self.news:
            self.news[dst] = self.news[src]
        elif dst in self.recurrent:
            raise NotRagged(f"value {src} written into recurrent state {dst} is not computed as its new value")
        else:
            return False
        return True

    def _written_into(self, new, state):
        """The state's new value `new` written back into it: the write of its slots, once."""
        if self.news.get(new, (None,))[0] != state or state in self.states:
            raise NotRagged(f"recurrent state {state} written back other than once from its new value")
        write = self.news[new][1]
        if write is not None:
            self.calls.append(write)
        self.states.append(state)

    def _scatter(self, args):
        """slice_scatter(dst, src, ...) of a state's view or new value over the whole of another of the
        same state: the result is what `src` is."""
        dst, src, out = args[0], args[1], args[-1]
        state = self._state_of(dst)
        whole = self.values[dst].dims == self.values[src].dims
        if state is None or self._state_of(src) != state or not whole:
            raise NotRagged("a slice_scatter into a recurrent state that is not the whole of its new value or a copy of it")
        if src in self.views:
            self.views[out] = state
        else:
            self.news[out] = self.news[src]

    def _state_of(self, vid):
        """The state that `vid` is a view or the new value of, or None."""
        return self.views[vid] if vid in self.views else self.news[vid][0] if vid in self.news else None

    def _reset(self, args):
        """view * keep, the reset of a state at the start of a sequence: the view."""
        a, b, out = args[0], args[1], args[-1]
        view, flag = (a, b) if a in self.views else (b, a)
        if view not in self.views or self.labels.get(flag) != "keep":
            return False
        self.views[out] = self.views[view]
        return True

    def _flag(self, name, args):
        """The flag `keep = 1 - (start position == 0)` from the start position (labels "pos",
        "start", "keep"): the values the reset reads; no op of it runs in the pass."""
        labels = [self.labels.get(a) for a in args[:-1]]
        values = [getattr(self.values[a], "value", None) for a in args[:-1]]
        out = args[-1]
        scalar = not getattr(self.values[out], "dims", (1,))
        if name == "aten.select_copy.int" and labels[0] == "pos" and scalar:
            self.labels[out] = "pos"
        elif name == "aten.eq.Scalar" and labels[0] == "pos" and values[1] == 0:
            self.labels[out] = "start"
        elif name in ("aten._to_copy.default", "aten.clone.default") and labels[0] == "start":
            self.labels[out] = "start"
        elif name == "aten.sub.Tensor" and labels[:2] == [None, "start"] and not self.values[args[0]].dims and values[2] == 1 and scalar:
            self.labels[out] = "keep"
        else:
            raise NotRagged(f"{name} reads a position or a token count")

    # --- short convolutions --------------------------------------------------------------------
    def _window(self, args):
        """aten.cat([view, x], token axis): a short convolution's window, which only its
        convolution and the slice of its last columns (the state's new value) may read."""
        items, dim, out = self.values[args[0]].items, self.values[args[1]].value, args[-1]
        view, x = (items + (None, None))[:2]
        label = self.labels.get(x)
        rank = len(self.values[out].dims)
        if len(items) != 2 or view not in self.views or not isinstance(label, tuple) or label[0] != "rows" or dim % rank != label[1]:
            raise NotRagged("aten.cat joins a recurrent state with something other than one step's inputs along the token axis")
        state = self.views[view]
        if rank != 3 or label[1] != 2 or self.values[state].dims[:2] != self.values[x].dims[:2]:
            raise NotRagged("aten.cat joins a recurrent state with a step's inputs that are not [1, C, tokens] like it")
        self.windows[out] = (state, x)

    def _window_read(self, name, args):
        window = next(a for a in self._operands(args) if a in self.windows)
        state, x = self.windows[window]
        width = self.values[state].dims[-1]
        if name == SLICE and args[0] == window:
            dim, start, end = (self.values[a].value for a in args[1:4])
            step = self.values[args[4]].value if len(args) > 5 else 1
            if dim % 3 == 2 and start == -width and end >= self.values[window].dims[-1] and step in (1, None):
                self.news[args[-1]] = (state, ("pte_wgpu.ragged_state_update", (x, self.seq_last, self.seq_slots, state)))
                return
            raise NotRagged(f"a slice of a short convolution's window other than its last {width} columns")
        if name == CONVOLUTION and args[0] == window:
            weight = self.values[args[1]]
            stride, padding, dilation = (self._ints(a) for a in args[3:6])
            transposed, groups = self.values[args[6]].value, self.values[args[8]].value
            channels = self.values[state].dims[1]
            if weight.constant is None or tuple(weight.dims) not in ((channels, 1, width + 1), (channels, 1, width)) or groups != channels:
                raise NotRagged(f"a convolution over a short convolution's window that is not depthwise with {width} or {width + 1} taps")
            if set(stride) | set(dilation) != {1} or set(padding) != {0} or transposed:
                raise NotRagged("a convolution over a short convolution's window with stride, dilation or padding")
            out = args[-1]
            self.calls.append(("pte_wgpu.ragged_short_conv", (x, state, args[1], args[2], self.row_seq, self.seq_last, self.seq_slots, out)))
            self._label(out, *self.labels[x], inner=True)
            return
        raise NotRagged(f"{name} reads a short convolution's window (a recurrent state joined with a step's inputs)")

    # --- the gated delta rule ------------------------------------------------------------------
    def _delta_rule(self, args):
        q, k, v, decay, beta, view = args[:6]
        outs = self._outputs(args[-1])
        if any(self.labels.get(t) != ("rows", 2) for t in (q, k, v, decay, beta)) or len(outs) != 2:
            raise NotRagged(f"{DELTA_RULE} whose query, key, value, decay or beta are not [1, H, tokens, ...] per row")
        state = self.views[view]
        out, final = outs
        self.calls.append(("pte_wgpu.ragged_gated_delta", (q, k, v, decay, beta, state, self.seq_last, self.seq_slots, out)))
        self._label(out, "rows", 2, inner=True)
        self.news[final] = (state, None)
