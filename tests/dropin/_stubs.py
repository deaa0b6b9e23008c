"""Stand-ins for the other DeepGEMM providers (issue 40): written into a temporary directory, never installed here.

* :func:`write_site_package` writes a ``deep_gemm/`` package laid out as sgl-deep-gemm 0.2.3.post2's (``utils``
  with ``layout`` / ``math`` / ``dist``, ``testing``, ``mega``, a ``_C`` module, relative imports in ``__init__``,
  the ``sys.modules[f"{__name__}.<name>"]`` entries it registers for every public name) plus, as DeepGEMM's own
  code may have, an absolute ``import deep_gemm.utils.dist`` inside a function.
* :func:`write_vllm_vendored` writes ``vllm/third_party/deep_gemm`` as vLLM 0.33.0 ships DeepGEMM 2.8.1.

Both define the names deep_fp8_gemm does not implement as recording functions (``CALLS``), the global knobs with
getters, and their own versions of the GEMMs deep_fp8_gemm has (recording too, so a test sees which one ran).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

#: Names a stub provides that deep_fp8_gemm does not (cuBLASLt, the k-grouped BF16 GEMM, sparse MQA, MegaMoE, ...).
FORWARDED = ("cublaslt_gemm_nt", "cublaslt_gemm_nn", "k_grouped_bf16_gemm_tn_contiguous",
             "fp8_fp4_paged_sparse_mqa_logits", "get_paged_sparse_mqa_logits_metadata",
             "fp8_mega_moe", "mega_moe_pre_dispatch_sm90", "mega_moe_pre_dispatch", "get_symm_buffer_for_mega_moe",
             "transform_weights_for_mega_moe", "fp8_fp4_mega_moe", "bf16_mega_moe", "nvfp4_mega_moe",
             "fp4_fp4_mega_moe", "bf16_mega_gate", "get_bf16_mega_gate_config", "mega_mhc", "get_block_m_for_mega_moe",
             "get_block_m_for_nvfp4_mega_moe", "pack_ue8m0_to_int", "get_mn_major_tma_aligned_packed_ue8m0_tensor",
             "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "fp8_fp4_sparse_mqa_logits",
             "get_sparse_mqa_logits_metadata", "get_compile_mode", "set_compile_mode", "m_grouped_fp8_fp4_gemm_nn_contiguous")
#: Names both have (the GEMMs, since issue 44 the indexer, since issue 41 the BF16 / TF32 names): the stub's record
#: a call, so a hand-over or a call forwarded by mistake is visible.
SHARED = ("fp8_gemm_nt", "fp8_fp4_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous",
          "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked", "transform_sf_into_required_layout",
          "fp8_mqa_logits", "fp8_paged_mqa_logits", "fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits",
          "get_paged_mqa_logits_metadata", "bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt",
          "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_masked",
          "einsum", "fp8_einsum", "tf32_hc_prenorm_gemm")

_COMMON = '''
CALLS = []
_KNOBS = {"pdl": False, "num_sms": 132, "tc_util": 0, "mk_alignment": 128, "deterministic": False,
          "ignore_compile_dims": False, "block_size_multiple_of": (1, 1)}


def _recorder(name):
    def call(*args, **kwargs):
        CALLS.append((name, args, kwargs))
        return name
    call.__name__ = name
    return call


for _name in %(names)r:
    globals()[_name] = _recorder(_name)
SymmBuffer = NVFP4SymmBuffer = type("SymmBuffer", (), {})


def set_pdl(enabled):
    _KNOBS["pdl"] = bool(enabled)


def get_pdl():
    return _KNOBS["pdl"]


def set_num_sms(num_sms):
    if not 0 <= num_sms <= 132:
        raise RuntimeError(f"stub: num_sms {num_sms} out of range")
    _KNOBS["num_sms"] = num_sms


def get_num_sms():
    return _KNOBS["num_sms"]


def set_tc_util(v):
    _KNOBS["tc_util"] = v


def get_tc_util():
    return _KNOBS["tc_util"]


def set_mk_alignment_for_contiguous_layout(v):
    if v not in (32, 64, 128):
        raise RuntimeError(f"stub: alignment {v}")
    _KNOBS["mk_alignment"] = v


def get_mk_alignment_for_contiguous_layout():
    return _KNOBS["mk_alignment"]


def use_deterministic_algorithms(enabled=True):
    _KNOBS["deterministic"] = bool(enabled)


def get_deterministic_algorithms():
    return _KNOBS["deterministic"]


def set_ignore_compile_dims(v):
    _KNOBS["ignore_compile_dims"] = v


def set_block_size_multiple_of(v):
    _KNOBS["block_size_multiple_of"] = v
''' % {"names": FORWARDED + SHARED}


def write_site_package(root: Path) -> Path:
    """``root/deep_gemm/`` as sgl-deep-gemm lays it out (module docstring); returns ``root``."""
    pkg = root / "deep_gemm"
    for sub in ("utils", "testing", "mega"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("from . import _C\n" + _COMMON + textwrap.dedent('''
        from . import mega
        from .mega import SymmBuffer
        from . import testing
        from . import utils
        from .utils import *
        __version__ = "0.2.3.post2+stub"
        PROVIDER = "site-packages stub"


        def uses_absolute_import():
            """Like provider code that imports its own submodule by the absolute name."""
            import deep_gemm.utils.dist
            return deep_gemm.utils.dist.init_dist()


        import sys as _sys
        import types as _types
        for _name, _val in list(globals().items()):
            if _name.startswith("_") or _val is None or isinstance(_val, _types.ModuleType):
                continue
            _sys.modules.setdefault(f"{__name__}.{_name}", _val)
        '''))
    (pkg / "_C.py").write_text("def get_token_alignment_for_mega_moe():\n    return 64\n")
    (pkg / "mega" / "__init__.py").write_text("class SymmBuffer:\n    pass\n")
    (pkg / "utils" / "__init__.py").write_text("from . import math, layout\nfrom .layout import *\nfrom .math import *\n"
                                               "from .dist import init_dist, uneven_all_gather\n")
    (pkg / "utils" / "layout.py").write_text(
        "def get_mn_major_tma_aligned_packed_ue8m0_tensor(x):\n    return ('stub packed', x)\n\n"
        "def get_mn_major_tma_aligned_tensor(x):\n    return ('stub layout', x)\n")
    (pkg / "utils" / "math.py").write_text(
        "def transform_ue4m3_sf_into_required_layout(*a):\n    return 'stub ue4m3'\n\n"
        "def align(x, y):\n    return (x + y - 1) // y * y\n")
    (pkg / "utils" / "dist.py").write_text("def init_dist(*a):\n    return 'stub dist'\n\n"
                                           "def uneven_all_gather(*a):\n    return None\n")
    (pkg / "testing" / "__init__.py").write_text("def calc_diff(x, y):\n    return 'stub calc_diff'\n")
    return root


def write_vllm_vendored(root: Path) -> Path:
    """``root/vllm/third_party/deep_gemm`` (vLLM 0.33.0's vendored DeepGEMM 2.8.1, as a stub); returns ``root``."""
    pkg = root / "vllm" / "third_party" / "deep_gemm"
    (pkg / "utils").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "third_party" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(_COMMON + 'from . import utils\n__version__ = "2.8.1"\n'
                                     'PROVIDER = "vllm vendored stub"\n')
    (pkg / "utils" / "__init__.py").write_text("def get_tma_aligned_size(x, s):\n    return x\n")
    return root
