"""deep-fp8-gemm-dropin: the import hook package plus its ``.pth`` file at the root of site-packages (setuptools has
no pyproject setting that puts a file there, hence this build_py)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "deep_fp8_gemm_dropin.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(Path(__file__).resolve().parent / PTH), str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
