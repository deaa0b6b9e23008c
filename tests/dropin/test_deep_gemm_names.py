"""Every ``deep_gemm`` name vLLM 0.33.0 and SGLang 0.5.23 use on an SM90-reachable path (issue 40, item 2).

``data/consumer_names.json`` was read once from the released wheels (its ``sources``; ``data/extract_sites.py`` is
the extraction): each name with the consumer's ``file:line`` sites and whether an SM90 GPU reaches it (``default`` /
``opt-in``; ``guarded`` names are used only after ``hasattr``, ``resolved`` ones bound and never called, ``no`` ones
gated to SM100 / SM120). Through the facade, with the consumer's other provider present (the stubs of
:mod:`tests.dropin._stubs`: vLLM's vendored copy, sgl-deep-gemm), every SM90 name must be present and callable; which
ones this library serves itself is pinned below, the rest are forwarded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.dropin import _stubs

DATA = json.loads((Path(__file__).parent / "data" / "consumer_names.json").read_text())
SM90 = ("default", "opt-in")

#: The SM90 names deep_fp8_gemm serves itself, per consumer; every other SM90 name is forwarded.
OURS = {
    "vllm": {"fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
             "fp8_m_grouped_gemm_nt_masked", "set_pdl", "get_mk_alignment_for_contiguous_layout",
             "get_theoretical_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout",
             "transform_sf_into_required_layout", "set_num_sms",
             # the DeepSeek-V3.2 / V4 indexer (issue 44)
             "fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata",
             # DeepSeek-V4's o_proj einsum and mHC pre-norm GEMM (issue 41)
             "fp8_einsum", "tf32_hc_prenorm_gemm"},
    "sglang": {"fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "fp8_m_grouped_gemm_nt_masked",
               "get_mk_alignment_for_contiguous_layout", "get_theoretical_mk_alignment_for_contiguous_layout",
               "set_mk_alignment_for_contiguous_layout", "get_num_sms", "set_num_sms",
               "utils.layout.get_mn_major_tma_aligned_tensor", "transform_sf_into_required_layout", "set_pdl",
               "use_deterministic_algorithms", "per_block_cast_to_fp8",
               "fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_mqa_logits", "fp8_paged_mqa_logits",
               "get_paged_mqa_logits_metadata",
               # V4's wo_a einsum and mHC, the BF16 MoE runner and the batch-invariant mode (issue 41)
               "fp8_einsum", "tf32_hc_prenorm_gemm", "m_grouped_bf16_gemm_nt_contiguous",
               "m_grouped_bf16_gemm_nt_masked", "bf16_gemm_nt", "bf16_gemm_nn"},
}


def _names(consumer: str, classes=SM90) -> list[str]:
    return sorted(n["name"] for n in DATA["names"] if n["consumer"] == consumer and n["sm90"] in classes)


def _resolve(module, dotted: str):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def test_the_list_is_well_formed():
    assert {n["consumer"] for n in DATA["names"]} == {"vllm", "sglang"}
    for entry in DATA["names"]:
        assert entry["sm90"] in ("default", "opt-in", "guarded", "resolved", "no"), entry
        assert entry["sites"] and all(re.fullmatch(r"(vllm|sglang)/[\w/.]+\.py:\d+( \(.*\))?", s)
                                      for s in entry["sites"]), entry
        assert entry["why"], entry
    keys = [(n["consumer"], n["name"]) for n in DATA["names"]]
    assert len(keys) == len(set(keys))


def _check(dg, consumer: str) -> None:
    ours, forwarded = set(), set()
    for name in _names(consumer):
        obj = _resolve(dg, name)
        assert callable(obj), f"{consumer}: deep_gemm.{name} is not callable"
        who = dg.provider_of(name)
        (ours if who == "deep_fp8_gemm" else forwarded).add(name)
        assert who not in (None, "deep_fp8_gemm (stub)"), (consumer, name, who)
    assert ours == OURS[consumer], sorted(ours ^ OURS[consumer])
    assert all(n.rpartition(".")[2] in _stubs.FORWARDED + _stubs.SHARED or n.startswith("utils.") or n in ("SymmBuffer",)
               for n in forwarded), sorted(forwarded)


def test_every_vllm_sm90_name_through_the_facade(vendored_stub):
    import vllm  # noqa: F401 - vLLM is imported before it resolves deep_gemm

    _check(vendored_stub, "vllm")


def test_every_sglang_sm90_name_through_the_facade(site_stub):
    _check(site_stub[0], "sglang")


@pytest.mark.parametrize("consumer", ["vllm", "sglang"])
def test_what_is_ours_without_a_provider(consumer, vendored_stub):  # vllm not imported: no provider
    dg = vendored_stub
    present = {n for n in _names(consumer) if dg.provider_of(n) == "deep_fp8_gemm"}
    assert present == OURS[consumer]


def test_every_name_is_in_the_install_doc_table():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "dropin-install.md").read_text()
    table = doc.split("## The names vLLM and SGLang use", 1)[1]
    listed = set(re.findall(r"^\| `([\w.]+)` \|", table, re.M))
    assert listed == {n["name"] for n in DATA["names"]}, sorted(listed ^ {n["name"] for n in DATA["names"]})
