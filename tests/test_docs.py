"""The commands in README.md, docs/ and the scripts' own help name run directories, phases, configs and scripts
that exist: a newcomer copying one gets a result, not "not a phase of runs/tiny"."""

import re
from pathlib import Path

import pytest

from minilm.config import load_config
from minilm.training.phases import phase_names

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "scripts").glob("*.py"))]
RUN_FILES = {"model.safetensors", "tb", "eval", "config.yaml", "final_config.yaml", "tokenizer.model"}


def _lines():
    for doc in DOCS:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            yield f"{doc.relative_to(REPO)}:{i}", line


def _configs() -> dict:
    """run.name -> the phases of the config that trains it."""
    out = {}
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        if path.parent.name == "studies" or path.name == "base.yaml":
            continue
        cfg = load_config(path)
        out[cfg.run.name] = phase_names(cfg)
    return out


@pytest.fixture(scope="module")
def runs():
    return _configs()


def test_every_run_directory_and_phase_the_docs_name_is_one_a_shipped_config_makes(runs):
    wrong = []
    for where, line in _lines():
        for m in re.finditer(r"\bruns/([A-Za-z0-9_.-]+)(?:/([A-Za-z0-9_.-]+))?", line):
            name, sub = m.groups()
            if name == "studies":  # scripts/study.py's directory: runs/studies/<study>/<variant>
                continue
            if name not in runs:
                wrong.append(f"{where}: {m.group(0)} (no config has run.name {name!r})")
            elif sub and sub not in RUN_FILES and sub not in runs[name]:
                wrong.append(f"{where}: {m.group(0)} (not a phase of {name}: {runs[name]})")
        for m in re.finditer(r"--run runs/([A-Za-z0-9_.-]+)\S*(?: \S+)*? --phase ([a-z0-9_]+)", line):
            name, phase = m.groups()
            if name in runs and phase not in runs[name]:
                wrong.append(f"{where}: --phase {phase} is not a phase of runs/{name} ({runs[name]})")
    assert not wrong, "\n".join(wrong)


def test_every_config_and_script_the_docs_name_exists():
    missing = []
    for where, line in _lines():
        for m in re.finditer(r"(?<![\w/.])((?:configs|scripts)/[A-Za-z0-9_./-]+\.(?:yaml|py|sh))\b", line):
            if not (REPO / m.group(1)).is_file():
                missing.append(f"{where}: {m.group(1)}")
    assert not missing, "\n".join(missing)


PATH = re.compile(r"(?<![\w/.~-])((?:minilm|tests|docs|scripts)/(?:[\w.<>*-]+/)*"
                  r"(?:[\w.<>*-]+\.(?:py|md|sh|yaml|json)\b)?)")


def test_every_repository_path_the_docs_name_exists():
    """README.md and docs/*.md name modules, tests and docs by path (``minilm/model/attention.py``,
    ``tests/training/test_train_cli.py``, ``docs/scaling.md``): each must exist, as a file or a directory, so a
    renamed module does not leave the docs pointing at nothing. A path with a placeholder (``<name>``, ``NAME``,
    ``*``) is a pattern, not a path."""
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            # a file (with its extension) or a directory (with its closing slash): "docs/s" in "99 docs/s" is neither
            for m in re.finditer(PATH, line):
                path = m.group(1)
                if any(c in path for c in "<>*") or re.search(r"/[A-Z]+(?:/|\.|$)", path):
                    continue
                if not (REPO / path.rstrip("/")).exists():
                    missing.append(f"{doc.relative_to(REPO)}:{i}: {path}")
    assert not missing, "\n".join(missing)


def test_the_config_form_of_an_extension_that_docs_extension_md_gives_installs_as_it_says():
    """docs/extension.md said a config section ``{name, params}`` maps onto install_extension as
    ``install_extension(model, cfg.name, **cfg.params)``, while eval.extension is flat (``{name: rerope, window: 8}``;
    ``params:`` is refused as an unknown parameter): the call the page gives now runs on a loaded config as written."""
    from minilm.model import GPT
    from minilm.positions.training_free import install_extension

    text = " ".join((REPO / "docs" / "extension.md").read_text().split())
    call = re.search(r"maps onto it directly[^`]*`(install_extension\(model, [^`]*\))`", text).group(1)
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["model.n_layers=1", "model.d_model=32", "model.n_heads=2",
                                                      "eval.extension={name: rerope, window: 8}"])  # fmt: skip
    model = GPT(cfg.model, 300)
    method = eval(call, {"install_extension": install_extension, "model": model, "cfg": cfg})
    assert type(method).__name__ == "ReRope" and method.params.window == 8


def _python_blocks():
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            yield f"{doc.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)


def test_every_python_snippet_in_the_docs_imports_what_it_names():
    """A ```python block of the docs imports names that exist, and every name it uses that the modules it imports from
    define is imported: docs/export.md called ``first_stop`` with only ``generate`` imported from
    ``minilm.model.generate``, a NameError for whoever ran the snippet. Names the snippet leaves to the reader (a
    ``cfg`` of their own) are not checked; the modules' own names are."""
    import ast
    import builtins
    import importlib

    wrong = []
    for where, code in _python_blocks():
        tree = ast.parse(re.sub(r"^\.\.\..*$", "pass", code, flags=re.M))  # "...evaluate / generate..." lines
        defined, modules = set(dir(builtins)), []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                defined.update(alias.asname or alias.name for alias in node.names)
                if node.module.split(".")[0] != "minilm":  # transformers: its own docs' business
                    continue
                module = importlib.import_module(node.module)
                modules.append(module)
                wrong += [f"{where}: {node.module} has no {a.name}" for a in node.names if not hasattr(module, a.name)]
            elif isinstance(node, ast.Import):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                defined.add(node.id)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in defined:
                home = [m.__name__ for m in modules if hasattr(m, node.id)]
                if home:
                    wrong.append(f"{where}: {node.id} is used but not imported (it is in {home[0]})")
    assert not wrong, "\n".join(wrong)


class _Parsed(Exception):
    """Raised in place of parsing, carrying the parser a script built (scripts that build theirs inside main)."""


def _options(script: Path) -> set:
    """Every option string ``script``'s argument parser takes, read off the parser itself."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_docs_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "parser"):
        ap = module.parser()
    else:  # parse_args(argv) / main(argv) build it and parse at once: stop them at the parse
        original = argparse.ArgumentParser.parse_known_args

        def stop(self, *args, **kwargs):
            raise _Parsed(self)

        argparse.ArgumentParser.parse_known_args = stop
        try:
            (getattr(module, "parse_args", None) or module.main)([])
        except _Parsed as parsed:
            ap = parsed.args[0]
        finally:
            argparse.ArgumentParser.parse_known_args = original
    return {option for action in ap._actions for option in action.option_strings}


def test_every_flag_the_docs_give_a_command_is_one_its_parser_takes():
    """``python train.py ...`` and ``python scripts/X.py ...`` in README.md, docs/ and the scripts' own docstrings
    name only flags the script accepts (a renamed ``--max-tokens`` left in the docs is an argparse error for whoever
    copies the command). A command continued on the next line with ``\\`` is read whole."""
    cache, wrong = {}, []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "scripts").glob("*.py"))]:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines, 1):
            for following in lines[i:]:  # a command continued with a backslash
                if not line.endswith("\\"):
                    break
                line = line[:-1] + " " + following.strip()
            for m in re.finditer(r"python (scripts/\w+\.py|train\.py)([^`|#;]*)", line):
                script, rest = m.groups()
                if script not in cache:
                    cache[script] = _options(REPO / script)
                flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
                wrong += [f"{doc.relative_to(REPO)}:{i}: {script} has no {f}" for f in flags if f not in cache[script]]
    assert len(cache) >= 5 and not wrong, "\n".join(wrong)


# written like config keys, but a file and the GPT object's attributes (docs/architecture.md)
NOT_KEYS = {"train.py", "model.safetensors", "model.cfg", "model.loss"}
KEY = re.compile(r"`((?:run|model|data|train|optim|eval|trainer)(?:\.[a-z_][a-z0-9_]*)+)(?=[`=: \[])")


def test_every_config_key_the_docs_name_is_one_the_schema_has():
    """A key in backticks (`train.ckpt_every`, `model.loss_chunk_size=4096`, `eval.lengths: [...]`) is one of
    minilm/config.py's, down to the open mappings whose keys their owners check (model.position, data.sources,
    eval.extension): a renamed key left in the docs sends a reader to an 'unknown key' error."""
    from omegaconf import OmegaConf

    from minilm.config import Config

    schema, open_maps = OmegaConf.structured(Config), {"model.position", "data.sources", "eval.extension"}
    wrong = []
    for where, line in _lines():
        if ".md:" not in where:  # README.md and docs/, not the scripts' docstrings
            continue
        for m in re.finditer(KEY, line):
            key = m.group(1)
            node, parts = schema, key.split(".")
            for i, part in enumerate(parts):
                if key in NOT_KEYS or ".".join(parts[:i]) in open_maps:
                    break
                if not OmegaConf.is_dict(node) or part not in node:
                    wrong.append(f"{where}: {key}")
                    break
                node = node[part]
    assert not wrong, "\n".join(wrong)


def test_the_eval_settings_table_of_docs_evaluation_md_gives_the_schema_defaults():
    """docs/evaluation.md's "Settings (`eval:`)" table states each key's default; each is EvalConfig's."""
    import yaml

    from minilm.config import EvalConfig

    text = (REPO / "docs" / "evaluation.md").read_text().split("## Settings (`eval:`)")[1]
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \|", text, re.M)
    defaults = EvalConfig()
    assert {key for key, _ in rows} == {f for f in vars(defaults)}, "a key missing from the table, or one too many"
    for key, default in rows:
        stated = yaml.safe_load(default.strip("`"))
        actual = getattr(defaults, key)
        assert stated == actual, f"eval.{key}: the table says {default}, EvalConfig {actual}"
