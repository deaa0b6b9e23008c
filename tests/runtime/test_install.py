"""Packaging: a non-editable install ships the device headers and templates and imports from there,
cheaply; the README's commands and .ci/run agree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_COMMAND = "python -m pytest -q -n auto tests"


def _relative_files(root: Path, suffixes: set[str]) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.suffix in suffixes}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """``pip install --no-deps --target`` of a copy of the source tree (no network, no build isolation)."""
    source = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    for name in ("deep_fp8_gemm", "include", "jit"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=ignore)
    target = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(target), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    return target


def test_installed_package_contains_headers_and_templates(installed):
    package = installed / "deep_fp8_gemm"
    assert (package / "_include" / "deep_fp8_gemm" / "common.cuh").is_file()
    assert (package / "_include" / "deep_fp8_gemm" / "hal" / "ptx.cuh").is_file()
    headers = {".cuh", ".hpp", ".h"}
    assert _relative_files(package / "_include", headers) == _relative_files(REPO / "include", headers)
    assert (package / "_jit").is_dir()
    assert _relative_files(package / "_jit", {".cu", ".cuh"}) == _relative_files(REPO / "jit", {".cu", ".cuh"})


def test_installed_package_imports_cheaply_from_its_own_copy(installed, tmp_path):
    """Run from elsewhere, the installed package finds its own headers / templates, and importing it loads
    neither the CUDA bindings (beyond what torch itself loads) nor the JIT, kernels or simulator."""
    script = textwrap.dedent(
        """
        import sys, torch
        before = set(sys.modules)
        import deep_fp8_gemm
        loaded = sorted(set(sys.modules) - before)
        assert hasattr(deep_fp8_gemm.reference, "gemm_fp8_fp8_bf16_nt")
        from deep_fp8_gemm.runtime import paths
        print(deep_fp8_gemm.__file__)
        print(paths.include_dir())
        print(paths.template_dir())
        print(deep_fp8_gemm.__version__)
        print(" ".join(loaded))
        """
    )
    env = dict(os.environ, PYTHONPATH=str(installed))
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    package_file, include_dir, template_dir, version, loaded = result.stdout.split("\n")[:5]
    package = installed.resolve() / "deep_fp8_gemm"
    assert Path(package_file).resolve() == package / "__init__.py"
    assert Path(include_dir).resolve() == package / "_include"
    assert Path(template_dir).resolve() == package / "_jit"
    assert version == "0.1.0"
    # The prepared fast path (prepared.py) reads the kernels' parameter layouts at import: kernels.gemm /
    # kernels.quant / runtime.tensor_map / runtime.target are pure-Python descriptions (struct formats, enums).
    # The CUDA bindings, the JIT (NVRTC compiler, cache, renderer, driver, audit) and the simulator stay unloaded.
    jit = tuple(f"deep_fp8_gemm.runtime.{m}" for m in ("compiler", "cache", "render", "driver", "audit", "sass",
                                                        "resources", "kloop", "paths"))
    heavy = [m for m in loaded.split() if m.startswith(("cuda", "deep_fp8_gemm.simulator") + jit)]
    assert heavy == [], f"import deep_fp8_gemm loaded {heavy}"


def test_readme_quickstart_and_ci_agree():
    """The README's quickstart is two one-line commands (the demo, the tests), plus the CPU-only torch line, and
    .ci/run ends by running exactly the README's test command (the part after the last ``&&``)."""
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quickstart, flags=re.S)
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    assert commands[0].endswith("python -m deep_fp8_gemm demo") and "pip install torch==2.13.0" in commands[0]
    assert commands[1].endswith(TEST_COMMAND) and "'.[test]'" in commands[1]
    assert "--index-url https://download.pytorch.org/whl/cpu" in quickstart  # the CPU-only torch build
    readme_test_command = commands[1].rsplit("&&", 1)[1].strip()
    ci = (REPO / ".ci" / "run").read_text()
    assert os.access(REPO / ".ci" / "run", os.X_OK)
    assert "set -euo pipefail" in ci
    assert ci.index("torch==2.13.0") < ci.index("-e '.[test]'") < ci.index(TEST_COMMAND)
    ci_commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    pytest_lines = [line for line in ci_commands if "pytest" in line]
    assert pytest_lines == [readme_test_command] and ci_commands[-1] == readme_test_command, pytest_lines
