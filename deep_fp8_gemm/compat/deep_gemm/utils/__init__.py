"""deep_gemm.utils: the reference's layout helpers (:mod:`.layout`) and casts (:mod:`.math`), also at the top
level of ``deep_gemm``. Its ``dist`` helpers (``init_dist``, ``uneven_all_gather``: NCCL test scaffolding) and
every other name this library lacks come from the forwarded provider when there is one."""

from ... import provider as _provider
from . import layout, math
from .layout import *  # noqa: F401,F403
from .layout import __all__ as _layout_all
from .math import *  # noqa: F401,F403
from .math import __all__ as _math_all

__all__ = ["layout", "math", *_layout_all, *_math_all]
__getattr__ = _provider.forwarder("utils")
