"""`python -m tests.prebuild MODULE ...`: the exports that the test modules list in `PREBUILD`
(functions of no arguments that call tests/exporting.py's export_pte), built in that order into
the store named by PTE_WGPU_EXPORT_DIR. tests/conftest.py runs it niced beside the session, so
a test's export is mostly built by the time the test comes; exports a test has already claimed
are skipped, and a failed one is left for its test to build and report."""

import importlib
import os
import sys
import traceback

import pytest

from . import exporting


def main(names):
    os.environ[exporting.PREBUILD_ENV] = "1"  # claimed exports are skipped, not waited for
    for name in names:
        for build in importlib.import_module(name).PREBUILD:
            try:
                build()
            except exporting.Claimed:
                pass
            except (Exception, pytest.skip.Exception):  # the test reports it
                traceback.print_exc()
            exporting._CACHE.clear()


if __name__ == "__main__":
    main(sys.argv[1:])
