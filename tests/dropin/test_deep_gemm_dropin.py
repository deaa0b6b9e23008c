"""The ``deep_gemm`` drop-in (issues 23, 40): the facade served as ``deep_gemm`` by the import hook (module paths,
the names each consumer resolves, the documented absences, the version), a distribution that owns no ``deep_gemm/``
files and whose ``.pth`` hook is cheap and off unless ``DFG_AS_DEEP_GEMM=1``, and real installs into a fresh venv
from local paths (no index): the drop-in alone, and beside a stub wheel that owns ``deep_gemm/`` files the way
sgl-deep-gemm does, installed in both orders, each uninstalled with the other left intact.

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
    "cublaslt_gemm_nt": False, "fp8_gemm_nt": True, "fp8_einsum": True, "m_grouped_fp8_gemm_nt_contiguous": True,
    "fp8_m_grouped_gemm_nt_masked": True, "m_grouped_fp8_fp4_gemm_nt_contiguous": True, "fp8_fp4_mqa_logits": True,
    "fp8_fp4_paged_mqa_logits": True, "get_paged_mqa_logits_metadata": True, "tf32_hc_prenorm_gemm": True,
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
ABSENT = ("k_grouped_bf16_gemm_tn_contiguous", "cublaslt_gemm_nt",
          "cublaslt_gemm_nn", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
          "k_grouped_fp8_gemm_tn_contiguous", "fp8_gemm_nt_skip_head_mid", "bf16_mega_moe", "SymmBuffer")


@pytest.fixture(scope="module")
def deep_gemm():
    """``deep_gemm`` through the import hook, in-process, with no other provider (the install tests below install
    the distribution)."""
    from deep_fp8_gemm.compat import dropin

    saved = {k: v for k, v in sys.modules.items() if k == "deep_gemm" or k.startswith("deep_gemm.")}
    dropin.disable()
    dropin.enable()
    try:
        module = importlib.import_module("deep_gemm")
        importlib.import_module("deep_gemm.utils.layout")
        yield module
    finally:
        dropin.disable()
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
    doc = (REPO / "docs" / "dropin.md").read_text()
    for name, provided in VLLM_NAMES.items():
        assert hasattr(deep_gemm, name) == provided, name
        assert re.search(rf"`{name}\b", doc), f"docs/dropin.md does not list {name}"
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


def test_no_distribution_owns_deep_gemm_files_and_the_hook_reads_one_variable():
    # Issue 40: the drop-in installs the hook package and its .pth only; deep_fp8_gemm's own distribution never
    # contains a top-level deep_gemm either (installing either cannot overwrite or delete another DeepGEMM's files).
    pyproject = (DROPIN / "pyproject.toml").read_text()
    assert 'packages = ["deep_fp8_gemm_dropin"]' in pyproject and not (DROPIN / "deep_gemm").exists()
    assert (DROPIN / "deep_fp8_gemm_dropin.pth").read_text() == (
        "import deep_fp8_gemm_dropin; deep_fp8_gemm_dropin.install_from_environment()\n")
    hook = (DROPIN / "deep_fp8_gemm_dropin" / "__init__.py").read_text()
    assert re.findall(r"^(?:import|from) (\S+)", hook, re.M) == ["os", "sys"]  # no torch at interpreter start
    assert re.findall(r'"(DFG_[A-Z_]+)"', hook) == ["DFG_AS_DEEP_GEMM"]
    assert not (REPO / "deep_gemm").exists()
    setup = (REPO / "setup.py").read_text()
    assert 'find_packages(include=["deep_fp8_gemm", "deep_fp8_gemm.*"])' in setup


def test_every_name_is_in_the_docs_table(deep_gemm):
    """Every export is in docs/dropin.md's name table (tests/test_docs.py also checks each row's status)."""
    section = (REPO / "docs" / "dropin.md").read_text().split("## The name table", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)", section))
    missing = [n for n in deep_gemm.__all__ if n not in listed and n not in ("layout", "math", "testing", "utils")]
    assert not missing, f"docs/dropin.md's name table does not list {missing}"


# ---------------------------------------------------------------------------------------------- install
def _pip_available() -> str | None:
    result = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    return None if result.returncode == 0 else f"pip is not available: {result.stderr.strip()[:200]}"


requires_pip = pytest.mark.skipif(_pip_available() is not None, reason=str(_pip_available()))


class Venv:
    """A fresh venv that sees this environment's packages (torch, pip, setuptools, the deep_fp8_gemm under test,
    first) through a .pth; it gets only what pip installs into it. pip runs offline (local paths only)."""

    def __init__(self, root: Path):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
        self.python = str(root / "bin" / "python")
        self.site = Path(self.run("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
        parents = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        under_test = str(Path(deep_fp8_gemm.__file__).resolve().parent.parent)
        lines = [f"import sys; sys.path.insert(0, {under_test!r})"]
        lines += [f"import site; site.addsitedir({p!r})" for p in dict.fromkeys(parents)]
        (self.site / "_parent_env.pth").write_text("\n".join(lines) + "\n")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "DFG_AS_DEEP_GEMM")}
        self.env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")

    def run(self, script: str, **env) -> subprocess.CompletedProcess:
        full = {**getattr(self, "env", os.environ), **env}
        return subprocess.run([self.python, "-c", textwrap.dedent(script)], env=full, capture_output=True,
                              text=True, timeout=300)

    def pip(self, *args: str) -> None:
        result = subprocess.run([self.python, "-m", "pip", *args], env=self.env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, f"pip {' '.join(args)}\n{result.stdout}\n{result.stderr}"


#: What a process with the hook on reports (which module deep_gemm is, its provider, a forwarded name).
PROBE = """
    import importlib.util, sys
    import deep_gemm, deep_gemm.utils.layout, deep_gemm.testing
    from deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor
    print(deep_gemm.__name__, getattr(deep_gemm, "PROVIDER", "-"), deep_gemm.provider_of("cublaslt_gemm_nt"),
          hasattr(deep_gemm, "cublaslt_gemm_nt"), sep="|")
    """


@requires_pip
def test_install_the_drop_in_alone(tmp_path):
    """docs/dropin-install.md's pip command into a fresh venv: the hook package and its .pth, no deep_gemm/; off by default
    (no deep_gemm, no torch imported at start-up); on with DFG_AS_DEEP_GEMM=1, every vLLM name as documented."""
    venv = Venv(tmp_path / "venv")
    venv.pip("install", "--no-build-isolation", "--no-deps", str(DROPIN))
    assert (venv.site / "deep_fp8_gemm_dropin.pth").is_file() and not (venv.site / "deep_gemm").exists()
    startup = "import sys; print('torch' in sys.modules, [type(f).__name__ for f in sys.meta_path][0])"
    default = venv.run(startup).stdout.split()
    assert default[0] == "False" and default[1] != "StandInFinder", default
    on = venv.run(startup, DFG_AS_DEEP_GEMM="1")
    assert on.stdout.split() == ["False", "StandInFinder"], on.stderr
    off = venv.run("import deep_gemm")
    assert off.returncode != 0 and "No module named 'deep_gemm'" in off.stderr
    bad = venv.run(startup, DFG_AS_DEEP_GEMM="yes")
    assert "DFG_AS_DEEP_GEMM must be 1" in bad.stderr and "StandInFinder" not in bad.stdout
    script = f"""
        import importlib.util, warnings
        spec = importlib.util.find_spec("deep_gemm")  # vLLM's has_deep_gemm
        assert spec is not None, spec
        warnings.simplefilter("error")
        import deep_gemm, deep_gemm.utils.layout, deep_gemm.testing
        from deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor
        missing = [n for n, provided in {VLLM_NAMES!r}.items() if hasattr(deep_gemm, n) != provided]
        assert not missing, missing
        print(deep_gemm.__version__)
        """
    run = venv.run(script, DFG_AS_DEEP_GEMM="1")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"2.6.1+dfg.{deep_fp8_gemm.__version__}"


def _stub_wheel(tmp_path: Path) -> Path:
    """A wheel of distribution ``stub-sgl-deep-gemm`` owning ``deep_gemm/`` files as sgl-deep-gemm 0.2.3.post2's
    does (top_level.txt ``deep_gemm``), built offline with pip wheel."""
    from tests.dropin import _stubs

    src = _stubs.write_site_package(tmp_path / "stub_src")
    (src / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "stub-sgl-deep-gemm"
        version = "0.2.3.post2"
        [tool.setuptools]
        packages = ["deep_gemm", "deep_gemm.utils", "deep_gemm.testing", "deep_gemm.mega"]
        """))
    out = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                             str(out), str(src)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PIP_NO_INDEX": "1"})
    assert result.returncode == 0, result.stderr
    return next(out.glob("stub_sgl_deep_gemm-*.whl"))


@requires_pip
def test_beside_a_wheel_that_owns_deep_gemm_files_in_both_orders(tmp_path):
    """Issue 40: installed beside a distribution that owns deep_gemm/ (as sgl-deep-gemm does), in either order,
    neither overwrites the other; uninstalling either leaves the other intact. Hook off: deep_gemm is the other
    distribution's; on: the facade, forwarding to it."""
    stub = _stub_wheel(tmp_path)
    venv = Venv(tmp_path / "venv")
    stub_files = lambda: sorted(str(p.relative_to(venv.site)) for p in (venv.site / "deep_gemm").rglob("*.py"))

    def check_both() -> None:
        assert venv.run("import deep_gemm; print(deep_gemm.PROVIDER)").stdout.strip() == "site-packages stub"
        on = venv.run(PROBE, DFG_AS_DEEP_GEMM="1")
        assert on.returncode == 0, on.stderr
        name, _, served_by, present = on.stdout.strip().split("|")
        assert name == "deep_fp8_gemm.compat.deep_gemm" and present == "True"
        assert served_by == "stub-sgl-deep-gemm 0.2.3.post2 (site-packages deep_gemm)"

    venv.pip("install", "--no-build-isolation", "--no-deps", str(DROPIN))  # ours first, then the stub
    venv.pip("install", "--no-deps", str(stub))
    expected = stub_files()
    assert len(expected) == 8 and (venv.site / "deep_fp8_gemm_dropin.pth").is_file()
    check_both()
    venv.pip("uninstall", "-y", "stub-sgl-deep-gemm")  # ours intact
    assert not (venv.site / "deep_gemm").exists() and (venv.site / "deep_fp8_gemm_dropin" / "__init__.py").is_file()
    alone = venv.run(PROBE, DFG_AS_DEEP_GEMM="1")
    assert alone.stdout.strip() == "deep_fp8_gemm.compat.deep_gemm|-|None|False", alone.stderr
    venv.pip("install", "--no-deps", str(stub))
    venv.pip("uninstall", "-y", "deep-fp8-gemm-dropin")  # the stub intact
    assert stub_files() == expected and not (venv.site / "deep_fp8_gemm_dropin.pth").exists()
    stub_only = venv.run("import deep_gemm, deep_gemm.utils.dist; print(deep_gemm.PROVIDER)", DFG_AS_DEEP_GEMM="1")
    assert stub_only.stdout.strip() == "site-packages stub", stub_only.stderr  # the variable alone does nothing
    venv.pip("install", "--no-build-isolation", "--no-deps", str(DROPIN))  # the stub first, then ours
    assert stub_files() == expected
    check_both()


def test_the_hook_and_env_read_dfg_as_deep_gemm_alike(monkeypatch, capsys):
    from deep_fp8_gemm import env

    sys.path.insert(0, str(DROPIN))
    try:
        hook = importlib.import_module("deep_fp8_gemm_dropin")
    finally:
        sys.path.remove(str(DROPIN))
    for value, on in (("1", True), ("0", False), ("", False), (" 1 ", True)):
        monkeypatch.setenv("DFG_AS_DEEP_GEMM", value)
        assert hook.enabled_by_environment() is on is env.as_deep_gemm()
    monkeypatch.setenv("DFG_AS_DEEP_GEMM", "yes")
    assert hook.enabled_by_environment() is False and "must be 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="DFG_AS_DEEP_GEMM"):
        env.as_deep_gemm()
