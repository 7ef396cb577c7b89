"""`python -m async_runtime inspect model.pte`: what a program holds and what this runtime lacks."""

import argparse
import os
import sys
from collections import Counter

from pte_wgpu.kernels import OPS
from pte_wgpu.kernels.wgsl import elem_bytes
from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import SymInt, Tensor, ValueList

from ..errors import ModelFormatError
from ..program.graph import PRECISIONS, link
from ..program.pte import read_program


def _dynamic_dims(graph, vid):
    """Dims of a tensor that the graph reads with sym_size (the ones that change at run time)."""
    dims = set()
    for name, args in graph.calls:
        if name == "sym_size.int" and args[0] == vid:
            rank = len(graph.values[vid].dims)
            d = graph.values[args[1]].value
            dims.add(d + rank if d < 0 else d)
    return dims


def _describe_value(graph, vid):
    v = graph.values[vid]
    if isinstance(v, Tensor):
        dyn = _dynamic_dims(graph, vid)
        shape = ", ".join(f"<={d}" if i in dyn else str(d) for i, d in enumerate(v.dims))
        flag = " (dynamic)" if dyn or v.dynamic else ""
        return f"{v.dtype}[{shape}]{flag}"
    return "SymInt" if isinstance(v, SymInt) else repr(v)


def inspect(data, out=sys.stdout):
    program = read_program(data)
    for name, method in program.methods.items():
        graph = link(method, check=False)
        print(f"method {name!r}: {len(method.delegates)} delegate(s), {len(graph.kernel_ops)} op(s) outside delegates", file=out)
        for i, vid in enumerate(graph.inputs):
            print(f"  input {i}: {_describe_value(graph, vid)}", file=out)
        for i, vid in enumerate(graph.outputs):
            print(f"  output {i}: {_describe_value(graph, vid)}", file=out)
        weights = activations = 0
        for v in graph.values:
            if isinstance(v, Tensor):
                n = numel_of(v.dims) * elem_bytes(v.dtype)
                if v.constant is not None:
                    weights += n
                else:
                    activations += n
        print(f"  weights: {weights / 2**20:.2f} MiB, activations (max shapes, before sharing): {activations / 2**20:.2f} MiB", file=out)
        _describe_dtypes(graph, out)
        missing = set(graph.missing_ops())
        for title, ops in (("delegate ops", graph.delegate_ops), ("ops outside delegates", graph.kernel_ops)):
            if ops:
                print(f"  {title}:", file=out)
                for op, count in sorted(Counter(ops).items()):
                    mark = "  UNSUPPORTED" if op in missing else ""
                    print(f"    {count:5d}  {op}{mark}", file=out)
        print(f"  unsupported: {', '.join(sorted(missing)) if missing else 'none'}", file=out)


def _describe_dtypes(graph, out):
    """The tensors' dtypes, and how float16 ones will be stored (`load(precision=...)`)."""
    counts = Counter(v.dtype for v in graph.values if isinstance(v, Tensor))
    print("  dtypes: " + ", ".join(f"{n} {dtype}" for dtype, n in sorted(counts.items())), file=out)
    if not counts["float16"]:
        return
    lacking = sorted({name for name, args in graph.calls if name in OPS and not OPS[name].half and _touches_half(graph, args)})
    if lacking:
        print(f"  float16 storage: f32 (widened: no f16 kernel for {', '.join(lacking)})", file=out)
    else:
        print("  float16 storage: f16 on adapters with shader-f16, else f32 (widened)", file=out)


def _touches_half(graph, args):
    for a in args:
        v = graph.values[a]
        items = v.items if isinstance(v, ValueList) else (a,)
        if any(i >= 0 and getattr(graph.values[i], "dtype", None) == "float16" for i in items):
            return True
    return False


def _refuse_open_server(args):
    """Why this server must not start (an open port beyond loopback without a key), or None."""
    import ipaddress

    if args.api_key or args.no_auth:
        return None
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"refusing to serve on {args.host} without an API key: pass --api-key KEY (or set $PTE_WGPU_API_KEY), "
            "or --no-auth to serve without one")


def _serve(args):
    from ..llm.middleware import log_requests_to_stderr
    from ..llm.tokenizer import Tokenizer

    refusal = _refuse_open_server(args)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    tokenizer = Tokenizer.load(args.tokenizer) if args.tokenizer else Tokenizer.for_model(args.pte)
    options = dict(model_name=os.path.splitext(os.path.basename(args.pte))[0], max_sessions=args.max_sessions,
                   max_waiting=args.max_waiting, api_key=args.api_key, max_body_bytes=args.max_body_bytes)
    log_requests_to_stderr()
    if args.replicas or args.max_replicas:
        return _serve_on_ray(args, tokenizer, options)

    import anyio

    from .. import load
    from ..llm.server import create_app, serve

    async def run():
        async with await load(args.pte, precision=args.precision, batch_invariant=not args.batch_variant) as model:
            app = create_app(model, tokenizer, **options)
            print(f"serving {args.pte} on http://{args.host}:{args.port} ({model.device_info.name})")
            await serve(app, args.host, args.port)

    anyio.run(run, backend=args.backend)
    return 0


def _serve_on_ray(args, tokenizer, options):
    import ray
    from ray import serve

    from ..llm.cluster import APP_NAME, application

    ray.init(address=args.address)  # None starts a local cluster; "auto" joins this host's; "ray://..." a remote one
    serve.start(http_options={"host": args.host, "port": args.port})
    app = application(os.path.abspath(args.pte), tokenizer, replicas=args.replicas or 1, precision=args.precision, batch_invariant=not args.batch_variant,
                      min_replicas=args.min_replicas, max_replicas=args.max_replicas, **options)
    print(f"serving {args.pte} on http://{args.host}:{args.port} with Ray Serve "
          f"({args.replicas or f'{args.min_replicas}-{args.max_replicas}'} replicas)")
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m async_runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="print methods, inputs, outputs, ops and memory of a .pte file")
    p.add_argument("pte")
    from . import bench  # noqa: PLC0415  (the bench subcommand: async_runtime/tools/bench/)

    bench.add_arguments(sub.add_parser("bench", help="tokens/s, resize overhead, CPU split and concurrency on tiny Llama exports"))
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server for a Llama-style .pte")
    p.add_argument("pte")
    p.add_argument("--tokenizer", help="tokenizer.json (default: the one next to the .pte)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=8, help="requests generating at once")
    p.add_argument("--max-waiting", type=int, default=32, help="requests waiting for a slot; past it, 429")
    p.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    p.add_argument("--precision", choices=PRECISIONS, default="auto", help="load()'s: f16-sums lets an fp16 export's tiled products sum in f16")
    p.add_argument("--batch-variant", action="store_true",
                   help="load(batch_invariant=False): tensor cores for passes of 9-16 rows; a request's tokens may then depend on the others'")
    p.add_argument("--api-key", default=os.environ.get("PTE_WGPU_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/ (default: $PTE_WGPU_API_KEY)")
    p.add_argument("--no-auth", action="store_true", help="serve beyond loopback without an API key")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    p.add_argument("--replicas", type=int, help="serve with Ray Serve: this many replicas, one GPU each")
    p.add_argument("--min-replicas", type=int, default=1, help="with --max-replicas: autoscaling's lower bound")
    p.add_argument("--max-replicas", type=int, help="autoscale with Ray Serve from the requests queued")
    p.add_argument("--address", help="the Ray cluster to join ('auto', 'ray://host:10001'); default: start one here")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        return bench.run(args)
    if args.command == "inspect":
        with open(args.pte, "rb") as f:
            data = f.read()
        try:
            inspect(data)
        except ModelFormatError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0
