"""Fixtures of the drop-in tests: the import hook on, with no other provider or with a stub one
(:mod:`tests.dropin._stubs`), every ``deep_gemm`` / ``vllm`` module and the knobs restored afterwards."""

from __future__ import annotations

import contextlib
import importlib
import sys

import pytest

from deep_fp8_gemm.compat import dropin, provider
from tests.dropin import _stubs


@contextlib.contextmanager
def clean_imports():
    """No deep_gemm / vllm / alias modules, the hook off and the provider forgotten, before and after."""
    def scrub():
        dropin.disable()
        for key in [k for k in sys.modules if k.split(".")[0] in ("deep_gemm", "vllm", provider.ALIAS)]:
            del sys.modules[key]

    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in ("deep_gemm", "vllm")}
    path = list(sys.path)
    scrub()
    try:
        yield
    finally:
        scrub()
        sys.path[:] = path
        sys.modules.update(saved)
        import deep_fp8_gemm as dfg

        dfg.set_pdl(False), dfg.set_num_sms(0), dfg.set_mk_alignment_for_contiguous_layout(128)
        dfg.set_batch_invariant(True)


@pytest.fixture
def no_provider():
    with clean_imports():
        dropin.enable()
        yield importlib.import_module("deep_gemm")


@pytest.fixture
def site_stub(tmp_path):
    """A site-packages deep_gemm (sgl-deep-gemm's layout) on sys.path, the hook on; yields (facade, stub module)."""
    with clean_imports():
        sys.path.insert(0, str(_stubs.write_site_package(tmp_path)))
        dropin.enable()
        dg = importlib.import_module("deep_gemm")
        assert hasattr(dg, "cublaslt_gemm_nt")  # finds and loads the provider
        yield dg, sys.modules[provider.ALIAS]


@pytest.fixture
def vendored_stub(tmp_path):
    """vLLM's vendored copy on sys.path (not yet imported), the hook on; yields the facade."""
    with clean_imports():
        sys.path.insert(0, str(_stubs.write_vllm_vendored(tmp_path)))
        dropin.enable()
        yield importlib.import_module("deep_gemm")
