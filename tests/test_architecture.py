"""The rooms of the code and their layering (ARCHITECTURE.md), checked from the imports themselves.

Every import counts, a lazy one inside a function too: a module may import its own layer or a lower
one, never a higher one, and no chain of imports comes back to where it started.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("resize", "kernels", "async_runtime")

# Lowest first. A module's layer is that of the longest prefix of its name listed here.
LAYERS = [
    ("resize",),
    ("kernels",),
    ("async_runtime.errors",),
    ("async_runtime.program",),
    ("async_runtime",),  # the runtime core: model, session, scheduler, batching, device, ...
    ("async_runtime.llm",),
    ("async_runtime.__init__",),  # the public API, which re-exports `generate` from llm
    ("async_runtime.testing", "async_runtime.tools", "async_runtime.__main__"),
]


def layer_of(module):
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    return best[0]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts)  # a package's own name ends in ".__init__"


def imports_of(path):
    """The project modules `path` imports (absolute names; `pkg.__init__` for a package itself)."""
    name = module_name(path)
    package = name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] in PACKAGES:
                found.add(t)
    return found


def resolve(target, modules):
    """The module a dotted import name is: a module, a package (`.__init__`), or an attribute of one."""
    while target:
        if target in modules:
            return target
        if target + ".__init__" in modules:
            return target + ".__init__"
        target = target.rpartition(".")[0]
    return None


def project_modules():
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def edges():
    modules = project_modules()
    out = {}
    for name, path in modules.items():
        deps = {resolve(t, modules) for t in imports_of(path)} - {None, name}
        # importing a submodule also runs its packages' __init__: those are not edges of their own
        out[name] = {d for d in deps if not name.startswith(d.removesuffix("__init__"))}
    return out


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
        for m, deps in edges().items() for d in deps if layer_of(d) > layer_of(m)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    graph = edges()
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def test_every_room_says_what_it_holds_and_may_import():
    for room in ("async_runtime/program", "async_runtime/llm", "async_runtime/testing", "async_runtime/tools"):
        doc = ast.get_docstring(ast.parse((ROOT / room / "__init__.py").read_text()))
        assert doc and "import" in doc, f"{room}/__init__.py needs a docstring naming what it may import"


def test_the_checker_sees_an_upward_import_and_a_cycle():
    assert layer_of("kernels.linear") < layer_of("async_runtime.model") < layer_of("async_runtime.llm.server")
    assert layer_of("async_runtime.program.graph") < layer_of("async_runtime.session")
    assert layer_of("async_runtime.errors") < layer_of("async_runtime.program.pte")
    assert resolve("async_runtime.program.graph.link", project_modules()) == "async_runtime.program.graph"
    deps = edges()
    assert "async_runtime.program.graph" in deps["async_runtime.model"]
    assert "kernels.registry" in deps["kernels.__init__"]
