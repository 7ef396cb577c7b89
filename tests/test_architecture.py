"""The rooms of the code and their layering (ARCHITECTURE.md), checked from the imports themselves.

Every import counts, a lazy one inside a function too: a module may import its own layer or a lower
one, never a higher one, and no chain of imports comes back to where it started.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each folder of the tree and the import name it installs as (pyproject.toml's package-dir): the
# top-level names `resize` and `kernels` belong to other distributions.
IMPORT_NAMES = {"resize": "pte_wgpu.resize", "kernels": "pte_wgpu.kernels", "async_runtime": "async_runtime"}
ROOTS = ("pte_wgpu", "async_runtime")

# Lowest first. A module's layer is that of the longest prefix of its name listed here.
LAYERS = [
    ("pte_wgpu.resize",),
    ("pte_wgpu.kernels",),
    ("async_runtime.errors",),
    ("async_runtime.program",),
    ("async_runtime",),  # the runtime core: model, session, scheduler, batching, device, ...
    ("async_runtime.llm",),
    ("async_runtime.__init__",),  # the public API, which re-exports `generate` from llm
    ("async_runtime.testing", "async_runtime.tools", "async_runtime.__main__"),
]

# Inside `kernels/`: the building blocks every family uses, the families, and what sits above them.
KERNELS = "pte_wgpu.kernels"
BUILDING_BLOCKS = {f"{KERNELS}.{m}" for m in ("registry", "variants", "wgsl")}
# Each family and the families it may import (each family's __init__ says the same in words).
FAMILIES = {
    "attention": set(),
    "matmul": {"attention"},  # RoPE in the q/k/v products' epilogue
    "tensor": {"matmul", "attention"},  # the RMS norm leaves to a fused linear the rows it normalizes itself; a RoPE after a norm pair
    "vision": {"tensor", "matmul"},  # the strided copy; the GEMM template of the implicit-GEMM conv
    "quant": {"vision", "matmul"},  # the int8 convolutions' output shapes; which 4-bit products quantize their rows themselves
}


def layer_of(module):
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    return best[0]


def module_name(path):
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([IMPORT_NAMES[folder], *rest])  # a package's own name ends in ".__init__"


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
            if t.split(".")[0] in ROOTS:
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
    return {module_name(p): p for folder in IMPORT_NAMES for p in (ROOT / folder).rglob("*.py")}


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
    assert layer_of("pte_wgpu.kernels.matmul.linear") < layer_of("async_runtime.model") < layer_of("async_runtime.llm.server")
    assert layer_of("async_runtime.program.graph") < layer_of("async_runtime.session")
    assert layer_of("async_runtime.errors") < layer_of("async_runtime.program.pte")
    assert resolve("async_runtime.program.graph.link", project_modules()) == "async_runtime.program.graph"
    deps = edges()
    assert "async_runtime.program.graph" in deps["async_runtime.model"]
    assert "pte_wgpu.kernels.registry" in deps["pte_wgpu.kernels.__init__"]
    assert family_of("pte_wgpu.kernels.matmul.gemm") == "matmul" and family_of("pte_wgpu.kernels.wgsl") is None


def family_of(module):
    """The kernel family of a module under kernels/ (its sub-package), or None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == KERNELS.split(".") else None


def test_kernels_sit_in_their_families():
    """kernels/ holds the building blocks, fusion and the package itself at the top; every kernel
    sits in a family folder, and every family folder is listed."""
    top = {p.stem for p in (ROOT / "kernels").glob("*.py")}
    assert top == {"__init__", "registry", "variants", "wgsl", "fusion"}, top
    folders = {p.parent.name for p in (ROOT / "kernels").glob("*/__init__.py")}
    assert folders == set(FAMILIES), folders


def test_families_import_only_the_families_they_name():
    wrong = []
    for m, deps in edges().items():
        if m in BUILDING_BLOCKS:
            wrong += [f"{m} (a building block) imports {d}" for d in deps if d.startswith(KERNELS) and d not in BUILDING_BLOCKS]
        elif family_of(m):
            allowed = FAMILIES[family_of(m)] | {family_of(m)}
            wrong += [f"{m} imports {d}" for d in deps if family_of(d) and family_of(d) not in allowed]
            wrong += [f"{m} imports {d}" for d in deps if d.startswith(KERNELS + ".fusion")]
    assert not wrong, "\n".join(wrong)


def test_kernels_fill_shader_templates_one_way():
    """Shader templates are filled by wgsl.fill ($NAME placeholders; kernels/wgsl.py's docstring):
    no str.format in kernels/, and no str.replace of an UPPER_CASE name or a braced one."""
    by_hand = []
    for path in (ROOT / "kernels").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            first = node.args[0] if node.args else None
            named = isinstance(first, ast.Constant) and isinstance(first.value, str) and re.search(r"[A-Z]{2}|[{}]", first.value)
            if node.func.attr == "format" or (node.func.attr == "replace" and named):
                by_hand.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.func.attr}(...)")
    assert not by_hand, "\n".join(by_hand)


def test_fill_refuses_a_placeholder_or_a_value_without_its_counterpart():
    from pte_wgpu.kernels.wgsl import fill

    assert fill("x = ${N}u + $N;", N=2) == "x = 2u + 2;"
    with pytest.raises(KeyError):
        fill("array<$T>", TYPE="f32")
    with pytest.raises(ValueError):
        fill("array<$T>", T="f32", TO="f16")


def test_every_family_says_what_it_holds_and_may_import():
    for family in FAMILIES:
        doc = ast.get_docstring(ast.parse((ROOT / "kernels" / family / "__init__.py").read_text()))
        assert doc and "import" in doc, f"kernels/{family}/__init__.py needs a docstring naming what it may import"


def test_nothing_imports_the_folders_by_their_bare_names():
    """`import kernels` would find Hugging Face's package once installed (and a second copy of ours
    from a checkout, registering every op twice): the tree imports pte_wgpu.kernels."""
    bare = []
    for folder in ("async_runtime", "kernels", "resize", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                bare += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("kernels", "resize")]
    assert not bare, "\n".join(bare)


def test_pyproject_installs_every_package_under_its_import_name():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {module_name(p).removesuffix(".__init__") for folder in IMPORT_NAMES for p in (ROOT / folder).rglob("__init__.py")}
    assert set(config["packages"]) == packages
    assert config["package-dir"] == {v: k for k, v in IMPORT_NAMES.items() if v != k}


def test_no_test_imports_an_example():
    """examples/ holds runnable examples only: what a test needs from one lives in the package."""
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "examples":
                found.append(f"{path.name}: from {node.module}")
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.path.insert", "sys.path.append", "importlib.util.spec_from_file_location"):
                if "examples" in ast.unparse(node):
                    found.append(f"{path.name}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
