"""scripts/benchmark.py: runs a couple of steps on a tiny model and writes its JSON, markdown and docs table."""

import json

import pytest
import torch

from tests.conftest import REPO, load_script

TINY = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "data.tokenizer.vocab_size=64"]


@pytest.fixture(scope="module")
def bench():
    return load_script("scripts/benchmark.py")


@pytest.mark.parametrize("unit, says", [("AVX512-BF16", ", AVX512-BF16)"), ("", ", no bf16 unit)")])
def test_a_cpus_name_says_its_bf16_unit(bench, unit, says, monkeypatch):
    """Two CPUs of one model name (AMD EPYC: AVX2 only, or Zen 4 with AVX512-BF16) train in different precisions at
    auto, at very different speeds: the results' device names which."""
    monkeypatch.setattr(bench, "cpu_bf16_unit", lambda: unit)
    name, slug = bench.device_info(torch.device("cpu"))
    assert name.startswith("CPU (") and name.endswith(says) and slug == "cpu"


def test_flops_formula_and_matmul_params(bench):
    assert bench.flops_per_token(1000, 2, 16, 8) == 6 * 1000 + 12 * 2 * 16 * 8
    emb = torch.nn.Embedding(10, 4)
    model = torch.nn.ModuleDict({"emb": emb, "lin": torch.nn.Linear(4, 3, bias=False)})
    assert bench.matmul_params(model, emb.weight, emb.weight) == 12 + 40  # a tied head is counted once
    head = torch.nn.Linear(4, 10, bias=False)
    model["head"] = head
    assert bench.matmul_params(model, emb.weight, head.weight) == 12 + 40


def test_benchmark_writes_results(bench, tmp_path, monkeypatch, capsys):
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
    import lightning
    import omegaconf

    # the versions measured with, printed first (gpu_session.sh's check shows them; it ran a process to import them)
    assert (saved["lightning"], saved["omegaconf"], saved["cuda"]) == (lightning.__version__, omegaconf.__version__,
                                                                       torch.version.cuda)  # fmt: skip
    assert capsys.readouterr().out.startswith(f"{saved['device_name']} · torch {torch.__version__}")
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


def test_the_trainer_row_trains_the_plain_loops_steps_through_train_pys_loop(bench, tmp_path, monkeypatch):
    """--trainer: a minilm-trainer row per measurement, LitGPT in a Lightning Trainer (train.py's loop) on the same
    model, batches, optimizer and lr as the plain loop: the same steps, so the same last loss; timed whole, one time
    per repeat."""
    from minilm.training import lit_module

    fits = []
    real = lit_module.LitGPT.on_train_start
    monkeypatch.setattr(lit_module.LitGPT, "on_train_start", lambda self: fits.append(self) or real(self))
    args = bench.parse_args(["--lengths", "8", "--steps", "3", "--warmup", "1", "--repeats", "2", "--threads", "1",
                             "--batch-size", "2", "--device", "cpu", "--trainer", "--out", str(tmp_path), *TINY])
    rows = {r["impl"]: r for r in bench.run(args)["results"]}
    assert set(rows) == {"minilm", "minilm-trainer"} and len(fits) == 2  # one fit per repeat
    plain, trainer = rows["minilm"], rows["minilm-trainer"]
    assert trainer["status"] == "ok" and trainer["tokens_per_s"] > 0 and len(trainer["step_ms"]) == 2
    assert trainer["loss"] == pytest.approx(plain["loss"], abs=2e-4) and trainer["loss"] != 0
    assert trainer["matmul_params"] == plain["matmul_params"]
    assert "| minilm-trainer | rope | 8 | 2 |" in (tmp_path / next(p.name for p in tmp_path.glob("*.md"))).read_text()


def test_profile_writes_where_each_measurements_time_goes(bench, tmp_path, monkeypatch):
    """--profile: after the timed steps, PROFILE_STEPS more under torch.profiler; one table per measurement (the
    peer's too), in a folder beside the results, named in its row; the timed steps are not profiled."""
    calls = []
    real = bench.profile_steps
    monkeypatch.setattr(bench, "profile_steps", lambda *a: calls.append(a[2]) or real(*a))
    out = tmp_path / "out"
    args = bench.parse_args(["--lengths", "8", "--encodings", "rope,alibi", "--steps", "2", "--warmup", "1",
                             "--threads", "1", "--batch-size", "2", "--device", "cpu", "--out", str(out),
                             "--profile", *TINY])  # fmt: skip
    report = bench.run(args)
    assert calls == ["minilm rope T=8 B=2", "minilm alibi T=8 B=2"]
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    assert folder.name == next(out.glob("*.json")).stem + "-profiles"
    assert sorted(p.name for p in folder.iterdir()) == ["minilm-alibi-8.txt", "minilm-rope-8.txt"]
    text = (folder / "minilm-rope-8.txt").read_text()
    assert text.startswith("minilm rope T=8 B=2: 3 steps, by self CPU time") and "aten::mm" in text
    assert [r["profile"] for r in report["results"]] == [f"{folder.name}/minilm-{e}-8.txt" for e in ("rope", "alibi")]
    assert all(len(r["step_ms"]) == 2 for r in report["results"])
    assert f"- minilm alibi T=8: `{folder.name}/minilm-alibi-8.txt`" in next(out.glob("*.md")).read_text()
    plain = bench.run(bench.parse_args(["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1",
                                        "--device", "cpu", "--out", str(tmp_path / "plain"), *TINY]))  # fmt: skip
    assert "profile" not in plain["results"][0] and len(calls) == 2

    def broken(*a):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(bench, "profile_steps", broken)  # a failing profiler loses no measurement
    args.out = str(tmp_path / "broken")
    (row,) = bench.run(args)["results"][:1]
    assert row["status"] == "ok" and row["profile"] == "failed: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"


def test_the_flex_forms_reach_every_model_of_the_run_and_the_table(bench, tmp_path, monkeypatch):
    """--no-flex-table / --flex-table-copies / --flex-split, as scripts/bench_attention.py's (its test checks each):
    on the whole step, the forms hold while measuring, the table says so, and they are restored after."""
    from minilm.positions import bias

    seen, real = [], bench.build_step
    monkeypatch.setattr(bench, "build_step", lambda *a, **kw: seen.append(
        (bias.Kerple.flex_distance_table, bias.FLEX_TABLE_COPIES, bias.T5Bias.flex_split)) or real(*a, **kw))
    args = bench.parse_args(["--lengths", "8", "--encodings", "t5", "--steps", "1", "--warmup", "0", "--threads",
                             "1", "--device", "cpu", "--out", str(tmp_path), "--no-flex-table", "--flex-table-copies",
                             "4", "--flex-split", *TINY])  # fmt: skip
    bench.run(args)
    assert seen == [(False, 4, True)]
    assert (bias.Kerple.flex_distance_table, bias.FLEX_TABLE_COPIES, bias.T5Bias.flex_split) == (True, 1, False)
    head = next(tmp_path.glob("*.md")).read_text()
    assert "· no Flex tables · Flex tables in 4 copies · T5 in near/far parts ·" in head


def test_the_table_gives_each_encoding_against_rope_at_its_length_and_batch(bench):
    """Issue #8's bias-encoding target (>= 0.9x RoPE's tokens/s at 1K and 8K) is read off the table."""
    def row(enc, T, B, tps, impl="minilm"):
        return {"impl": impl, "encoding": enc, "seq_len": T, "batch_size": B, "tokens_per_s": tps, "status": "ok"}

    report = {"device_name": "cpu", "torch": "t", "threads": 1, "precision": "32", "compile": False, "date": "d",
              "config": "c", "overrides": [], "steps": 1, "warmup": 1, "repeats": 1, "memory_kind": "m", "ratios": [],
              "results": [row("rope", 8, 2, 1000.0), row("rope", 16, 1, 400.0), row("alibi", 8, 2, 900.0),
                          row("alibi", 16, 1, 500.0), row("t5", 16, 2, 300.0), row("rope", 8, 2, 800.0, "hf_llama")]}
    lines = [line.split(" | ") for line in bench.markdown_table(report).splitlines() if line.startswith("| ")]
    col = lines[0].index("vs RoPE")
    got = {(c[0].lstrip("| "), c[1], c[2], c[3]): c[col] for c in lines[1:]}
    assert got == {("minilm", "rope", "8", "2"): "–", ("minilm", "rope", "16", "1"): "–",
                   ("minilm", "alibi", "8", "2"): "0.90×", ("minilm", "alibi", "16", "1"): "1.25×",
                   ("minilm", "t5", "16", "2"): "–",  # no RoPE row at this batch
                   ("hf_llama", "rope", "8", "2"): "–"}  # fmt: skip


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


def test_the_peer_trains_in_its_own_precision_when_given_one(bench, tmp_path, monkeypatch):
    """--peer-precision 32 beside minilm in bf16-mixed: each model's steps, timed alone and interleaved, run in
    its own precision, and the table says which."""
    pytest.importorskip("transformers")
    built, real = [], bench.build_step

    def recording(impl, cfg, T, B, device, amp_dtype, do_compile):
        built.append((impl, amp_dtype))
        return real(impl, cfg, T, B, device, amp_dtype, do_compile)

    monkeypatch.setattr(bench, "build_step", recording)
    args = bench.parse_args(
        ["--lengths", "16", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu", "--peer",
         "--precision", "bf16-mixed", "--peer-precision", "32", "--batch-size", "2", "--out", str(tmp_path), *TINY]
    )  # fmt: skip
    report = bench.run(args)
    assert set(built) == {("minilm", torch.bfloat16), ("hf_llama", None)} and len(built) == 4  # alone, interleaved
    assert report["precision"] == "bf16-mixed" and report["peer_precision"] == "32"
    assert "precision bf16-mixed (peer: 32) ·" in next(tmp_path.glob("*.md")).read_text()


def test_compiled_measurements_compile_afresh_and_static(bench, tmp_path, monkeypatch):
    """With --compile, each (encoding, length) is a fresh static compilation, as a training phase at one length:
    without a reset the second length recompiled into a dynamic-shape graph, and graphs piled up towards dynamo's
    recompile limit. error_on_recompile turns any recompilation into a failure; the eager backend skips inductor."""
    real_compile, seen = torch.compile, []

    def eager_compile(fn, mode=None, **kw):
        seen.append({**kw, "mode": mode})
        return real_compile(fn, **{**kw, "backend": "eager"})

    monkeypatch.setattr(torch, "compile", eager_compile)
    args = bench.parse_args(
        ["--lengths", "8,16,24", "--encodings", "rope,alibi", "--steps", "1", "--warmup", "1", "--threads", "1",
         "--batch-size", "2", "--device", "cpu", "--compile", "--out", str(tmp_path), *TINY]
    )  # fmt: skip
    with torch._dynamo.config.patch(error_on_recompile=True):
        report = bench.run(args)
    assert [r["status"] for r in report["results"]] == ["ok"] * 6
    assert len(seen) == 6 and all(kw.get("dynamic") is False and kw["mode"] is None for kw in seen)
    # train.compile_mode, the trainer's, is the benchmark's too, and the table says it
    args = bench.parse_args(["--lengths", "8", "--steps", "1", "--warmup", "1", "--threads", "1", "--device", "cpu",
                             "--compile", "--out", str(tmp_path / "mode"), *TINY,
                             "train.compile_mode=max-autotune-no-cudagraphs"])  # fmt: skip
    assert bench.run(args)["compile_mode"] == "max-autotune-no-cudagraphs"
    assert seen[-1]["mode"] == "max-autotune-no-cudagraphs"
    assert "compile True (max-autotune-no-cudagraphs) ·" in next((tmp_path / "mode").glob("*.md")).read_text()


def _two_encodings(tmp_path):
    return ["--lengths", "8", "--encodings", "rope,alibi", "--steps", "1", "--warmup", "1", "--threads", "1",
            "--batch-size", "2", "--device", "cpu", "--out", str(tmp_path / "out"), "--update-docs", *TINY]  # fmt: skip


def _fail_for(bench, monkeypatch, encoding, exc):
    real = bench.build_step

    def build_step(impl, cfg, *a, **kw):
        if cfg.model.position.name == encoding:
            raise exc
        return real(impl, cfg, *a, **kw)

    monkeypatch.setattr(bench, "build_step", build_step)


def test_a_failing_measurement_is_reported_and_the_others_still_run(bench, tmp_path, monkeypatch, capsys):
    """A compiler or kernel failure for one encoding (likely on a first GPU run) must not lose the other rows: the
    row says "error" and why, the table lists it, and the exit code is 1."""
    monkeypatch.setattr(bench, "DOCS", tmp_path / "performance.md")
    _fail_for(bench, monkeypatch, "rope", RuntimeError("kernel exploded\nsecond line"))
    assert bench.main(_two_encodings(tmp_path)) == 1
    saved = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert saved["complete"] and saved["measured"] == saved["planned"] == 2
    rope, alibi = saved["results"]
    assert rope["status"] == "error" and rope["error"] == "RuntimeError: kernel exploded"
    assert alibi["status"] == "ok" and alibi["tokens_per_s"] > 0
    md = next((tmp_path / "out").glob("*.md")).read_text()
    assert "| minilm | rope | 8 | 2 | error |" in md and "- minilm rope T=8: `RuntimeError: kernel exploded`" in md
    err = capsys.readouterr().err
    assert "Traceback" in err and "1 measurement(s) failed: RuntimeError: kernel exploded" in err


def test_an_interrupted_run_keeps_what_it_measured(bench, tmp_path, monkeypatch, capsys):
    """SIGINT part-way (Ctrl-C, or gpu_session.sh's time limit) leaves the finished measurements in the JSON,
    the markdown and the docs, marked partial; exit code 130."""
    docs = tmp_path / "performance.md"
    monkeypatch.setattr(bench, "DOCS", docs)
    _fail_for(bench, monkeypatch, "alibi", KeyboardInterrupt())
    assert bench.main(_two_encodings(tmp_path)) == 130
    saved = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert not saved["complete"] and (saved["measured"], saved["planned"]) == (1, 2)
    assert [(r["encoding"], r["status"]) for r in saved["results"]] == [("rope", "ok")]
    assert "**partial: stopped after 1 of 2 measurements**" in docs.read_text()
    assert "interrupted after 1 of 2 measurements; results in" in capsys.readouterr().err


def test_a_lost_device_ends_the_run_with_the_failed_row_written(bench, tmp_path, monkeypatch, capsys):
    """A failure that takes the CUDA context with it (an illegal memory access at 128K tokens on the H100) leaves
    every later CUDA call failing: the run writes the failed row, marks the results partial and stops, exit 1,
    rather than dying in the freeing after it with nothing written. (The lost context is simulated on CPU.)"""
    docs = tmp_path / "performance.md"
    monkeypatch.setattr(bench, "DOCS", docs)
    _fail_for(bench, monkeypatch, "rope", RuntimeError("CUDA error: an illegal memory access was encountered"))
    lost = []

    def synchronize_fails(device, error, where, row=None):
        lost.append(where)
        raise bench.DeviceLost(error, where, row)

    monkeypatch.setattr(bench, "raise_if_device_lost", synchronize_fails)
    assert bench.main(_two_encodings(tmp_path)) == 1
    assert lost == ["minilm rope T=8"]  # alibi never ran
    saved = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert not saved["complete"] and (saved["measured"], saved["planned"]) == (1, 2)
    [rope] = saved["results"]
    assert rope["status"] == "error" and "illegal memory access" in rope["error"]
    assert "**partial: stopped after 1 of 2 measurements**" in docs.read_text()
    assert "- minilm rope T=8: `RuntimeError: CUDA error: an illegal memory access" in docs.read_text()
    err = capsys.readouterr().err
    assert "minilm rope T=8 failed and took the CUDA context with it" in err and "measure the rest in a new" in err


def test_uncompiled_measurements_do_not_share_compiled_kernels(bench, tmp_path, monkeypatch):
    """An eager model's FlexAttention kernel (CUDA) is one process-wide torch.compile(flex_attention), static per
    shape (minilm/model/flex.py): without a reset per measurement, --no-compile runs over several encodings and
    lengths piled its graphs up to dynamo's recompile limit, past which flex_attention ran eagerly (the scores
    materialized). A shared compiled function stands in for it; error_on_recompile makes reuse a failure."""
    shared = torch.compile(lambda t: t + 1, backend="eager", dynamic=False)
    real = bench.build_step

    def with_shared_kernel(impl, cfg, T, *a, **kw):
        step, n = real(impl, cfg, T, *a, **kw)

        def step_and_kernel(i):
            shared(torch.zeros(T))
            return step(i)

        return step_and_kernel, n

    monkeypatch.setattr(bench, "build_step", with_shared_kernel)
    args = bench.parse_args(
        ["--lengths", "8,16", "--encodings", "rope,alibi", "--steps", "1", "--warmup", "1", "--threads", "1",
         "--batch-size", "2", "--device", "cpu", "--no-compile", "--out", str(tmp_path), *TINY]
    )  # fmt: skip
    with torch._dynamo.config.patch(error_on_recompile=True):
        report = bench.run(args)
    assert [r["status"] for r in report["results"]] == ["ok"] * 4


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                        ("NVIDIA H100 NVL", 835.0), ("NVIDIA H200", 989.0), ("Tesla T4", None)])
def test_mfu_peak_follows_the_gpu_model(bench, monkeypatch, name, peak):
    """MFU's default peak is the device's dense bf16 peak: an H100 PCIe board is not an SXM one (756 vs 989
    TFLOP/s), and a GPU not in the table gets no MFU rather than another GPU's peak."""
    monkeypatch.setattr(bench, "device_info", lambda device: (name, "gpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = bench.parse_args(["--device", "cuda", *TINY])
    assert bench._setup(args, bench.load_config(None, TINY))[4] == peak


@pytest.mark.parametrize("bad, says", [
    (["--lengths", "1024,8k"], "argument --lengths: must be a whole number, got '8k'"),
    (["--lengths", "0"], "argument --lengths: must be at least 1, got 0"),  # was a ZeroDivisionError
    (["--steps", "0"], "argument --steps: must be at least 1, got 0"),  # was an error row per measurement
    (["--repeats", "0"], "argument --repeats: must be at least 1"),  # was an IndexError
    (["--batch-size", "0"], "argument --batch-size: must be at least 1"),  # was the config's batch, silently
    (["--warmup", "-1"], "argument --warmup: must be at least 0"),
    (["--peak-tflops", "0"], "argument --peak-tflops: must be a finite number > 0, got 0"),
    (["--peak-tflops", "inf"], "argument --peak-tflops: must be a finite number > 0, got inf"),  # was MFU 0.0 %
    (["--encodings", ","], "argument --encodings: comma-separated names, none of them empty"),  # 'unknown ... None'
    (["--tag", "a/b"], "argument --tag: letters, digits, '.', '_' and '-', beginning"),  # wrote into a folder a/
    (["--tag", "."], "argument --tag: letters, digits, '.', '_' and '-', beginning"),  # wrote ...-tiny-..json
    (["--tag", "v1."], "and ending with a letter, digit or '_', expected (it ends the result files' names), got 'v1.'"),
    (["--device", "gpu"], "argument --device: must be cpu, cuda or cuda:N, got 'gpu'"),  # was a RuntimeError
    (["--peer-precision", "32"], "--peer-precision needs --peer"),
])  # fmt: skip
def test_bad_arguments_are_usage_errors(bench, capsys, bad, says):
    """A bad option value stops at once with exit 2 and a message naming the option, never a traceback part-way
    or a silent default (the rule for every CLI here)."""
    with pytest.raises(SystemExit) as stop:
        bench.parse_args([*bad, *TINY])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_a_misspelled_encoding_or_absent_cuda_stops_before_any_measurement(bench, tmp_path, capsys, monkeypatch):
    """Every --encodings entry is checked before the first measurement (the typo was found only after the
    encodings before it had been measured), and --device cuda without CUDA is exit 2, not a row of errors."""
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--out", str(tmp_path), *TINY]
    assert bench.main(["--encodings", "rope,alibbi", "--device", "cpu", *argv]) == 2
    assert "unknown encoding 'alibbi'" in capsys.readouterr().err and not list(tmp_path.iterdir())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--device", "cuda", *argv]) == 2
    assert "--device cuda: CUDA is not available" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_result_files_keep_a_dotted_tag_and_out_must_be_a_writable_folder(bench, tmp_path, capsys):
    """--tag v1.5 wrote ...-v1.json (Path.with_suffix took '.5' for a suffix: it collided with --tag v1), and an
    --out that is a file was a FileExistsError traceback once the first measurement had run."""
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu", *TINY]
    (tmp_path / "afile").write_text("")
    assert bench.main([*argv, "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err
    assert f"error: --out {tmp_path / 'afile'} is not writable" in err and "tok/s" not in err
    bench.main([*argv, "--out", str(tmp_path / "r"), "--tag", "v1.5"])
    assert sorted(p.name.split("-cpu-")[1] for p in (tmp_path / "r").iterdir()) == ["run-v1.5.json", "run-v1.5.md"]


def test_peer_without_a_rope_measurement_is_a_usage_error(bench, tmp_path, capsys):
    """The peer is a RoPE model, compared only with the rope encoding: --peer with only other encodings measured
    them and left the peer out without a word."""
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu", "--peer",
            "--out", str(tmp_path), *TINY]  # fmt: skip
    assert bench.main(["--encodings", "alibi,t5", *argv]) == 2
    assert ("--peer: the peer (LlamaForCausalLM) is compared with minilm's rope encoding only, and this run measures "
            "alibi, t5: add rope to --encodings, or drop --peer") in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_overrides_may_follow_flags_as_train_pys_do(bench):
    """``--config X key=value --lengths 8 key2=value`` was 'unrecognized arguments: key2=value' (argparse's
    parse_args takes one run of positionals): train.py accepts overrides anywhere, and so do the benchmarks."""
    args = bench.parse_args(["model.n_layers=1", "--lengths", "8", "model.d_model=32", "--steps", "1", "x.y=2"])
    assert args.overrides == ["model.n_layers=1", "model.d_model=32", "x.y=2"] and args.lengths == "8"


def test_a_length_beyond_a_bounded_encoding_stops_before_any_measurement(bench, tmp_path, capsys):
    """--lengths longer than learned positions' table measured the encodings before it, then gave an error row and
    exit 1: a usage error, found before anything runs, with the key that raises the limit."""
    argv = ["--lengths", "8,4096", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu",
            "--out", str(tmp_path), *TINY]  # fmt: skip
    assert bench.main(["--encodings", "rope,learned", *argv]) == 2
    err = capsys.readouterr().err
    assert ("error: --lengths: 4096 is longer than the learned encoding supports (2048 positions); raise "
            "model.position.max_positions") in err and "tok/s" not in err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("markers", [
    "<!-- benchmark:cpu-run:begin -->\nold\n",  # an end marker lost: the table was appended, the stray begin left
    "<!-- benchmark:cpu-run:end -->\nkept\n<!-- benchmark:cpu-run:begin -->\nold\n",  # reversed: 'kept' doubled
    "<!-- benchmark:cpu-run:begin -->\na\n<!-- benchmark:cpu-run:end -->\nkept\n"
    "<!-- benchmark:cpu-run:begin -->\nb\n<!-- benchmark:cpu-run:end -->\n",  # twice: 'kept' cut out
])  # fmt: skip
def test_update_docs_with_broken_markers_stops_before_any_measurement(bench, tmp_path, monkeypatch, capsys, markers):
    """Markers of this table once each, begin before end, or none (the table is appended); anything else is exit 2
    naming the file and line, before anything is measured, and the docs are left as they were."""
    docs = tmp_path / "performance.md"
    docs.write_text(f"# Performance\n\n{markers}")
    monkeypatch.setattr(bench, "DOCS", docs)
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu", "--update-docs",
            "--out", str(tmp_path / "out"), *TINY]  # fmt: skip
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: --update-docs: {docs} must hold this table's markers once each" in err and f"{docs}:3 " in err
    assert docs.read_text() == f"# Performance\n\n{markers}" and not (tmp_path / "out").exists()


def test_peer_with_another_mlp_is_a_usage_error(bench, tmp_path, capsys):
    """The peer is a Llama, SwiGLU MLP: with model.mlp=gelu it was a SwiGLU of gelu's 4·d_model width (half as large
    again), and the ratio compared two different models as 'same-shaped'."""
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu", "--peer",
            "--out", str(tmp_path), *TINY, "model.mlp=gelu"]  # fmt: skip
    assert bench.main(argv) == 2
    assert ("--peer: the peer (LlamaForCausalLM) has a SwiGLU MLP, and model.mlp is 'gelu': set model.mlp=swiglu, "
            "or drop --peer") in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_position_override_reaches_the_encodings_that_take_it(bench, tmp_path, capsys):
    """``--encodings rope,t5 model.position.num_buckets=64`` was exit 2 ("num_buckets: unknown parameter; this
    encoding takes: base, ...": the overrides went to the config's RoPE before the encoding was swapped): T5 gets
    it, RoPE does not, and the output and the table say so."""
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu",
            "--encodings", "rope,t5", "--out", str(tmp_path), "model.position.num_buckets=64", *TINY]  # fmt: skip
    args = bench.parse_args(argv)
    base = bench.base_config(args)
    configs = bench.encoding_configs(args, base)
    assert configs["t5"].model.position.num_buckets == 64 and "num_buckets" not in configs["rope"].model.position
    assert base.model.n_layers == configs["rope"].model.n_layers == configs["t5"].model.n_layers == 1
    assert bench.main(argv) == 0
    assert "model.position.num_buckets=64 reached t5 only" in capsys.readouterr().out
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert saved["position_overrides"] == {"rope": [], "t5": ["model.position.num_buckets=64"]}
    assert "(model.position.num_buckets=64 reached t5 only)" in next(tmp_path.glob("*.md")).read_text()


@pytest.mark.parametrize("override, says", [
    ("model.position.num_buckets=64", ["model.position.num_buckets: no encoding of --encodings rope,alibi takes this "
                                       "parameter (rope takes: base, ", "alibi takes: max_bias"]),
    ("model.position.name=t5", ["model.position.name: --encodings sets model.position.name for each of its"]),
])  # fmt: skip
def test_a_position_override_no_listed_encoding_takes_is_a_usage_error(bench, tmp_path, capsys, override, says):
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu",
            "--encodings", "rope,alibi", "--out", str(tmp_path), override, *TINY]  # fmt: skip
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert all(part in err for part in says) and "Traceback" not in err and not list(tmp_path.iterdir())


def test_a_phase_position_override_reaches_the_encodings_that_take_it(bench, tmp_path):
    """``--config configs/rope_yarn_tiny.yaml --encodings rope,alibi phases.extend_512.position.scaling.factor=8``
    was exit 2 ("phases.extend_512.position.scaling: unknown parameter; this encoding takes: max_bias"): a phase's
    position overrides went to every encoding. RoPE's phase gets it, ALiBi's does not."""
    argv = ["--config", str(REPO / "configs/rope_yarn_tiny.yaml"), "--lengths", "8", "--encodings", "rope,alibi",
            "--out", str(tmp_path), "phases.extend_512.position.scaling.factor=8", *TINY]  # fmt: skip
    args = bench.parse_args(argv)
    configs = bench.encoding_configs(args, bench.base_config(args))
    assert configs["rope"].phases.extend_512.position.scaling.factor == 8
    assert "scaling" not in configs["alibi"].phases.extend_512.position
    assert bench.split_overrides(args)[1] == {"rope": ["phases.extend_512.position.scaling.factor=8"], "alibi": []}


def test_a_phase_position_override_no_listed_encoding_takes_is_a_usage_error(bench, tmp_path, capsys):
    argv = ["--config", str(REPO / "configs/rope_yarn_tiny.yaml"), "--lengths", "8", "--steps", "1", "--warmup", "0",
            "--threads", "1", "--device", "cpu", "--encodings", "t5,alibi", "--out", str(tmp_path),
            "phases.extend_512.position.scaling.factor=8", *TINY]  # fmt: skip
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert ("phases.extend_512.position.scaling: no encoding of --encodings t5,alibi takes this parameter (t5 takes: "
            in err) and "Traceback" not in err and not list(tmp_path.iterdir())
