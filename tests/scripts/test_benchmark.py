"""scripts/benchmark.py: runs a couple of steps on a tiny model and writes its JSON, markdown and docs table."""

import importlib.util
import json

import pytest
import torch

from tests.conftest import REPO

TINY = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "data.tokenizer.vocab_size=64"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark", REPO / "scripts" / "benchmark.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_flops_formula_and_matmul_params(bench):
    assert bench.flops_per_token(1000, 2, 16, 8) == 6 * 1000 + 12 * 2 * 16 * 8
    emb = torch.nn.Embedding(10, 4)
    model = torch.nn.ModuleDict({"emb": emb, "lin": torch.nn.Linear(4, 3, bias=False)})
    assert bench.matmul_params(model, emb.weight, emb.weight) == 12 + 40  # a tied head is counted once
    head = torch.nn.Linear(4, 10, bias=False)
    model["head"] = head
    assert bench.matmul_params(model, emb.weight, head.weight) == 12 + 40


def test_benchmark_writes_results(bench, tmp_path, monkeypatch):
    docs = tmp_path / "performance.md"
    docs.write_text("# Performance\n\nintro\n")
    monkeypatch.setattr(bench, "DOCS", docs)
    args = bench.parse_args(
        ["--lengths", "8,16", "--encodings", "rope,alibi", "--steps", "2", "--warmup", "1", "--threads", "1",
         "--batch-size", "2", "--device", "cpu", "--peak-tflops", "1", "--out", str(tmp_path / "out"), "--update-docs",
         *TINY]
    )  # fmt: skip
    report = bench.run(args)
    files = sorted((tmp_path / "out").iterdir())
    assert [f.suffix for f in files] == [".json", ".md"]
    saved = json.loads(files[0].read_text())
    assert saved["torch"] == torch.__version__ and saved["device"] == "cpu" and saved["threads"] == 1
    rows = saved["results"]
    assert [(r["encoding"], r["seq_len"]) for r in rows] == [("rope", 8), ("rope", 16), ("alibi", 8), ("alibi", 16)]
    for r in rows:
        assert r["status"] == "ok" and r["tokens_per_s"] > 0 and r["peak_mem_mb"] >= 0
        assert r["flops_per_token"] == 6 * r["matmul_params"] + 12 * 1 * 32 * r["seq_len"]
        assert r["mfu"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"] / 1e12, rel=0.05)  # 1 TFLOP/s
    assert report["results"] == rows
    text = docs.read_text()
    assert "intro" in text and text.count("<!-- benchmark:cpu-run:begin -->") == 1 and "| minilm | alibi | 16 |" in text
    bench.update_docs(saved, "| new table |\n", docs)  # a second run replaces the block, keeps the rest
    text = docs.read_text()
    assert text.count("benchmark:cpu-run:begin") == 1 and "| new table |" in text and "| minilm |" not in text


@pytest.mark.slow  # importing transformers alone takes ~15 s of CPU
def test_benchmark_peer_ratio(bench, tmp_path):
    pytest.importorskip("transformers")
    args = bench.parse_args(
        ["--lengths", "16", "--steps", "1", "--warmup", "1", "--threads", "1", "--device", "cpu", "--peer",
         "--batch-size", "2", "--out", str(tmp_path), *TINY]
    )  # fmt: skip
    report = bench.run(args)
    impls = [r["impl"] for r in report["results"]]
    assert impls == ["minilm", "hf_llama"]
    minilm, peer = report["results"]
    assert minilm["matmul_params"] == peer["matmul_params"]  # the same shape, so the same FLOPs per token
    assert report["ratios"][0]["ratio"] == pytest.approx(minilm["tokens_per_s"] / peer["tokens_per_s"], rel=1e-2)
    paired = report["ratios"][0]["paired"]
    assert paired["status"] == "ok" and paired["pairs"] == 1 and paired["ratio"] > 0
    md = next(tmp_path.glob("*.md")).read_text()
    assert f"| {paired['ratio']:.2f}× |" in md  # the interleaved ratio's column


def test_compiled_measurements_compile_afresh_and_static(bench, tmp_path, monkeypatch):
    """With --compile, each (encoding, length) is a fresh static compilation, as a training phase at one length:
    without a reset the second length recompiled into a dynamic-shape graph, and graphs piled up towards dynamo's
    recompile limit. error_on_recompile turns any recompilation into a failure; the eager backend skips inductor."""
    real_compile, seen = torch.compile, []

    def eager_compile(fn, **kw):
        seen.append(kw)
        return real_compile(fn, **{**kw, "backend": "eager"})

    monkeypatch.setattr(torch, "compile", eager_compile)
    args = bench.parse_args(
        ["--lengths", "8,16,24", "--encodings", "rope,alibi", "--steps", "1", "--warmup", "1", "--threads", "1",
         "--batch-size", "2", "--device", "cpu", "--compile", "--out", str(tmp_path), *TINY]
    )  # fmt: skip
    with torch._dynamo.config.patch(error_on_recompile=True):
        report = bench.run(args)
    assert [r["status"] for r in report["results"]] == ["ok"] * 6
    assert len(seen) == 6 and all(kw.get("dynamic") is False for kw in seen)
