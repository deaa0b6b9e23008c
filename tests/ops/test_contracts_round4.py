"""Contracts round 4 (issue 36): meta tensors, torch.compile, the 1.x weight-gradient names, fp16 layers, the demo's
and the CLI's rough edges, each with the result the issue states or a TypeError / ValueError naming the argument and
the rule, on the CPU path and (where a kernel would run) under DFG_SIMULATE=1. Overlapping outputs: test_overlap.py;
the MoE layers' w13_swiglu: tests/model/test_moe_fused.py; set_num_sms: test_utils.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import cli, demo, ops
from deep_fp8_gemm.config import KINDS
from tests._gemm_cases import family_call
from tests._operands import quantised_activations


# ---------------------------------------------------------------------------------------------- meta tensors
@pytest.mark.parametrize("simulate", [False, True], ids=["cpu", "simulator"])
@pytest.mark.parametrize("kind", KINDS)
def test_meta_tensors_take_the_shape_only_path(kind, simulate, monkeypatch):
    """Every family (the FP8-output ones refused meta tensors with a bogus overlap error): the checks run on the
    metadata, nothing is computed or launched."""
    if simulate:
        monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setattr(ops.FAMILIES[kind], "dispatch", lambda *a, **k: pytest.fail("a meta call was dispatched"))
    call, outs, _ = family_call(kind, device="meta")
    call(outs)


# ---------------------------------------------------------------------------------------------- torch.compile
def test_compiled_psum_calls_without_expected_m():
    """The bf16 psum op (its fake had no default for the schema's ``expected_m=None``) and the drop-in's
    ``use_psum_layout=True`` without ``expected_m_for_psum_layout`` (the DeepEP v2 path) trace with
    ``fullgraph=True`` and give the eager bits."""
    from deep_fp8_gemm import compat

    a, sa = quantised_activations((256, 256), 5)
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(2, 128, 256).view(256, 256))
    b, sb = b.view(2, 128, 256), torch.stack([dfg.per_block_cast_to_fp8(torch.randn(128, 256))[1]] * 2)
    ends = torch.tensor([100, 256], dtype=torch.int32)

    def op_call(a, sa, b, sb, ends):
        out = torch.empty(256, 128, dtype=torch.bfloat16)
        dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum((a, sa), (b, sb), out, ends)
        return out

    def dropin_call(a, sa, b, sb, ends):
        out = torch.empty(256, 128, dtype=torch.bfloat16)
        compat.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), out, ends, use_psum_layout=True)
        return out

    for fn in (op_call, dropin_call):
        torch._dynamo.reset()
        eager = fn(a, sa, b, sb, ends)
        compiled = torch.compile(fn, fullgraph=True)(a, sa, b, sb, ends)
        assert torch.equal(eager[:100], compiled[:100]) and torch.equal(eager[128:], compiled[128:])


def test_empty_out_traces_with_a_symbolic_row_count():
    from deep_fp8_gemm.ops.outputs import empty_out

    def fn(x):
        d, sd = empty_out((), x.shape[0], 256, x.device)
        return d.shape[0] + sd.shape[0] + x.sum()

    compiled = torch.compile(fn, dynamic=True, fullgraph=True)
    for m in (8, 24, 40):
        assert compiled(torch.ones(m, 4)) == 2 * m + 4 * m


# ---------------------------------------------------------------------------------------------- 1.x weight gradients
def test_k_grouped_wgrad_batch_sizes_must_be_ints():
    from deep_fp8_gemm import compat

    out = torch.zeros(1, 64, 64)
    a = torch.zeros(64 * 128, dtype=torch.float8_e4m3fn)
    s = torch.ones(1, 64)
    for bad in ([128.5], [True], [torch.tensor(128)]):
        with pytest.raises(TypeError, match="batch_sizes must be a list of Python ints"):
            compat.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, s), (a, s), out, bad)


def test_wgrad_bare_tensor_lhs_names_the_pair():
    from deep_fp8_gemm import compat

    a, sa = quantised_activations((64, 128), 1)
    with pytest.raises(TypeError, match=r"lhs must be a \(tensor, scales\) pair"):
        compat.wgrad_gemm_fp8_fp8_fp32_nt(a, (a, sa), torch.zeros(64, 64))


# ---------------------------------------------------------------------------------------------- fp16 layers
def test_fp8_linear_after_half_runs_in_fp16():
    """``.half()`` keeps the e4m3 weights; an fp16 input is quantised as a bf16 one is and the output is fp16:
    the bf16 layer's values rounded to fp16, and ±inf beyond 65504 as an fp16 ``nn.Linear`` would give."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 128)
    layer = dfg.nn.FP8Linear.from_linear(linear)
    x = torch.randn(8, 256)
    want = layer(x.bfloat16())
    half = layer.half()
    assert half.weight_fp8.dtype == torch.float8_e4m3fn
    got = half(x.half())
    assert got.dtype == torch.float16 and dfg.calc_diff(got.float(), want.float()) < 1e-4
    big = dfg.nn.FP8Linear.from_linear(linear)
    with torch.no_grad():
        big.bias.fill_(70000.0)
    assert torch.isinf(big.half()(x.half())).all()
    with pytest.raises(TypeError, match="x must be bfloat16 or float16"):
        half(x)


def test_fp8_moe_after_half_runs_in_fp16():
    torch.manual_seed(1)
    layer = dfg.moe.FP8MoE.from_weights(torch.randn(4, 256, 128), torch.randn(4, 128, 128))
    hidden = torch.randn(6, 128)
    ids = torch.randint(0, 4, (6, 2))
    weights = torch.rand(6, 2)
    want = layer(hidden.bfloat16(), ids, weights)
    got = layer.half()(hidden.half(), ids, weights)
    assert got.dtype == torch.float16 and dfg.calc_diff(got.float(), want.float()) < 1e-3


# ---------------------------------------------------------------------------------------------- demo and CLI
def _cli(capsys, *args: str) -> subprocess.CompletedProcess:
    """``python -m deep_fp8_gemm ARGS`` in this process (cli.main, argparse's exits caught): ~3.5 s of interpreter
    and torch start-up less per call than a child process; test_cli.py runs the module entry point itself."""
    try:
        code = cli.main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["deep_fp8_gemm", *args], code, out.out, out.err)


def test_demo_refuses_what_cannot_run(monkeypatch):
    for args, text in ((["--reduce", "0"], "argument --reduce: expected a positive integer"),
                       (["--reduce", "-2"], "argument --reduce: expected a positive integer"),
                       (["--m", "0"], "argument --m: expected a positive integer")):
        with pytest.raises(SystemExit) as exit_:
            demo.main(["--cpu", *args])
        assert exit_.value.code == 2
    # A machine too small for the full-size float64 check is told the smallest --reduce that fits.
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PHYS_PAGES": 2**20, "SC_PAGE_SIZE": 4096}[name])  # 4 GiB
    with pytest.raises(ValueError, match=r"--reduce 1: the float64 check .* use --reduce \d+ or more"):
        demo.check_memory(1)
    demo.check_memory(8)


def test_cli_rough_edges(tmp_path, capsys):
    missing = _cli(capsys, "audit", "--kind", "dense", "--json", str(tmp_path / "nope" / "x.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "kernels" not in missing.stdout
    negative = _cli(capsys, "audit", "--kind", "dense", "--shapes", "-128,256")
    assert negative.returncode == 2 and "shape N,K must be positive" in negative.stderr
    swiglu = _cli(capsys, "audit", "--kind", "contiguous_swiglu", "--shapes", "384,256")
    assert swiglu.returncode == 2 and "n = 2I (gate and up) with I a multiple of 128" in swiglu.stderr
    fp8 = _cli(capsys, "audit", "--kind", "dense_fp8out", "--shapes", "136,256")
    assert fp8.returncode == 2 and "n_out % 16 == 0" in fp8.stderr
    help_text = _cli(capsys, "--help").stdout + _cli(capsys, "audit", "--help").stdout
    assert "``" not in help_text and ":func:" not in help_text and "bench" in help_text
    env = _cli(capsys, "env").stdout
    assert f"deep_fp8_gemm:{dfg.__version__}" in env.replace(" ", "") and "python:" in env
    bench = _cli(capsys, "bench")
    assert bench.returncode == 0 and "dense" in bench.stdout and "host" in bench.stdout


def test_a_cache_dir_that_is_a_file_names_the_setting(tmp_path):
    """In a fresh process (the simulator's library is not loaded yet): a clear error naming the setting, not a raw
    NotADirectoryError from deep inside; the compile path warns and compiles without the cache."""
    a_file = tmp_path / "cache"
    a_file.write_text("")
    script = ("import torch, deep_fp8_gemm as dfg\n"
              "from deep_fp8_gemm.runtime.cachedir import UnsafeCacheDirError\n"
              "try:\n    dfg.per_token_cast_to_fp8(torch.randn(64, 128))\n"
              "except UnsafeCacheDirError as exc:\n    print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, DFG_JIT_CACHE_DIR=str(a_file), DFG_SIMULATE="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "is not a directory" in done.stdout and "DFG_JIT_CACHE_DIR" in done.stdout


def test_theoretical_alignment_stays_128_as_the_reference_on_sm90():
    from deep_fp8_gemm import compat

    try:
        compat.set_mk_alignment_for_contiguous_layout(64)
        assert compat.get_mk_alignment_for_contiguous_layout() == 64
        assert compat.get_theoretical_mk_alignment_for_contiguous_layout(4096) == 128
    finally:
        compat.set_mk_alignment_for_contiguous_layout(128)
