"""scripts/bench_attention.py: the attention core per encoding, on a tiny model on CPU."""

import json
import sys

import pytest
import torch

from tests.conftest import REPO, load_script

TINY = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "data.tokenizer.vocab_size=64"]


@pytest.fixture(scope="module")
def attn_bench():
    sys.path.insert(0, str(REPO / "scripts"))
    return load_script("scripts/bench_attention.py")


def test_rows_name_their_kernel_and_compare_with_rope(attn_bench, tmp_path, monkeypatch):
    docs = tmp_path / "performance.md"
    monkeypatch.setattr(attn_bench.bench, "DOCS", docs)
    argv = ["--lengths", "8,16", "--encodings", "rope,alibi,cope", "--tokens", "32", "--steps", "2", "--warmup", "1",
            "--threads", "1", "--device", "cpu", "--out", str(tmp_path / "out"), "--update-docs", *TINY]  # fmt: skip
    assert attn_bench.main(argv) == 0
    saved = json.loads(next((tmp_path / "out").glob("*-attention.json")).read_text())
    assert saved["complete"] and saved["measured"] == saved["planned"] == 6
    # length by length, so a run its time limit stops keeps whole lengths, each with RoPE to compare against
    assert [(r["encoding"], r["seq_len"]) for r in saved["results"]] == [
        ("rope", 8), ("alibi", 8), ("cope", 8), ("rope", 16), ("alibi", 16), ("cope", 16)]  # fmt: skip
    rows = {(r["encoding"], r["seq_len"]): r for r in saved["results"]}
    assert [rows["rope", 8]["kernel"], rows["alibi", 8]["kernel"], rows["cope", 8]["kernel"]] == [
        "sdpa", "sdpa_bias", "reference"]  # fmt: skip
    assert rows["alibi", 16]["batch_size"] == 2 and rows["rope", 8]["batch_size"] == 4  # B = tokens // T
    for r in rows.values():
        assert r["status"] == "ok" and r["ms"] > 0 and r["tokens_per_s"] == pytest.approx(
            1000 * r["tokens_per_step"] / r["ms"], rel=1e-2)  # fmt: skip
    ratio = rows["alibi", 16]["tokens_per_s"] / rows["rope", 16]["tokens_per_s"]
    assert f"| alibi | sdpa_bias | 16 | 2 | {rows['alibi', 16]['ms']:,.2f} |" in docs.read_text()
    assert f"| {ratio:.2f}× |" in docs.read_text()


def test_a_backward_that_fails_is_an_error_row(attn_bench, tmp_path, monkeypatch):
    """The core's backward is timed too (the gradients FlexAttention must scatter into the encoding's tables are
    the part most likely to fail or be slow on a GPU): an exception there is an error row, and the exit code 1."""
    real = attn_bench.build_core

    def failing_backward(cfg, *a, **kw):
        step, kernel = real(cfg, *a, **kw)
        if cfg.model.position.name == "kerple":
            def step(_i):
                raise RuntimeError("backward of the captured table failed")
        return step, kernel

    monkeypatch.setattr(attn_bench, "build_core", failing_backward)
    argv = ["--lengths", "8", "--encodings", "rope,kerple", "--tokens", "16", "--steps", "1", "--warmup", "1",
            "--threads", "1", "--device", "cpu", "--out", str(tmp_path), *TINY]  # fmt: skip
    assert attn_bench.main(argv) == 1
    rope, kerple = json.loads(next(tmp_path.glob("*.json")).read_text())["results"]
    assert rope["status"] == "ok" and kerple["status"] == "error" and "captured table" in kerple["error"]
    assert kerple["kernel"] == "sdpa_bias"


def test_a_lost_device_stops_the_run_after_writing_the_failed_row(attn_bench, tmp_path, monkeypatch, capsys):
    """As scripts/benchmark.py: a failure that took the CUDA context with it (simulated on CPU) is written as its row
    and ends the run, partial, exit 1; the encodings after it are not tried."""
    real = attn_bench.build_core

    def failing(cfg, *a, **kw):
        if cfg.model.position.name == "alibi":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(cfg, *a, **kw)

    def synchronize_fails(device, error, where, row=None):
        raise attn_bench.bench.DeviceLost(error, where, row)

    monkeypatch.setattr(attn_bench, "build_core", failing)
    monkeypatch.setattr(attn_bench.bench, "raise_if_device_lost", synchronize_fails)
    argv = ["--lengths", "8", "--encodings", "rope,alibi,t5", "--tokens", "16", "--steps", "1", "--warmup", "1",
            "--threads", "1", "--device", "cpu", "--out", str(tmp_path), *TINY]  # fmt: skip
    assert attn_bench.main(argv) == 1
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert not saved["complete"] and (saved["measured"], saved["planned"]) == (2, 3)
    assert [(r["encoding"], r["status"]) for r in saved["results"]] == [("rope", "ok"), ("alibi", "error")]
    assert "alibi T=8 failed and took the CUDA context with it" in capsys.readouterr().err


@pytest.mark.parametrize("flags, forms, says", [
    ([], (True, 1, False, False), None),
    (["--no-flex-table"], (False, 1, False, False), "no Flex tables"),
    (["--flex-table-copies", "8"], (True, 8, False, False), "Flex tables in 8 copies"),
    (["--flex-split"], (True, 1, True, False), "T5 in near/far parts"),
    (["--kerple-forwards"], (True, 1, False, True), "KERPLE's coefficients by extra forwards"),
])  # fmt: skip
def test_the_flex_forms_hold_while_measuring_and_are_reported(attn_bench, tmp_path, monkeypatch, flags, forms, says):
    """``--no-flex-table`` (T5's and KERPLE's direct score_mods), ``--flex-table-copies R``, ``--flex-split`` (T5
    in near and far parts) and ``--kerple-forwards`` (KERPLE's coefficients' gradients by extra forwards): the A/Bs
    of the learned biases' FlexAttention forms (minilm/positions/bias.py). Every measurement runs in the forms asked
    for, as every model built then reads them; the report and its table say which; and they are restored after the
    run (the defaults for the next)."""
    from minilm.positions import bias

    def current():
        assert bias.T5Bias.flex_distance_table == bias.Kerple.flex_distance_table
        return (bias.T5Bias.flex_distance_table, bias.FLEX_TABLE_COPIES, bias.T5Bias.flex_split,
                bias.Kerple.flex_coefficient_forwards)  # fmt: skip

    seen, real_measure = [], attn_bench.measure
    monkeypatch.setattr(attn_bench, "measure", lambda *a, **kw: seen.append(current()) or real_measure(*a, **kw))
    argv = ["--lengths", "8", "--encodings", "t5,kerple", "--tokens", "16", "--steps", "1", "--warmup", "1",
            "--threads", "1", "--device", "cpu", "--out", str(tmp_path), *flags, *TINY]  # fmt: skip
    assert attn_bench.main(argv) == 0
    assert seen == [forms, forms] and current() == (True, 1, False, False)
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert (saved["flex_table"], saved["flex_table_copies"], saved["flex_split"], saved["kerple_forwards"]) == forms
    head = next(tmp_path.glob("*.md")).read_text().splitlines()[2]
    assert says in head if says else not any(w in head for w in ("Flex tables", "near/far", "KERPLE"))


def test_uncompiled_measurements_do_not_share_compiled_kernels(attn_bench, tmp_path, monkeypatch):
    """Without --compile the core is eager, but on CUDA its FlexAttention kernel is one process-wide
    torch.compile(flex_attention), static per shape (minilm/model/flex.py). Shared by every (encoding, length) of a
    run, its graphs piled up until dynamo's recompile limit (8) sent the rest — FIRE, and KERPLE at 32K, in
    gpu_session.sh's `attn` — to eager flex_attention, which materializes the scores. Here a shared compiled
    function stands in for that kernel (FlexAttention has no CPU backward); error_on_recompile makes a
    recompilation, i.e. a measurement reusing an earlier one's cache, a failure."""
    shared = torch.compile(lambda t: t + 1, backend="eager", dynamic=False)
    real = attn_bench.build_core

    def with_shared_kernel(cfg, T, *a, **kw):
        step, kernel = real(cfg, T, *a, **kw)

        def step_and_kernel(i):
            step(i)
            shared(torch.zeros(T))

        return step_and_kernel, kernel

    monkeypatch.setattr(attn_bench, "build_core", with_shared_kernel)
    argv = ["--lengths", "8,16", "--encodings", "rope,alibi", "--tokens", "16", "--steps", "1", "--warmup", "1",
            "--threads", "1", "--device", "cpu", "--out", str(tmp_path), *TINY]  # fmt: skip
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert attn_bench.main(argv) == 0
    assert [r["status"] for r in json.loads(next(tmp_path.glob("*.json")).read_text())["results"]] == ["ok"] * 4


def test_bad_arguments_and_misspelled_encodings_stop_before_any_measurement(attn_bench, tmp_path, capsys):
    """Exit 2 with the option or key named, before anything is measured or written."""
    argv = ["--lengths", "8", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu",
            "--out", str(tmp_path), *TINY]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        attn_bench.parse_args(["--tokens", "0", *argv])
    assert stop.value.code == 2 and "argument --tokens: must be at least 1, got 0" in capsys.readouterr().err
    assert attn_bench.main(["--encodings", "rope,alibbi", *argv]) == 2
    assert "unknown encoding 'alibbi'" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_overrides_may_follow_flags_as_train_pys_do(attn_bench):
    """Overrides after a flag were 'unrecognized arguments' (parse_args): train.py accepts them anywhere."""
    args = attn_bench.parse_args(["model.n_layers=1", "--lengths", "8", "model.d_model=32", "--no-compile"])
    assert args.overrides == ["model.n_layers=1", "model.d_model=32"] and args.lengths == "8"


def test_a_length_beyond_a_bounded_encoding_stops_before_any_measurement(attn_bench, tmp_path, capsys):
    """A length beyond learned positions' table was an error row (exit 1) after the other encodings had run."""
    argv = ["--lengths", "4096", "--steps", "1", "--warmup", "0", "--threads", "1", "--device", "cpu",
            "--out", str(tmp_path), *TINY]  # fmt: skip
    assert attn_bench.main(["--encodings", "rope,learned", *argv]) == 2
    assert "--lengths: 4096 is longer than the learned encoding supports (2048 positions)" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_no_cpu_fp32_backward_holds_for_its_run_only(attn_bench, tmp_path, monkeypatch):
    """--no-cpu-fp32-backward set CPU_FP32_BACKWARD_BELOW to 0 for good: a later run in the same process measured
    bf16 backward everywhere while its report said cpu_fp32_backward True."""
    from minilm.model import attention

    seen, measure = [], attn_bench.measure
    monkeypatch.setattr(attn_bench, "measure", lambda *a: seen.append(attention.CPU_FP32_BACKWARD_BELOW) or measure(*a))
    argv = ["--lengths", "8", "--encodings", "rope", "--tokens", "16", "--steps", "1", "--warmup", "0", "--threads",
            "1", "--device", "cpu", "--out", str(tmp_path), *TINY]  # fmt: skip
    default = attention.CPU_FP32_BACKWARD_BELOW
    assert attn_bench.main([*argv, "--no-cpu-fp32-backward"]) == 0 and seen == [0]
    assert attention.CPU_FP32_BACKWARD_BELOW == default > 0
    assert attn_bench.main(argv) == 0 and seen == [0, default]


def test_a_position_override_reaches_the_encodings_that_take_it(attn_bench, tmp_path):
    """``--encodings rope,kerple model.position.eps=0.05`` was exit 2 (RoPE, the config's encoding, refused KERPLE's
    parameter before the encodings were swapped in): KERPLE's core is built with it, RoPE's without."""
    built = []
    real = attn_bench.build_core

    def recording(cfg, *a, **kw):
        built.append(dict(cfg.model.position))
        return real(cfg, *a, **kw)

    argv = ["--lengths", "8", "--encodings", "rope,kerple", "--tokens", "8", "--steps", "1", "--warmup", "0",
            "--threads", "1", "--device", "cpu", "--out", str(tmp_path), "model.position.eps=0.05", *TINY]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attn_bench, "build_core", recording)
        assert attn_bench.main(argv) == 0
    assert [b["name"] for b in built] == ["rope", "kerple"] and "eps" not in built[0] and built[1]["eps"] == 0.05
    assert "(model.position.eps=0.05 reached kerple only)" in next(tmp_path.glob("*.md")).read_text()
