"""scripts/generate.py end to end on a run directory: what it prints, and that it prints as it generates."""

import sys

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
