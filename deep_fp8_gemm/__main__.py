"""``python -m deep_fp8_gemm``: see :mod:`deep_fp8_gemm.cli`."""

import sys

from .cli import main

sys.exit(main())
