"""The test suite, a package in the checkout's root, which pytest (and `python -m` from the root)
puts first on sys.path. The root's `kernels/` and `resize/` folders install as `pte_wgpu.kernels`
and `pte_wgpu.resize`; at the top level those names belong to other distributions (Hugging Face's
`kernels`, which transformers imports). So an import of either top-level name finds the installed
distribution's package before the root's folder."""

import importlib.abc
import importlib.machinery
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _InstalledBeforeRoot(importlib.abc.MetaPathFinder):
    names = ("kernels", "resize")

    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in self.names:
            return None
        elsewhere = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]
        return importlib.machinery.PathFinder.find_spec(name, elsewhere)


sys.meta_path.insert(0, _InstalledBeforeRoot())
