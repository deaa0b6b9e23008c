"""Packaging for deep_fp8_gemm.

The CUDA device headers (``include/``) and the kernel entry templates (``jit/``) live at the top of the
repository, outside the Python package. A regular (non-editable) build copies them into the package as
``deep_fp8_gemm/_include`` and ``deep_fp8_gemm/_jit``, where ``deep_fp8_gemm.runtime.paths`` looks first; an
editable install reads them from the source tree instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# (source folder at the repository root, destination inside the package)
DEVICE_TREES = (("include", "_include"), ("jit", "_jit"))
DEVICE_SUFFIXES = {".cuh", ".hpp", ".h", ".cu"}


def _read_version() -> str:
    for line in (ROOT / "deep_fp8_gemm" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError("__version__ not found in deep_fp8_gemm/__init__.py")


class BuildPyWithDeviceSources(build_py):
    """build_py that also copies include/ and jit/ into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable installs read <repo>/include and <repo>/jit directly
        package_dir = Path(self.build_lib) / "deep_fp8_gemm"
        for source_name, dest_name in DEVICE_TREES:
            source, dest = ROOT / source_name, package_dir / dest_name
            if dest.exists():
                shutil.rmtree(dest)  # never ship files deleted from the source tree
            dest.mkdir(parents=True)
            if not source.is_dir():
                continue
            for path in sorted(source.rglob("*")):
                if path.is_file() and path.suffix in DEVICE_SUFFIXES:
                    target = dest / path.relative_to(source)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)


setup(
    name="deep_fp8_gemm",
    version=_read_version(),
    description="FP8 GEMMs with fine-grained scaling for NVIDIA Hopper (DeepGEMM-style API), JIT-compiled with NVRTC",
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="MIT",
    author="deep_fp8_gemm developers",
    python_requires=">=3.10",
    packages=find_packages(include=["deep_fp8_gemm", "deep_fp8_gemm.*"]),
    package_data={"deep_fp8_gemm.runtime": ["kloop_ceilings.json"]},
    cmdclass={"build_py": BuildPyWithDeviceSources},
    install_requires=[
        "torch",
        "numpy",
        # cuda-bindings 13.x loads the CUDA 13 NVRTC (libnvrtc.so.13) that nvidia-cuda-nvrtc 13.x ships.
        "cuda-bindings>=13.0",
        "nvidia-cuda-nvrtc>=13.0,<14",
        "nvidia-cuda-nvdisasm>=13.0,<14",
        # CuTe / CUTLASS headers and pycute: ground truth for Hopper layouts in the tests and audits.
        "nvidia-cutlass>=4.2",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist", "hypothesis"],
        "bench": ["matplotlib"],
    },
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Environment :: GPU :: NVIDIA CUDA",
    ],
)
