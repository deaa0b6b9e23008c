"""``precompile --model`` (deep_fp8_gemm.kernels.serving) and ``cache export`` / ``cache import``
(deep_fp8_gemm.runtime.cache_archive): the serving set's problems, its sweep over every M, the CLI paths on a tiny
selection, and an archive's round trip with every kind of tampering refused."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from deep_fp8_gemm import cli
from deep_fp8_gemm.config import get_config
from deep_fp8_gemm.kernels import quant, serving
from deep_fp8_gemm.runtime.compiler import cached_kernel, compile_kernel
from tests.jit_kernels import jit_cache, probe_source  # noqa: F401


def test_deepseek_v3_tp8_problems_are_the_sharded_weights():
    by_what = {(p.what, p.kind): p for p in serving.problems("deepseek-v3", 8)}
    assert (by_what["q_b", "dense"].n, by_what["q_b", "dense"].k) == (3072, 1536)
    assert (by_what["kv_b", "dense"].n, by_what["kv_b", "dense"].k) == (4096, 512)
    assert (by_what["o_proj", "dense"].n, by_what["o_proj", "dense"].k) == (7168, 2048)
    assert (by_what["fused q_a + kv_a", "dense"].n, by_what["fused q_a + kv_a", "dense"].k) == (2112, 7168)
    assert (by_what["shared expert down", "dense"].n, by_what["shared expert down", "dense"].k) == (7168, 256)
    w13 = by_what["experts w13", "masked"]
    assert (w13.n, w13.k, w13.groups) == (4096, 7168, 32) and w13.ms == range(1, 8193)
    contiguous = by_what["experts w2", "contiguous"]
    assert contiguous.groups == 32 and contiguous.ms[0] == 128 and contiguous.ms.step == 128
    assert all(p.ms == range(1, 8193) for p in by_what.values() if p.kind == "dense")
    with pytest.raises(ValueError, match="got 3"):
        serving.problems("deepseek-v3", 3)
    with pytest.raises(ValueError, match="model must be one of"):
        serving.problems("llama", 8)


def test_serving_targets_hold_the_pick_of_every_m_and_the_quantisers(monkeypatch):
    """Every M of the sweep, not a sample: the set equals the heuristic's picks over all M values (M_MAX lowered
    to keep the test short), deduplicated, then every quantiser kernel."""
    monkeypatch.setattr(serving, "M_MAX", 300)
    targets = serving.serving_targets("deepseek-v3", 8, 132)
    names = [t.name for t in targets]
    assert len(names) == len(set(names))
    for p in serving.problems("deepseek-v3", 8):
        picks = {get_config(m, p.n, p.k, p.groups, p.kind, 132).kernel_name() for m in p.ms}
        assert picks <= set(names), p.what
    quant_names = [t.name for t in quant.audit_targets()]
    assert names[-len(quant_names):] == quant_names


@pytest.fixture
def tiny_model(monkeypatch):
    """A serving set of one dense weight at two M values and no quantisers (what the CLI does with it is real)."""
    problem = serving.ServingProblem("test", "dense", 576, 7168, 1, range(1, 3))
    monkeypatch.setattr(serving, "problems", lambda model, tp: [problem] if tp == 8 else serving_problems(model, tp))
    monkeypatch.setattr(quant, "audit_targets", lambda: [])
    return problem


serving_problems = serving.problems


def test_precompile_model_compiles_the_set_and_check_reports_the_warm_start(jit_cache, tiny_model, capsys):
    assert cli.main(["precompile", "--model", "deepseek-v3", "--tp", "8", "--check"]) == 1
    out, err = capsys.readouterr()
    assert "deepseek-v3 tp 8, 132 SMs: 1 kernels (dense 1)" in err and "missing: dfg_fp8_gemm_dense_n576" in out
    assert cli.main(["precompile", "--model", "deepseek-v3", "--tp", "8"]) == 0
    out, err = capsys.readouterr()
    assert "precompiled 1 kernels (1 compiled, 0 cached, 0 failed) in" in out and "1/1" in err  # total, progress
    assert cli.main(["precompile", "--model", "deepseek-v3", "--tp", "8", "--check"]) == 0
    assert "1 of 1 kernels" in capsys.readouterr().out


def test_precompile_model_refuses_other_selections_and_bad_tp(capsys):
    assert cli.main(["precompile", "--model", "deepseek-v3", "--kind", "dense"]) == 2
    assert "--model selects the kernels itself" in capsys.readouterr().err
    assert cli.main(["precompile", "--model", "deepseek-v3", "--tp", "3", "--check"]) == 2
    assert "--model deepseek-v3 --tp 3: tp must split" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["precompile", "--model", "llama"])


# ---------------------------------------------------------------------------------------------- export / import
def _probe_entry(name: str = "dfg_test_archive_probe") -> tuple[str, str]:
    source = probe_source(name)
    compile_kernel(name, source)
    return name, source


def _members(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def _write(path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)


def test_cache_export_import_round_trip(jit_cache, tmp_path, monkeypatch, capsys):
    name, source = _probe_entry()
    archive = tmp_path / "cache.tar"
    assert cli.main(["cache", "export", str(archive)]) == 0
    assert "exported 1 entries" in capsys.readouterr().out
    assert sorted(n.rsplit(".", 1)[1] for n in _members(archive)) == ["cubin", "json"]
    other = tmp_path / "other-cache"
    monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(other))
    assert cached_kernel(name, source) is None
    assert cli.main(["cache", "import", str(archive)]) == 0
    assert "imported 1 entries" in capsys.readouterr().out
    kernel = cached_kernel(name, source)
    assert kernel is not None and kernel.cubin.startswith(b"\x7fELF")
    assert (other.stat().st_mode & 0o777) == 0o700  # the checked, owner-only directory, made by the import
    assert cli.main(["cache", "import", str(archive)]) == 0
    out = capsys.readouterr().out
    assert "imported 0 entries" in out and "1 already there" in out


def test_cache_import_refuses_tampered_and_foreign_members(jit_cache, tmp_path, monkeypatch, capsys):
    _probe_entry()
    good = tmp_path / "good.tar"
    assert cli.main(["cache", "export", str(good)]) == 0
    members = _members(good)
    key = next(iter(members)).split(".")[0]
    cubin, meta = members[f"{key}.cubin"], members[f"{key}.json"]
    flipped = cubin[:-1] + bytes([cubin[-1] ^ 0xFF])
    other_key = "f" * 64
    cases = {
        "cubin": ({f"{key}.cubin": flipped, f"{key}.json": meta}, (), "fails the cache's verification"),
        "key": ({f"{other_key}.cubin": cubin, f"{other_key}.json": meta}, (), "fails the cache's verification"),
        "half": ({f"{key}.cubin": cubin}, (), "only its .cubin is in the archive"),
        "json": ({f"{key}.cubin": cubin, f"{key}.json": b"not json"}, (), "metadata is not JSON"),
        "path": ({f"../{key}.cubin": cubin}, (), "not a cache entry file"),
        "link": ({}, (f"{key}.json",), "not a cache entry file"),
    }
    capsys.readouterr()
    for label, (content, links, why) in cases.items():
        target = tmp_path / f"cache-{label}"
        monkeypatch.setenv("DFG_JIT_CACHE_DIR", str(target))
        bad = tmp_path / f"{label}.tar"
        _write(bad, content, links)
        assert cli.main(["cache", "import", str(bad)]) == 1, label
        out, err = capsys.readouterr()
        assert "imported 0 entries" in out and why in err, (label, err)
        assert not target.exists() or not list(target.glob("*.cubin")), label
    assert json.loads(meta)["key"] == key


def test_cache_export_import_argument_errors(jit_cache, tmp_path, capsys):
    assert cli.main(["cache", "export"]) == 2
    assert "cache export needs a FILE" in capsys.readouterr().err
    assert cli.main(["cache", "info", str(tmp_path / "x")]) == 2
    (tmp_path / "junk.tar").write_bytes(b"not a tar file")
    assert cli.main(["cache", "import", str(tmp_path / "junk.tar")]) == 2
    assert "not a readable tar file" in capsys.readouterr().err
