"""The C++ kernels of the CPU path for tests: skipped where the machine has no C++ compiler
(the engine then runs the PyTorch path), a failure where it has one and the build broke."""

from __future__ import annotations

import shutil

import pytest

from specserve_kernels.cpu import cpu_ops


def require_cpu_kernels():
    ops = cpu_ops()
    if ops is None:
        if shutil.which("c++") is None:
            pytest.skip("no C++ compiler on this machine: the engine uses the PyTorch path")
        pytest.fail("the C++ CPU kernels did not build (see the warning logged by specserve_kernels.cpu)")
    return ops
