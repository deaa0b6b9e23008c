"""Disassemble a CUBIN and count its SASS instructions, without a GPU.

Used by the kernel audit: a Hopper FP8 GEMM must show ``QGMMA`` (FP8 wgmma), ``UTMALDG`` (TMA loads)
and ``USETMAXREG`` (warp-specialised register split), and must not show ``STL``/``LDL`` (local memory).
The disassemblers come from the pip wheels ``nvidia-cuda-nvdisasm`` / ``nvidia-cuda-cuobjdump`` (or a
CUDA toolkit), located through ``cuda.pathfinder``.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path


class DisassemblerNotFoundError(RuntimeError):
    """Neither ``nvdisasm`` nor ``cuobjdump`` could be found."""


# One instruction line in nvdisasm -c / cuobjdump -sass output:
#     /*0050*/               @!P0 BRA `(.L_x_1) ;
# group 1 = opcode with its modifiers; a leading predicate (@P0, @!UP1, @PT) is skipped.
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)", re.MULTILINE)


def _wheel_bin_dirs() -> list[Path]:
    """``nvidia/cu13/bin`` and ``nvidia/cu12/bin``-style directories of installed NVIDIA wheels."""
    try:
        import nvidia  # namespace package of the NVIDIA wheels
    except ImportError:
        return []
    return [Path(root) / sub / "bin" for root in nvidia.__path__ for sub in ("cu13", "cu12", "cuda_nvdisasm", "cuda_cuobjdump")]


@functools.lru_cache(maxsize=None)
def find_disassembler() -> tuple[str, Path]:
    """``(tool, path)`` of the disassembler to use: ``nvdisasm`` preferred, else ``cuobjdump``.

    Search order per tool: ``cuda.pathfinder.find_nvidia_binary_utility``, the installed NVIDIA wheels'
    ``bin`` directories, then ``PATH``.

    Raises:
        DisassemblerNotFoundError: neither tool exists; the message says which packages provide them.
    """
    for tool in ("nvdisasm", "cuobjdump"):
        found: str | None = None
        try:
            from cuda.pathfinder import find_nvidia_binary_utility

            found = find_nvidia_binary_utility(tool)
        except Exception:  # pathfinder missing, too old for binary utilities, or tool unknown to it
            found = None
        if not found:
            for directory in _wheel_bin_dirs():
                if (directory / tool).is_file() and os.access(directory / tool, os.X_OK):
                    found = str(directory / tool)
                    break
        found = found or shutil.which(tool)
        if found:
            return tool, Path(found)
    raise DisassemblerNotFoundError(
        "no SASS disassembler found: pip install nvidia-cuda-nvdisasm (or nvidia-cuda-cuobjdump), "
        "or put a CUDA toolkit's bin directory on PATH"
    )


# -ndf (--no-dataflow): no branch-stack analysis after the disassembly. It only adds inferred targets to jumps
# through the GPU branch stack, which these kernels do not take: the text is byte-identical to plain -c on every
# kernel compared (40 cached cubins of every family; tests/runtime/test_jit_compile.py keeps two), and nvdisasm's
# CPU time per kernel drops ~20% (0.48 -> 0.38 s): the audit runs it once per kernel, 321 times in CI.
NVDISASM_OPTIONS = ("-c", "-ndf")


def disassemble(cubin: bytes) -> str:
    """SASS text of every function in ``cubin`` (``nvdisasm -c -ndf``, or ``cuobjdump -sass``).

    Raises:
        DisassemblerNotFoundError: no disassembler installed.
        RuntimeError: the tool rejected the file (its stderr is in the message).
    """
    tool, path = find_disassembler()
    args = [str(path), *NVDISASM_OPTIONS] if tool == "nvdisasm" else [str(path), "-sass"]
    # Both tools read a file, not stdin.
    with tempfile.TemporaryDirectory(prefix="dfg_sass_") as tmp:
        cubin_path = Path(tmp) / "kernel.cubin"
        cubin_path.write_bytes(cubin)
        result = subprocess.run([*args, str(cubin_path)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{tool} failed (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout


def opcode_histogram(sass: str) -> collections.Counter:
    """Counts of full opcodes with their modifiers (``LDG.E.64``, ``STG.E``: the access width is a modifier),
    predicates dropped."""
    return collections.Counter(m.group(1) for m in _INSTRUCTION.finditer(sass))


def instruction_histogram(sass: str) -> collections.Counter:
    """Counts of opcode base names (``QGMMA.64x128x32.F32.E4M3.E4M3`` -> ``QGMMA``), predicates dropped."""
    return collections.Counter(m.group(1).split(".", 1)[0] for m in _INSTRUCTION.finditer(sass))
