"""deep_gemm.testing: the reference's test helpers (``calc_diff``, ``count_bytes``, ``assert_bitwise_equal``,
``get_arch_major``, ``test_filter``, ``ignore_env``, the CUDA benchmarks ``bench`` / ``bench_kineto``); any other
name from the forwarded provider when there is one."""


from ... import provider as _provider
from . import bench, numeric, utils
from .bench import *  # noqa: F401,F403
from .bench import __all__ as _bench_all
from .numeric import *  # noqa: F401,F403
from .numeric import __all__ as _numeric_all
from .utils import *  # noqa: F401,F403
from .utils import __all__ as _utils_all

__all__ = ["bench", "numeric", "utils", *_bench_all, *_numeric_all, *_utils_all]
__getattr__ = _provider.forwarder("testing")
