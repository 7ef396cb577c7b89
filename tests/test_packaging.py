"""pte-wgpu installs beside other packages: its wheel claims only its own import names.

The repository keeps `kernels/` and `resize/` at the top, and they install as `pte_wgpu.kernels`
and `pte_wgpu.resize`; Hugging Face's `kernels` (the package `transformers` loads hub kernels
with) owns the top-level name `kernels`. A fresh virtual environment gets both, from a built
wheel of this checkout and from the package registry, and one interpreter imports both.
"""

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What pip prints when the registry cannot be reached (no network, a proxy refusing, DNS).
UNREACHABLE = ("NewConnectionError", "Failed to establish", "Temporary failure in name resolution", "ConnectTimeout",
               "ProxyError", "Network is unreachable", "Could not find a version that satisfies", "No matching distribution")


def pip(python, *args, timeout=600):
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    """A virtual environment holding Hugging Face's `kernels` and this checkout's wheel; the
    runtime's dependencies (numpy, wgpu, anyio) come from the test's own environment, on its path."""
    env = tmp_path_factory.mktemp("side_by_side") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: transformers depends on Hugging Face's kernels, so the test's own environment,
    # on the path, may hold it already; this environment gets its own copy
    hf = pip(python, "install", "--no-deps", "--ignore-installed", "kernels")
    if hf.returncode != 0:
        if any(s in hf.stdout + hf.stderr for s in UNREACHABLE):
            pytest.skip(f"the package registry cannot be reached to install Hugging Face's kernels: {hf.stderr.strip()[-300:]}")
        pytest.fail(f"pip install kernels failed:\n{hf.stdout}{hf.stderr}")
    ours = pip(python, "install", "--no-deps", str(ROOT))
    if ours.returncode != 0:
        if any(s in ours.stdout + ours.stderr for s in UNREACHABLE):
            pytest.skip(f"the package registry cannot be reached for the build's setuptools: {ours.stderr.strip()[-300:]}")
        pytest.fail(f"pip install of this checkout failed:\n{ours.stdout}{ours.stderr}")
    return python, Path(site)


def test_the_wheel_installs_only_its_own_import_names(side_by_side):
    python, site = side_by_side
    probe = textwrap.dedent("""
        import importlib.metadata, json
        files = importlib.metadata.files("pte-wgpu")
        print(json.dumps(sorted({f.parts[0] for f in files if f.suffix == ".py"})))
    """)
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True, cwd=site.parent)
    assert json.loads(out.stdout) == ["async_runtime", "pte_wgpu"]
    assert not (site / "pte_wgpu" / "__init__.py").exists()  # a namespace: other distributions may add to it
    assert (site / "pte_wgpu" / "kernels" / "matmul" / "gemm.py").exists()


def test_both_kernels_packages_import_in_one_interpreter(side_by_side):
    python, site = side_by_side
    probe = textwrap.dedent("""
        import json
        import kernels
        import async_runtime
        import pte_wgpu.kernels
        import pte_wgpu.resize
        print(json.dumps(dict(hf=kernels.__file__, hf_api=hasattr(kernels, "get_kernel"), ours=pte_wgpu.kernels.__file__,
                              ops=len(pte_wgpu.kernels.OPS), runtime=async_runtime.__file__, load=callable(async_runtime.load))))
    """)
    env = dict(os.environ, PYTHONPATH="")  # nothing of the checkout on the path
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=site.parent, env=env)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["hf"] == str(site / "kernels" / "__init__.py") and found["hf_api"]
    assert found["ours"] == str(site / "pte_wgpu" / "kernels" / "__init__.py") and found["ops"] > 200
    assert found["runtime"] == str(site / "async_runtime" / "__init__.py") and found["load"]
