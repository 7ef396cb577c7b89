"""SymInt ops: live scalars computed on the host from live shapes and host input data.

They dispatch nothing (but `move` of a tensor, a copy); their hooks set SymInt values,
which the ops reading them turn into parameter bytes. `select_as_symint` is data-dependent: it reads an element of a host input.
"""

import operator

from pte_wgpu.resize.shapes import normalize_dim, numel_of

from ..registry import op
from .shape import flat_copy


@op("sym_size.int", "aten::sym_size.int", half=True, capacity=True)
def sym_size(b):
    src, dim = b.args[0], b.scalar(1)

    def resize(ctx):
        dims = ctx.dims(src)
        ctx.set_symint(b.out, dims[normalize_dim(dim, len(dims))])

    b.hook(resize)


def _arith(fn):
    def build(b):
        lhs, rhs = b.args[0], b.args[1]

        def resize(ctx):
            ctx.set_symint(b.out, fn(ctx.int_value(lhs), ctx.int_value(rhs)))

        b.hook(resize)

    return build


@op("aten::sym_numel", half=True, capacity=True)
def sym_numel(b):
    src = b.args[0]

    def resize(ctx):
        ctx.set_symint(b.out, numel_of(ctx.dims(src)))

    b.hook(resize)


# SymInt arithmetic and comparisons (a comparison's SymBool is a SymInt holding 0 or 1), by the
# delegate's names and those of ExecuTorch's prim ops outside delegates (executorch_prim::add.Scalar)
SYMINT_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
              "eq": operator.eq, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}  # fmt: skip
PRIM_OPS = {"mod": operator.mod, "sym_max": max, "sym_min": min}
for _name, _fn in SYMINT_OPS.items():
    op(_name, f"executorch_prim::{_name}.Scalar")(_arith(_fn))
for _name, _fn in PRIM_OPS.items():
    op(f"executorch_prim::{_name}.Scalar")(_arith(_fn))


@op("executorch_prim::neg.Scalar")
def neg(b):
    def resize(ctx):
        ctx.set_symint(b.out, -ctx.int_value(b.args[0]))

    b.hook(resize)


@op("et_vk.select_as_symint.default", half=True, capacity=True)
def select_as_symint(b):
    src, dim, index = b.args[0], b.scalar(1), b.scalar(2)

    def resize(ctx):
        data = ctx.host.get(src)
        if data is None:
            raise ValueError(f"select_as_symint reads value {src}, which is not a method input")
        if data.size == 0:
            raise ValueError(f"select_as_symint: input {src} is empty (shape {data.shape})")
        d = normalize_dim(dim, data.ndim)
        i = index + data.shape[d] if index < 0 else index
        if not 0 <= i < data.shape[d]:
            raise ValueError(f"select_as_symint: index {index} is out of range for dim {dim} of shape {data.shape}")
        at = [0] * data.ndim
        at[d] = i
        ctx.set_symint(b.out, int(data[tuple(at)]))

    b.hook(resize)


select_as_symint.data_dependent = True


@op("move", half=True, capacity=True)
def move(b):
    """A MoveCall: the destination takes the source's value (a tensor copy, kernels/tensor/shape.py's
    flat copy, converting when the two are stored differently; or a SymInt)."""
    src, dst = b.args
    if b.is_tensor(0):
        flat_copy(b, src, lambda ctx, dims: dims)
        return

    def resize(ctx):
        ctx.set_symint(dst, ctx.int_value(src))

    b.hook(resize)
