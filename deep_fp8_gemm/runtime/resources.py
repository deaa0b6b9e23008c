"""Parse the ptxas report (``--ptxas-options=-v``) into a structured resource summary.

The report NVRTC returns in its program log looks like (NVRTC 12.9 / 13.x)::

    ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; ...
    ptxas info    : Compiling entry function 'k' for 'sm_90a'
    ptxas info    : Function properties for k
    ptxas         .     288 bytes stack frame, 552 bytes spill stores, 584 bytes spill loads
    ptxas info    : Used 32 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]

Performance diagnostics carry a code in parentheses (C7508, C7511, C7517, C7519, C7602, ...) and
appear as ``info`` or ``warning`` lines depending on the code; every code found is recorded.
"""

from __future__ import annotations

import dataclasses
import re

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(.*)$")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_CODE = re.compile(r"\((C\d{4})\)")


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for one kernel.

    ``static_smem_bytes`` excludes the dynamic shared memory the launch requests. ``warnings`` holds
    the distinct diagnostic codes (e.g. ``("C7508",)``) in order of first appearance, for the whole log:
    ptxas prints some of them before it names the function.
    """

    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0
    static_smem_bytes: int = 0
    cmem_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def spill_bytes(self) -> int:
        """Spill stores + spill loads."""
        return self.spill_store_bytes + self.spill_load_bytes

    def to_json(self) -> dict:
        """JSON-safe dict (cmem bank numbers become strings)."""
        out = dataclasses.asdict(self)
        out["cmem_bytes"] = {str(bank): size for bank, size in self.cmem_bytes.items()}
        out["warnings"] = list(self.warnings)
        return out

    @classmethod
    def from_json(cls, data: dict) -> KernelResources:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: a missing or mistyped field (a damaged cache entry).
        """
        try:
            return cls(
                registers=int(data["registers"]),
                spill_store_bytes=int(data["spill_store_bytes"]),
                spill_load_bytes=int(data["spill_load_bytes"]),
                stack_bytes=int(data["stack_bytes"]),
                static_smem_bytes=int(data["static_smem_bytes"]),
                cmem_bytes={int(bank): int(size) for bank, size in dict(data["cmem_bytes"]).items()},
                warnings=tuple(str(code) for code in data["warnings"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed kernel resources record: {exc!r}") from exc


def parse_ptxas_log(log: str, kernel_name: str | None = None) -> KernelResources:
    """Resources of ``kernel_name`` (default: the first entry function in the log).

    Lines about other functions are ignored; a log without the kernel gives all-zero resources
    (ptxas prints nothing when it was not asked for ``-v``).
    """
    current: str | None = None  # function the following lines describe
    target = kernel_name
    fields: dict = {}
    cmem: dict[int, int] = {}
    codes: list[str] = []
    for line in log.replace("\x00", "").splitlines():
        for code in _CODE.findall(line):
            if code not in codes:
                codes.append(code)
        if m := _ENTRY.search(line) or _PROPERTIES.search(line):
            current = m.group(1)
            if target is None:
                target = current
            continue
        if current != target or target is None:
            continue
        if m := _STACK.search(line):
            fields["stack_bytes"], fields["spill_store_bytes"], fields["spill_load_bytes"] = map(int, m.groups())
        elif m := _USED.search(line):
            fields["registers"] = int(m.group(1))
            rest = m.group(2)
            if s := _SMEM.search(rest):
                fields["static_smem_bytes"] = int(s.group(1))
            cmem.update({int(bank): int(size) for size, bank in _CMEM.findall(rest)})
    return KernelResources(**fields, cmem_bytes=cmem, warnings=tuple(codes))
