"""The ``deep_gemm`` drop-in distribution (``dropin/deep_gemm_dropin``, issue 23): module paths (mismatch 4), the
names each consumer resolves, the documented absences, the version, a second provider reported at import, and a
real install into a fresh venv from local paths (no index).

Consumers cited: vLLM ``vllm/utils/deep_gemm.py`` (``_lazy_init``: ``getattr`` of each name, ``set_pdl(True)`` on
SM90), SGLang ``deep_gemm_wrapper/entrypoint.py`` (``import deep_gemm`` and, at import time, ``from
deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor``), Hugging Face transformers
(``integrations/finegrained_fp8.py``: the names it requires before using the module).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

import deep_fp8_gemm
from deep_fp8_gemm import compat
from deep_fp8_gemm.compat import casts as deep_gemm_casts

REPO = Path(__file__).resolve().parents[2]
DROPIN = REPO / "dropin" / "deep_gemm_dropin"

#: vllm/utils/deep_gemm.py _lazy_init: every name it resolves -> True if provided, False if a documented absence.
VLLM_NAMES = {
    "cublaslt_gemm_nt": False, "fp8_gemm_nt": True, "fp8_einsum": False, "m_grouped_fp8_gemm_nt_contiguous": True,
    "fp8_m_grouped_gemm_nt_masked": True, "m_grouped_fp8_fp4_gemm_nt_contiguous": True, "fp8_fp4_mqa_logits": True,
    "fp8_fp4_paged_mqa_logits": True, "get_paged_mqa_logits_metadata": True, "tf32_hc_prenorm_gemm": False,
    "get_mn_major_tma_aligned_tensor": True, "get_mk_alignment_for_contiguous_layout": True,
    "get_theoretical_mk_alignment_for_contiguous_layout": True, "set_mk_alignment_for_contiguous_layout": True,
    "transform_sf_into_required_layout": True, "pack_ue8m0_to_int": False,
    "get_mn_major_tma_aligned_packed_ue8m0_tensor": False, "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor": False,
    "get_num_sms": True, "set_num_sms": True, "set_pdl": True,
}
#: transformers' required names (the ``utils.`` one is an attribute of deep_gemm.utils).
TRANSFORMERS_NAMES = ("fp8_fp4_gemm_nt", "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
                      "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous", "utils.per_token_cast_to_fp8",
                      "transform_sf_into_required_layout", "transform_weights_for_mega_moe",
                      "get_symm_buffer_for_mega_moe", "get_mk_alignment_for_contiguous_layout", "fp8_fp4_mega_moe")
#: Out of scope (issue 23): absent so probes see them missing.
ABSENT = ("bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt", "m_grouped_bf16_gemm_nt_masked",
          "k_grouped_bf16_gemm_tn_contiguous", "einsum", "fp8_einsum", "tf32_hc_prenorm_gemm", "cublaslt_gemm_nt",
          "cublaslt_gemm_nn", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
          "k_grouped_fp8_gemm_tn_contiguous", "fp8_gemm_nt_skip_head_mid", "bf16_mega_moe", "SymmBuffer")


@pytest.fixture(scope="module")
def deep_gemm():
    """The drop-in imported from its source folder (in-process; the install test below installs it)."""
    saved = {k: v for k, v in sys.modules.items() if k == "deep_gemm" or k.startswith("deep_gemm.")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(DROPIN))
    try:
        module = importlib.import_module("deep_gemm")
        importlib.import_module("deep_gemm.utils.layout")
        yield module
    finally:
        sys.path.remove(str(DROPIN))
        for k in [k for k in sys.modules if k == "deep_gemm" or k.startswith("deep_gemm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_mismatch4_module_paths(deep_gemm):
    from deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor  # SGLang, at import time
    import deep_gemm.testing
    import deep_gemm.utils.math

    assert get_mn_major_tma_aligned_tensor is compat.get_mn_major_tma_aligned_tensor
    for name in ("per_token_cast_to_fp8", "per_block_cast_to_fp8", "per_channel_cast_to_fp8", "align", "ceil_div",
                 "get_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout",
                 "get_tma_aligned_size", "get_mn_major_tma_aligned_tensor"):
        assert hasattr(deep_gemm.utils, name), name
        assert getattr(deep_gemm, name) is getattr(deep_gemm.utils, name), name  # top-level too (from .utils import *)
    assert deep_gemm.utils.per_token_cast_to_fp8 is deep_gemm_casts.per_token_cast_to_fp8
    assert deep_gemm.align(130, 128) == 256 and deep_gemm.utils.math.ceil_div(130, 128) == 2
    for name in ("calc_diff", "count_bytes", "assert_bitwise_equal", "get_arch_major", "test_filter", "ignore_env",
                 "bench", "bench_kineto", "suppress_stdout_stderr", "empty_suppress"):
        assert callable(getattr(deep_gemm.testing, name)), name
    x = torch.randn(8, 8)
    assert deep_gemm.testing.calc_diff(x, x).item() < 1e-12 and deep_gemm.testing.calc_diff(0 * x, 0 * x) == 0.0
    deep_gemm.testing.assert_bitwise_equal(x, x.clone())
    with pytest.raises(AssertionError, match="bitwise mismatch"):
        deep_gemm.testing.assert_bitwise_equal(x, x + 1)
    assert deep_gemm.testing.get_arch_major() == (torch.cuda.get_device_capability()[0] if torch.cuda.is_available()
                                                  else 9)


def test_every_name_vllm_resolves_is_present_or_a_documented_absence(deep_gemm):
    readme = (REPO / "README.md").read_text()
    for name, provided in VLLM_NAMES.items():
        assert hasattr(deep_gemm, name) == provided, name
        assert re.search(rf"`{name}\b", readme), f"the README does not list {name}"
    deep_gemm.set_pdl(True)  # vLLM's _apply_pdl on SM90
    assert deep_gemm.get_pdl() is True
    deep_gemm.set_pdl(False)


def test_transformers_required_names_exist_and_absences(deep_gemm):
    for name in TRANSFORMERS_NAMES:
        obj = deep_gemm
        for part in name.split("."):
            obj = getattr(obj, part)
        assert callable(obj), name
    for name in compat.LOADER_REQUIRED_ENTRIES:
        with pytest.raises(NotImplementedError, match="does not provide it"):
            getattr(deep_gemm, name)()
    for name in ABSENT:
        assert not hasattr(deep_gemm, name), name


def test_version_is_pep440_and_at_least_the_reference(deep_gemm):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    version = Version(deep_gemm.__version__)
    assert version >= Version("2.6.1") and version.local == f"dfg.{deep_fp8_gemm.__version__}"
    assert SpecifierSet(">=2.6.1").contains(version)
    pyproject = (DROPIN / "pyproject.toml").read_text()
    assert f'version = "{deep_fp8_gemm.__version__}"' in pyproject
    assert f'"deep_fp8_gemm=={deep_fp8_gemm.__version__}"' in pyproject
    assert 'name = "deep-fp8-gemm-dropin"' in pyproject and deep_gemm.DISTRIBUTION == "deep-fp8-gemm-dropin"


def test_the_drop_in_reads_no_environment_and_deep_fp8_gemm_ships_no_deep_gemm():
    # DG_* decision (README): the drop-in honours none of the reference's variables; deep_fp8_gemm's own
    # distribution never contains a top-level deep_gemm (installing it alone cannot shadow a real DeepGEMM).
    for path in DROPIN.rglob("*.py"):
        text = path.read_text()
        assert "environ.get" not in text and "getenv" not in text and "environ[" not in text.replace(
            "os.environ[name] = saved", ""), f"{path} reads the environment"
    assert not (REPO / "deep_gemm").exists()
    setup = (REPO / "setup.py").read_text()
    assert 'find_packages(include=["deep_fp8_gemm", "deep_fp8_gemm.*"])' in setup


def test_every_name_is_in_the_readme_table(deep_gemm):
    section = (REPO / "README.md").read_text().split("## Using it as `deep_gemm`", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)", section))
    missing = [n for n in deep_gemm.__all__ if n not in listed and n not in ("layout", "math", "testing", "utils")]
    assert not missing, f"README 'Using it as deep_gemm' does not list {missing}"


# ---------------------------------------------------------------------------------------------- install
def _pip_available() -> str | None:
    result = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    return None if result.returncode == 0 else f"pip is not available: {result.stderr.strip()[:200]}"


@pytest.mark.skipif(_pip_available() is not None, reason=str(_pip_available()))
def test_install_into_a_fresh_venv_from_local_paths(tmp_path):
    """The README's one pip command into a fresh venv (no index), then find_spec, the submodules, every vLLM
    name, and a second provider reported at import."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # This environment's packages (torch, pip, setuptools, deep_fp8_gemm itself) seen from the new venv, with the
    # deep_fp8_gemm under test first: the venv gets only what pip installs into it.
    parents = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    under_test = str(Path(deep_fp8_gemm.__file__).resolve().parent.parent)
    lines = [f"import sys; sys.path.insert(0, {under_test!r})"]
    lines += [f"import site; site.addsitedir({p!r})" for p in dict.fromkeys(parents)]
    (Path(site) / "_parent_env.pth").write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-build-isolation", str(DROPIN)], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, f"{install.stdout}\n{install.stderr}"
    script = textwrap.dedent(f"""
        import importlib.util, warnings
        spec = importlib.util.find_spec("deep_gemm")
        assert spec is not None and spec.origin.startswith({site!r}), spec
        warnings.simplefilter("error")
        import deep_gemm, deep_gemm.utils.layout, deep_gemm.testing
        from deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor
        missing = [n for n, provided in {VLLM_NAMES!r}.items() if hasattr(deep_gemm, n) != provided]
        assert not missing, missing
        print(deep_gemm.__version__)
        """)
    run = subprocess.run([str(python), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"2.6.1+dfg.{deep_fp8_gemm.__version__}"
    # A second distribution providing deep_gemm (its metadata; its files would overwrite ours) is reported.
    other = Path(site) / "deep_gemm-2.6.1.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: deep_gemm\nVersion: 2.6.1\n")
    (other / "top_level.txt").write_text("deep_gemm\n")
    (other / "RECORD").write_text("deep_gemm/__init__.py,,\n")
    run = subprocess.run([str(python), "-c", "import deep_gemm"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "deep_gemm is provided by more than one installed distribution" in run.stderr
    assert "deep-fp8-gemm-dropin 0.1.0" in run.stderr and "deep_gemm 2.6.1" in run.stderr
