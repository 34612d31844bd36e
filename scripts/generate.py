#!/usr/bin/env python
"""Sample text from a trained run, with a KV cache.

    python scripts/generate.py RUN_DIR_OR_CHECKPOINT --prompt "def main(" [--max-new-tokens 200]
        [--temperature 0.8] [--top-k 50] [--top-p 0.95] [--seed 0] [--num-samples N] [--greedy] [--phase NAME]
        [--stop STRING ...] [--extension METHOD key=value ...] [--no-cache] [--device cpu|cuda]
    python scripts/generate.py RUN_DIR_OR_CHECKPOINT --prompt-file FILE [...]   (FILE: - reads stdin)

RUN_DIR_OR_CHECKPOINT: a run directory (its final weights, or its newest finished phase, said on stderr), a phase
directory, a ``model.safetensors`` inside either, or a step checkpoint (``RUN/PHASE/checkpoints/step-N.ckpt``).
``--extension`` takes what scripts/evaluate.py's does: a training-free context-extension method
(minilm.positions.training_free: logn, rerope, self_extend, dca, rope_scaling) or a RoPE scaling rope_type (linear,
ntk, dynamic, yarn, ...) with its parameters, e.g.
``--extension self_extend group_size=4 window=256`` or ``--extension dynamic factor=4``;
``original_max_position_embeddings`` and logn's ``train_len`` default to the training length. The checkpoint may also
come last, after the parameters (``--extension logn runs/tiny``): a last word that is not key=value is the checkpoint.
Text is printed as it is generated; a sample ends at the tokenizer's EOS, or where its text first contains a --stop
string (neither is printed, nor what follows a stop string). Bad input: one message on stderr, exit
code 2 (--debug: traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minilm.cli import add_run_args, check_home_expanded, once_parser, one_run, run_cli  # noqa: E402
from minilm.errors import MinilmError  # noqa: E402


# generate()'s arguments as this script's user gives them: its errors name the flags
FLAGS = {"prompt": "--prompt", "max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_k": "--top-k",
         "top_p": "--top-p", "stop": "--stop"}  # fmt: skip


def read_prompt(args: argparse.Namespace) -> tuple[str, str]:
    """(the prompt, the flag that gave it): --prompt TEXT, or --prompt-file FILE read as UTF-8 as it is (a trailing
    newline included) but for a leading byte order mark, ``-`` for stdin. A file takes a prompt longer than one
    command-line argument may be (Linux: 128 KiB, 'Argument list too long'), and text that the shell would have to
    quote. The mark (Windows editors write one) is an encoding marker, not text: the data sources drop it from every
    training document (minilm.data.sources), so a prompt file kept it as three byte tokens no document began with."""
    if args.prompt_file is None:
        check_text(args.prompt, "--prompt")
        return args.prompt, "--prompt"
    flag = f"--prompt-file {args.prompt_file}"
    check_home_expanded(args.prompt_file, "--prompt-file")
    try:
        data = sys.stdin.buffer.read() if args.prompt_file == "-" else Path(args.prompt_file).read_bytes()
    except OSError as e:
        raise MinilmError(f"{flag}: cannot be read ({e.strerror or e}); give a text file, or - for stdin") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff"), flag
    except UnicodeDecodeError as e:
        raise MinilmError(f"{flag}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); give the text in "
                          "UTF-8 (iconv -f latin1 -t utf-8 converts a Latin-1 file)") from None


def check_samples(n: int, greedy: bool) -> None:
    if n < 1:
        raise MinilmError(f"--num-samples: must be >= 1, got {n}")
    if n > 1 and greedy:  # argmax decoding draws nothing: every sample would be the first
        raise MinilmError(f"--num-samples {n}: greedy decoding (--greedy or --temperature 0) gives {n} identical "
                          "samples; sample (a temperature > 0) or give one")


def check_text(text: str, flag: str) -> None:
    """The prompt is UTF-8 text, which the tokenizer reads: bytes that are not (a Latin-1 file's, pasted as
    --prompt "$(cat f)") reach Python as lone surrogates, and sentencepiece failed on them with a traceback
    ('RuntimeError: Unable to cast Python instance of type <class 'str'> to C++ type')."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        what = f"byte 0x{ord(bad) - 0xDC00:02x}" if "\udc80" <= bad <= "\udcff" else f"U+{ord(bad):04X}"
        raise MinilmError(f"{flag}: not UTF-8 text ({what} at character {e.start + 1}); give the text in UTF-8 "
                          "(iconv -f latin1 -t utf-8 converts a Latin-1 file)") from None


def say_unfinished(run, given: str) -> None:
    """A run directory whose last phase has not finished is decoded with its newest finished phase's weights and
    config (minilm.runs.resolve_run), maybe a phase before the extension its user means to look at (the pretraining,
    without its RoPE scaling): said on stderr, with the flag that picks a phase, instead of decoded silently. (A phase
    directory, a weights file or --phase names the weights itself.)"""
    from minilm.runs import run_phase_names

    if run.phase is None or Path(given).resolve() != run.run_dir.resolve():
        return
    names = run_phase_names(run.run_dir)
    unfinished = names[names.index(run.phase) + 1 :]
    if unfinished:
        print(f"warning: {run.run_dir} has not finished ({', '.join(unfinished)} to come): decoding with the weights "
              f"of phase '{run.phase}', its newest finished one (--phase NAME picks a finished phase)", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    from minilm.eval import extension_from_flag, resolve_device
    from minilm.model.generate import TextStream, cache_blockers, check_sampling, check_stop, encode_prompt, generate
    from minilm.runs import load_run

    one_run(args, "checkpoint", "generate.py RUN_DIR_OR_CHECKPOINT --prompt TEXT")
    prompt, prompt_flag = read_prompt(args)
    names = {**FLAGS, "prompt": prompt_flag}  # generate()'s errors name the flag that gave the prompt
    # --greedy ignores the sampling flags, as its help says: not used, so not checked either (a sampling command with
    # --greedy appended decodes by argmax, whatever values it carries)
    temperature, top_k, top_p = (1.0, None, None) if args.greedy else (args.temperature, args.top_k, args.top_p)
    # bad flags before the run is loaded, each named as given here (generate() names its parameters: top_k)
    check_sampling(args.max_new_tokens, temperature, top_k, top_p, names=names)
    check_samples(args.num_samples, args.greedy or temperature == 0)
    for text in args.stop or []:
        check_text(text, "--stop")
    stop = check_stop(args.stop, names)
    extension = extension_from_flag(args.extension)
    device = resolve_device(args.device, name="--device")
    run = load_run(args.checkpoint, phase=args.phase, map_location=device)
    if args.phase is None:
        say_unfinished(run, args.checkpoint)
    model = run.model
    if extension:  # as scripts/evaluate.py takes it: the same flag decodes with what it evaluated
        from minilm.eval import applied_extension, apply_extension
        from minilm.eval.suite import NO_EXTENSION

        if extension["name"] != NO_EXTENSION:  # (none: the plain model, which generate.py decodes with anyway)
            model, _ = apply_extension(model, run.cfg.model, run.tokenizer.vocab_size, extension, run.cfg.train.seq_len,
                                       flag=" ".join(["--extension", *args.extension]))  # its errors name the flag
            # as applied, in the words --extension takes:
            applied = applied_extension(extension, run.cfg.model, int(run.cfg.train.seq_len))
            words = [applied.pop("name")] + [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in applied.items()]
            print(f"[extension: {' '.join(words)}]", file=sys.stderr)
    ids = encode_prompt(run.tokenizer, prompt)  # an empty prompt: EOS, after which every training document started
    if not ids:
        raise MinilmError(f"{prompt_flag}: encodes to no tokens; give some text")
    use_cache = not args.no_cache
    if use_cache and (blockers := cache_blockers(model)):  # said here in one line: generate()'s warning quoted source
        print(f"warning: {', '.join(blockers)} ({run.cfg.model.position.name}) cannot decode with a KV "
              "cache; decoding without one, as --no-cache does (every step recomputes the whole sequence)",
              file=sys.stderr)  # fmt: skip
        use_cache = False
    for i in range(args.num_samples):  # one after another, each streamed; sample i is what --seed SEED+i gives alone
        seed = None if args.seed is None else args.seed + i
        header = ([f"--- sample {i + 1}/{args.num_samples}" + ("" if seed is None else f" (--seed {seed})") + " ---\n"]
                  if args.num_samples > 1 else [])  # fmt: skip
        # printed as it is generated: the prompt with the first new token (after generate's checks of its arguments,
        # so bad input prints nothing), then each token's text; EOS, which ends decoding, is not printed, nor a stop
        # string and what follows it (the stream holds back text that may begin one); context: the space before it
        stream = TextStream(run.tokenizer.decode, context=ids[-TextStream.CONTEXT :], stop=stop)
        pending = [*header, prompt]

        def show(nxt) -> None:
            text = "" if int(nxt[0]) == run.tokenizer.eos_id else stream.push(int(nxt[0]))
            sys.stdout.write("".join(pending) + text)
            sys.stdout.flush()
            pending.clear()

        generate(
            model, ids, args.max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, greedy=args.greedy,
            seed=seed, use_cache=use_cache, eos_id=run.tokenizer.eos_id, on_token=show, names=names, stop=stop,
            decode=run.tokenizer.decode,
        )  # fmt: skip
        print("".join(pending) + stream.flush())
    return 0


def parser() -> argparse.ArgumentParser:
    p = once_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    usage="%(prog)s RUN_DIR_OR_CHECKPOINT --prompt TEXT | --prompt-file FILE [options]   (or --run "
                          "RUN_DIR_OR_CHECKPOINT)")  # fmt: skip
    add_run_args(p, "checkpoint", "RUN_DIR_OR_CHECKPOINT", "run directory, phase directory or model.safetensors")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the text to continue (printed first); \"\" samples unconditionally, from "
                        "EOS, the token every training document follows")
    prompt.add_argument("--prompt-file", metavar="FILE",
                        help="the same, read from FILE as UTF-8 as it is (a final newline included; a leading byte "
                        "order mark dropped); - reads stdin")
    p.add_argument("--phase", help="a phase of the run (default: its final weights)")
    p.add_argument("--max-new-tokens", type=int, default=100, metavar="N",
                   help="tokens to generate at most; fewer when EOS comes first (default: 100)")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="softmax temperature, >= 0; 0 decodes greedily (default: 1.0)")
    p.add_argument("--top-k", type=int, metavar="K", help="sample from the K most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, metavar="P",
                   help="sample from the smallest set of tokens of total probability >= P, in (0, 1] (default: 1)")
    p.add_argument("--seed", type=int, help="seed of the sampling (default: a different draw each run)")
    p.add_argument("--num-samples", type=int, default=1, metavar="N",
                   help="decode N samples of the prompt, one after another, each under a '--- sample i/N ---' line; "
                   "with --seed S, sample i draws as --seed S+i alone (default: 1, no header line)")
    p.add_argument("--greedy", action="store_true",
                   help="argmax decoding (ignores --temperature / --top-k / --top-p, unchecked, and --seed)")
    p.add_argument("--stop", action="append", metavar="STRING",
                   help="end a sample where its text first contains STRING, which is not printed, nor what follows it "
                   "(repeatable: the first of them to occur; a newline as in bash: --stop $'\\n\\n')")
    p.add_argument("--extension", nargs="+", metavar="ARG",
                   help="METHOD [key=value ...]: a training-free method or a rope_type, as scripts/evaluate.py; a "
                   "last word that is not key=value is the checkpoint")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence at every step")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


if __name__ == "__main__":
    sys.exit(run_cli(main, parser()))
