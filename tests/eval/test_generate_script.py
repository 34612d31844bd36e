"""scripts/generate.py end to end on a run directory: what it prints, and that it prints as it generates."""

import sys

import numpy as np
import pytest

from tests.conftest import load_script


class _Recorder:
    """A stdout that keeps each write apart, to see whether text came out in pieces."""

    def __init__(self):
        self.writes = []

    def write(self, s):
        self.writes.append(s)
        return len(s)

    def flush(self):
        pass


def test_generate_prints_prompt_and_greedy_continuation_as_it_goes(fake_run, monkeypatch):
    from minilm.cli import run_cli
    from minilm.model.generate import generate
    from minilm.runs import load_run

    run = load_run(fake_run)
    prompt = "def main(x):\n    return"
    ids = run.tokenizer.encode(prompt)
    want = generate(run.model, ids, 12, greedy=True, eos_id=run.tokenizer.eos_id)[0, len(ids) :].tolist()
    if want and want[-1] == run.tokenizer.eos_id:
        want = want[:-1]

    gen, out = load_script("scripts/generate.py"), _Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    argv = [str(fake_run), "--prompt", prompt, "--max-new-tokens", "12", "--greedy", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), argv) == 0
    assert "".join(out.writes) == prompt + run.tokenizer.decode(want) + "\n"
    assert out.writes[0].startswith(prompt)
    assert len([w for w in out.writes if w]) > 2  # streamed: not one print at the end


def test_generate_prints_nothing_for_bad_arguments(fake_run, monkeypatch, capsys):
    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    argv = [str(fake_run), "--prompt", "x", "--temperature", "-1", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "temperature" in captured.err  # the prompt is not printed before the checks


def test_generate_takes_the_extensions_evaluate_takes_with_the_same_defaults(fake_run, monkeypatch, capsys):
    """``evaluate.py --extension dynamic factor=2`` (a rope_type) and ``--extension logn`` (train_len from the training
    length) used to be refused by generate.py ('unknown training-free method', 'train_len: required'): the text
    behind an evaluated number could not be looked at with the same flag. Both now decode the evaluated model."""
    from minilm.cli import run_cli
    from minilm.eval import apply_extension
    from minilm.model.generate import generate
    from minilm.runs import load_run

    gen = load_script("scripts/generate.py")
    prompt = "def main(x):\n    return"
    for extension in (["dynamic", "factor=2"], ["logn"]):
        run = load_run(fake_run)
        ids = run.tokenizer.encode(prompt)
        params = {"name": extension[0], **({"factor": 2} if len(extension) > 1 else {})}
        model, _ = apply_extension(run.model, run.cfg.model, run.tokenizer.vocab_size, params, run.cfg.train.seq_len)
        want = generate(model, ids, 80, greedy=True, eos_id=run.tokenizer.eos_id)[0, len(ids) :].tolist()
        want = want[:-1] if want and want[-1] == run.tokenizer.eos_id else want
        argv = [str(fake_run), "--prompt", prompt, "--max-new-tokens", "80", "--greedy", "--device", "cpu",
                "--extension", *extension]  # fmt: skip
        assert run_cli(gen.main, gen.parser(), argv) == 0
        captured = capsys.readouterr()
        assert captured.out == prompt + run.tokenizer.decode(want) + "\n"
        # the extension applied, as the flag writes it (a Python dict was printed)
        assert ("[extension: dynamic factor=2 original_max_position_embeddings=64]" if len(extension) > 1
                else "[extension: logn train_len=64]") in captured.err, captured.err


def test_extension_none_decodes_the_plain_model_as_evaluate_takes_it(fake_run, capsys):
    """evaluate.py takes --extension none (the plain model); generate.py refused it as an unknown method."""
    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    argv = [str(fake_run), "--prompt", "def f(x):", "--max-new-tokens", "20", "--greedy", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), argv) == 0
    plain = capsys.readouterr().out
    assert run_cli(gen.main, gen.parser(), [*argv, "--extension", "none"]) == 0
    assert capsys.readouterr().out == plain
    assert run_cli(gen.main, gen.parser(), [*argv, "--extension", "none", "factor=2"]) == 2
    assert "--extension none takes no parameters, got factor=2" in capsys.readouterr().err


def test_the_checkpoint_may_follow_the_extension_parameters(fake_run, capsys):
    """``--prompt hi --extension logn RUN`` failed with "the following arguments are required: checkpoint": the
    --extension list took RUN too. Parameters are key=value, so the last word without '=' is the checkpoint; a word
    that can be neither is refused, saying how to write the command."""
    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    head = ["--prompt", "def f(x):", "--max-new-tokens", "5", "--greedy", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), [str(fake_run), *head, "--extension", "dynamic", "factor=2"]) == 0
    first = capsys.readouterr()
    assert run_cli(gen.main, gen.parser(), [*head, "--extension", "dynamic", "factor=2", str(fake_run)]) == 0
    assert capsys.readouterr() == first
    # --run RUN, as evaluate.py takes it too (it said 'unrecognized arguments: --run')
    assert run_cli(gen.main, gen.parser(), ["--run", str(fake_run), *head, "--extension", "dynamic", "factor=2"]) == 0
    assert capsys.readouterr() == first
    assert run_cli(gen.main, gen.parser(), [str(fake_run), "--run", str(fake_run / "train"), *head]) == 2
    assert "error: two runs given" in capsys.readouterr().err
    for argv, said in (([*head, "--extension", "logn", "oops", str(fake_run)], "'oops' is not a parameter"),
                       ([str(fake_run), *head, "--extension", "logn", "oops"], "'oops' is not a parameter"),
                       ([*head, "--extension", "logn"], "no run directory or checkpoint given")):  # fmt: skip
        assert run_cli(gen.main, gen.parser(), argv) == 2
        err = capsys.readouterr().err
        assert said in err and "write: generate.py RUN_DIR_OR_CHECKPOINT --prompt TEXT" in err  # as --help says


def test_errors_name_the_flags_as_given_before_the_run_is_loaded(tmp_path, capsys):
    """generate()'s checks named its parameters (top_k: must be >= 1), not the flags (--top-k), and ran after the
    model was loaded; here each names the flag, and the run (none here) is not read first."""
    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    for flags, said in ((["--top-k", "0"], "error: --top-k: must be >= 1, got 0"),
                        (["--top-p", "2"], "error: --top-p: must be in (0, 1], got 2.0"),
                        (["--max-new-tokens", "-1"], "error: --max-new-tokens: must be >= 0, got -1"),
                        (["--temperature", "nan"], "error: --temperature: must be a finite number >= 0"),
                        (["--device", "xyz"], "error: --device: must be cpu, cuda or cuda:N, got 'xyz'"),
                        (["--device", ""], "error: --device: must be cpu, cuda or cuda:N, got ''"),  # was the default
                        (["--extension", "yarn", "factor=-1"], "error: --extension yarn factor=-1: "),
                        (["--extension", "nope"], "error: --extension nope: ")):  # fmt: skip
        assert run_cli(gen.main, gen.parser(), [str(tmp_path / "no_run"), "--prompt", "x", *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(said), err
    help_text = " ".join(gen.parser().format_help().split())  # (argparse wraps the lines)
    assert "RUN_DIR_OR_CHECKPOINT" in help_text and "ignores --temperature / --top-k / --top-p" in help_text


def test_an_extension_the_run_cannot_take_names_the_flag(fake_run, capsys):
    """--extension logn on an ALiBi run said 'extension.name: 'logn' needs a RoPE model', a key the user never wrote;
    it names the flag as typed, as the errors found before the run is read do (the checkpoint after the parameters
    too), and so does a longrope whose lists do not fit the model."""
    from minilm.cli import run_cli

    from .conftest import configure_run

    gen = load_script("scripts/generate.py")
    head = ["--prompt", "x", "--device", "cpu"]
    longrope = ["longrope", "factor=2", "short_factor=[1,1]", "long_factor=[1,1]"]
    assert run_cli(gen.main, gen.parser(), [str(fake_run), *head, "--extension", *longrope]) == 2
    assert capsys.readouterr().err == ("error: --extension longrope factor=2 short_factor=[1,1] long_factor=[1,1]: "
                                       "extension.short_factor: must have one entry per rotary frequency (8), got 2\n")
    configure_run(fake_run, **{"model.position": {"name": "alibi"}})
    fits = "needs a RoPE model (model.position.name: rope); this model's encoding is 'alibi'\n"
    assert run_cli(gen.main, gen.parser(), [str(fake_run), *head, "--extension", "logn"]) == 2
    assert capsys.readouterr() == ("", f"error: --extension logn: 'logn' {fits}")
    argv = [*head, "--extension", "self_extend", "group_size=4", "window=16", str(fake_run)]
    assert run_cli(gen.main, gen.parser(), argv) == 2
    assert capsys.readouterr().err == f"error: --extension self_extend group_size=4 window=16: 'self_extend' {fits}"


def test_a_prompt_too_long_for_the_model_names_the_flags(fake_run, corpus_setup, capsys):
    """A prompt and --max-new-tokens beyond a learned table's positions said 'prompt (...) + max_new_tokens (...)',
    generate()'s parameter, not the flag typed: it names the flags, and says how many new tokens fit."""
    from minilm.cli import run_cli
    from minilm.training.checkpoint import save_weights

    from .conftest import configure_run, tiny_gpt

    cfg, corpus = corpus_setup
    position = {"name": "learned", "max_positions": 64}
    configure_run(fake_run, **{"model.position": position})
    for weights in (fake_run / "model.safetensors", fake_run / "train" / "model.safetensors"):
        save_weights(tiny_gpt(cfg, corpus.tokenizer.vocab_size, **position), weights)
    prompt = "def main(x):\n    return x\n" * 2
    n = len(corpus.tokenizer.encode(prompt))
    gen = load_script("scripts/generate.py")
    argv = [str(fake_run), "--prompt", prompt, "--max-new-tokens", "100", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), argv) == 2
    said = (f"error: --prompt ({n} tokens) + --max-new-tokens (100) reads {n + 99} positions (the last new token is not "
            f"read back), more than the 64 this model's learned encoding supports; at most {65 - n} new tokens fit "
            f"after this prompt\n")
    assert capsys.readouterr() == ("", said)


def test_greedy_ignores_the_sampling_flags_as_its_help_says(fake_run, capsys):
    """--greedy's help says it ignores --temperature / --top-k / --top-p, yet --greedy --top-k 0 was refused
    ('--top-k: must be >= 1'): a sampling command with --greedy appended now decodes by argmax, whatever values it
    carries. --max-new-tokens, which --greedy reads, is still checked."""
    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    argv = [str(fake_run), "--prompt", "def f(x):", "--max-new-tokens", "12", "--greedy", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), argv) == 0
    greedy = capsys.readouterr()
    sampling = ["--temperature", "-1", "--top-k", "0", "--top-p", "2", "--seed", "3"]
    assert run_cli(gen.main, gen.parser(), [*argv, *sampling]) == 0
    assert capsys.readouterr() == greedy
    argv[argv.index("12")] = "-1"
    assert run_cli(gen.main, gen.parser(), [*argv, *sampling]) == 2
    assert capsys.readouterr().err == "error: --max-new-tokens: must be >= 0, got -1\n"


def test_an_encoding_without_kv_cache_is_one_warning_line(fake_run, monkeypatch, capsys):
    """Decoding such an encoding went on without a cache under a Python warning that quoted torch's source
    ('.../_contextlib.py:124: UserWarning: ...' then '  return func(*args, **kwargs)'): one line now, naming the flag
    that does the same."""
    import minilm.model.generate
    from minilm.cli import run_cli

    monkeypatch.setattr(minilm.model.generate, "cache_blockers", lambda model: ["CausalConv"])
    gen = load_script("scripts/generate.py")
    argv = [str(fake_run), "--prompt", "def f(x):", "--max-new-tokens", "3", "--greedy", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), argv) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: CausalConv (") and "as --no-cache does" in err, err
    assert "UserWarning" not in err and err.count("\n") == 1


def test_a_prompt_that_is_not_utf8_is_named(tmp_path, capsys):
    """Bytes that are not UTF-8 in the command line (--prompt "$(cat latin1.txt)") reach Python as lone surrogates,
    which sentencepiece refused with a RuntimeError traceback (exit 1): the flag is named, with the byte, before the run
    is read."""
    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    argv = [str(tmp_path / "no_run"), "--prompt", "caf\udce9 au lait", "--device", "cpu"]  # b"caf\xe9" as argv holds it
    assert run_cli(gen.main, gen.parser(), argv) == 2
    assert capsys.readouterr().err.startswith("error: --prompt: not UTF-8 text (byte 0xe9 at character 4); ")


def test_an_unfinished_run_says_which_phase_it_decodes_with(fake_run, capsys):
    """A run whose last phase has not finished was decoded with an earlier phase's weights and config (its newest
    finished one: the pretraining, without the extension's RoPE scaling) without a word; it is said on stderr, naming
    the phase and the flag that picks one. A phase asked for by path or --phase is not warned about."""
    from omegaconf import OmegaConf

    from minilm.cli import run_cli

    cfg = OmegaConf.load(fake_run / "config.yaml")
    cfg.phases = {"train": {"steps": 3}, "extend": {"steps": 3, "seq_len": 256}}
    (fake_run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (fake_run / "model.safetensors").unlink()  # 'extend' has not finished: no final weights yet
    (fake_run / "train" / "complete.json").write_text("{}")  # 'train' has (minilm.runs.phase_finished)
    gen = load_script("scripts/generate.py")
    head = ["--prompt", "def f(x):", "--max-new-tokens", "3", "--greedy", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), [str(fake_run), *head]) == 0
    err = capsys.readouterr().err
    assert err == (f"warning: {fake_run} has not finished (extend to come): decoding with the weights of phase "
                   "'train', its newest finished one (--phase NAME picks a finished phase)\n")
    for argv in ([str(fake_run / "train"), *head], [str(fake_run), "--phase", "train", *head]):
        assert run_cli(gen.main, gen.parser(), argv) == 0
        assert capsys.readouterr().err == ""


def test_the_prompt_may_come_from_a_file_or_stdin(fake_run, tmp_path, monkeypatch, capsys):
    """--prompt alone took the text: a prompt longer than one command-line argument may be (Linux: 128 KiB), as a
    long-context model's is, could not be given. --prompt-file FILE (- for stdin) reads it as UTF-8, as it is, and
    decodes as --prompt does; an unreadable, non-UTF-8 or empty file is named."""
    import io

    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    text = "def main(x):\n    return é\n"
    head = ["--max-new-tokens", "12", "--greedy", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), [str(fake_run), "--prompt", text, *head]) == 0
    given = capsys.readouterr()
    (tmp_path / "p.txt").write_bytes(text.encode())
    assert run_cli(gen.main, gen.parser(), [str(fake_run), "--prompt-file", str(tmp_path / "p.txt"), *head]) == 0
    assert capsys.readouterr() == given
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert run_cli(gen.main, gen.parser(), [str(fake_run), "--prompt-file", "-", *head]) == 0
    assert capsys.readouterr() == given
    # a byte order mark (Windows editors write one) is no text, as the data sources read files: it was 3 byte tokens
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert run_cli(gen.main, gen.parser(), [str(fake_run), "--prompt-file", str(tmp_path / "bom.txt"), *head]) == 0
    assert capsys.readouterr() == given
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    for name, said in (("none.txt", "cannot be read (No such file or directory)"),
                       ("latin1.txt", "not UTF-8 text (byte 0xe9 at offset 3)")):  # fmt: skip
        assert run_cli(gen.main, gen.parser(), [str(fake_run), "--prompt-file", str(tmp_path / name), *head]) == 2
        assert capsys.readouterr().err.startswith(f"error: --prompt-file {tmp_path / name}: {said}")
    with pytest.raises(SystemExit) as exited:  # (argparse's own error)
        run_cli(gen.main, gen.parser(), [str(fake_run), "--prompt", "x", "--prompt-file", "-", *head])
    assert exited.value.code == 2 and "not allowed with argument --prompt" in capsys.readouterr().err


def test_several_samples_each_as_its_seed_alone(fake_run, capsys):
    """generate.py decoded one sample per command: --num-samples N decodes N, each under a header line, sample i with
    --seed S being what --seed S+i prints alone; N < 1, and N > 1 with greedy decoding (N identical samples), are
    refused naming the flag."""
    from minilm.cli import run_cli

    gen = load_script("scripts/generate.py")
    head = [str(fake_run), "--prompt", "def f(x):", "--max-new-tokens", "8", "--device", "cpu"]
    alone = []
    for seed in (7, 8, 9):
        assert run_cli(gen.main, gen.parser(), [*head, "--seed", str(seed)]) == 0
        alone.append(capsys.readouterr().out)
    assert run_cli(gen.main, gen.parser(), [*head, "--seed", "7", "--num-samples", "3"]) == 0
    assert capsys.readouterr().out == "".join(f"--- sample {i + 1}/3 (--seed {7 + i}) ---\n{out}"
                                              for i, out in enumerate(alone))  # fmt: skip
    for flags, said in ((["--num-samples", "0"], "error: --num-samples: must be >= 1, got 0\n"),
                        (["--num-samples", "2", "--greedy"], "error: --num-samples 2: greedy decoding "),
                        (["--num-samples", "2", "--temperature", "0"], "error: --num-samples 2: greedy decoding ")):
        assert run_cli(gen.main, gen.parser(), [*head, *flags]) == 2
        assert capsys.readouterr().err.startswith(said)


def test_an_empty_prompt_samples_from_the_token_every_training_document_follows(fake_run, corpus_setup, tmp_path,
                                                                                capsys):
    """--prompt "" was refused ('encodes to no tokens'), so a model could not be sampled unconditionally. It starts
    from the token that precedes every document in the prepared training data (EOS: prepare writes one after each
    document and no BOS anywhere), printed as nothing; an empty --prompt-file alike."""
    from minilm.cli import run_cli
    from minilm.model.generate import generate
    from minilm.runs import load_run

    _, corpus = corpus_setup
    store = corpus.train
    before_documents = set(np.asarray(store.tokens)[store.doc_offsets[1:] - 1].tolist())
    assert len(before_documents) == 1  # one separator token
    start = before_documents.pop()
    run = load_run(fake_run)
    want = generate(run.model, [start], 10, temperature=1.0, seed=3, eos_id=run.tokenizer.eos_id)[0, 1:].tolist()
    want = want[: want.index(start)] if start in want else want  # (the start token is EOS: decoding ends there)
    assert want
    gen = load_script("scripts/generate.py")
    head = [str(fake_run), "--max-new-tokens", "10", "--seed", "3", "--device", "cpu"]
    assert run_cli(gen.main, gen.parser(), [*head, "--prompt", ""]) == 0
    captured = capsys.readouterr()
    assert captured == (run.tokenizer.decode(want) + "\n", "")
    (tmp_path / "empty.txt").write_bytes(b"")
    assert run_cli(gen.main, gen.parser(), [*head, "--prompt-file", str(tmp_path / "empty.txt")]) == 0
    assert capsys.readouterr() == captured


def test_stop_strings_end_each_sample_before_them(fake_run, capsys):
    """--stop STRING (repeatable) ends a sample where its text first contains one of them, a string spanning two
    tokens here: neither it nor what follows is printed (the text before it is the unstopped output's), and with
    --num-samples each sample stops on its own. The flag's bad values are refused before the run is read."""
    from minilm.cli import run_cli
    from minilm.model.generate import generate
    from minilm.runs import load_run

    gen = load_script("scripts/generate.py")
    prompt = "def f(x):"
    head = [str(fake_run), "--prompt", prompt, "--max-new-tokens", "30", "--device", "cpu"]
    free = []
    for seed in ("7", "8"):
        assert run_cli(gen.main, gen.parser(), [*head, "--seed", seed]) == 0
        out = capsys.readouterr().out
        assert out.startswith(prompt) and out.endswith("\n")
        free.append(out[len(prompt) : -1])
    run = load_run(fake_run)
    prompt_ids = run.tokenizer.encode(prompt)
    new = generate(run.model, prompt_ids, 30, seed=7, eos_id=run.tokenizer.eos_id)[0, len(prompt_ids) :].tolist()
    texts = [run.tokenizer.decode(new[:i]) for i in range(len(new) + 1)]  # the text after 0, 1, 2 ... new tokens
    for i in range(2, len(new)):  # the last character of a token and the next one's first (neither a broken one)
        stop = texts[i + 1][len(texts[i]) - 1 : len(texts[i]) + 1]
        if len(texts[i - 1]) < len(texts[i]) < len(texts[i + 1]) and "\ufffd" not in stop:
            break
    else:
        pytest.fail("no two tokens of whole characters in a row")
    never = "never \u2603 here"
    want = [text[: text.find(stop)] if stop in text else text for text in free]
    assert len(want[0]) < len(free[0])
    argv = [*head, "--stop", never, "--stop", stop]
    assert run_cli(gen.main, gen.parser(), [*argv, "--seed", "7"]) == 0
    assert capsys.readouterr().out == prompt + want[0] + "\n"
    assert run_cli(gen.main, gen.parser(), [*argv, "--seed", "7", "--num-samples", "2"]) == 0
    assert capsys.readouterr().out == "".join(f"--- sample {i + 1}/2 (--seed {7 + i}) ---\n{prompt}{w}\n"
                                              for i, w in enumerate(want))  # fmt: skip
    for flags, said in ((["--stop", ""], "error: --stop: each stop string must be a non-empty string, got ''\n"),
                        (["--stop", "caf\udce9"], "error: --stop: not UTF-8 text (byte 0xe9 at character 4)")):
        assert run_cli(gen.main, gen.parser(), [str(fake_run / "no_run"), "--prompt", "x", *flags]) == 2
        assert capsys.readouterr().err.startswith(said)
