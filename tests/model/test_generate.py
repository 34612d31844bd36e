"""KV-cache decoding equals cache-free decoding, for every registered encoding and the training-free methods."""

import warnings

import pytest
import torch

from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.model import GPT
from minilm.model.cache import KVCache
from minilm.model.generate import cache_blockers, check_sampling, filter_logits, generate, max_length
from minilm.positions import REGISTRY

pytestmark = pytest.mark.usefixtures("one_thread")  # decoding: hundreds of tiny ops
V = 61
# Parameters that keep each encoding's bounds inside the tiny lengths used here (and make them bite).
SMALL = {
    "learned": ["model.position.max_positions=64"],
    "shaw": ["model.position.max_distance=4"],
    "deberta": ["model.position.max_distance=4"],
    "t5": ["model.position.num_buckets=8", "model.position.max_distance=16"],
    "cope": ["model.position.npos_max=8"],
}


def tiny(name="rope", *overrides, seed=0):
    cfg = load_config(overrides=["model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2",
                                 f"model.position.name={name}", *SMALL.get(name, []), *overrides])  # fmt: skip
    torch.manual_seed(seed)
    model = GPT(cfg.model, V)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # off the initialization: zero-initialized tables (CoPE) would make equality vacuous
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


# Encodings known to need more than the cache holds (conv's taps read the embeddings of the previous
# kernel_size - 1 tokens) but whose class does not declare ``supports_kv_cache = False`` yet: expected failures
# until it does (then the fallback path is taken and these marks fall away by themselves).
NEEDS_DECLARATION = {"conv"}


def _params(names):
    out = []
    for n in names:
        cls = REGISTRY[n].embedding or REGISTRY[n].attention
        if n in NEEDS_DECLARATION and getattr(cls, "supports_kv_cache", True):
            reason = f"{cls.__name__} must declare supports_kv_cache = False (minilm/positions)"
            out.append(pytest.param(n, marks=pytest.mark.xfail(reason=reason, strict=True)))
        else:
            out.append(n)
    return out


def incremental_logits(model, x, chunks, doc_ids=None):
    """Logits of ``x`` fed through one cache in pieces of the given sizes."""
    cache, out, i = KVCache.for_model(model), [], 0
    for n in chunks:
        docs = None if doc_ids is None else doc_ids[:, i : i + n]
        out.append(model(x[:, i : i + n], doc_ids=docs, cache=cache))
        i += n
    assert cache.length == x.shape[1]
    return torch.cat(out, dim=1)


def assert_cache_agrees(model, chunks, new_tokens):
    """Random tokens fed through one cache in ``chunks`` give the full forward's logits, and greedy generation
    of ``new_tokens`` from their first 5 is the same with and without the cache."""
    x = torch.randint(0, V, (2, sum(chunks)))
    with torch.no_grad():
        assert torch.allclose(model(x), incremental_logits(model, x, chunks), atol=1e-4)
    prompt = x[:, :5]
    cached = generate(model, prompt, new_tokens, greedy=True)
    assert torch.equal(cached, generate(model, prompt, new_tokens, greedy=True, use_cache=False))


def supports_cache(model):
    return not cache_blockers(model)


@pytest.mark.parametrize("name", _params(REGISTRY))
def test_incremental_logits_equal_full_forward(name):
    model = tiny(name)
    if not supports_cache(model):
        pytest.skip(f"{name} declares supports_kv_cache = False (generation falls back; tested below)")
    x = torch.randint(0, V, (2, 20))
    with torch.no_grad():
        full = model(x)
        inc = incremental_logits(model, x, [7, 1, 1, 3, 1, 7])
    assert torch.allclose(full, inc, atol=1e-4), (full - inc).abs().max()


@pytest.mark.parametrize("name", _params(REGISTRY))
def test_cached_greedy_equals_cache_free(name):
    model = tiny(name)
    prompt = torch.randint(0, V, (2, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # encodings without cache support fall back (with a warning)
        cached = generate(model, prompt, 24, greedy=True, use_cache=True)
    plain = generate(model, prompt, 24, greedy=True, use_cache=False)
    assert cached.shape == (2, 30)
    assert torch.equal(cached, plain)


ROPE_VARIANTS = {
    "interleaved": ["model.position.layout=interleaved"],
    "partial": ["model.position.fraction=0.5"],
    "nope_every": ["model.position.nope_every=2"],
    "mha": ["model.n_kv_heads=4"],
    "linear": ["model.position.scaling={rope_type: linear, factor: 2.0}"],
    "yarn": ["model.position.scaling={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 16}"],
    "llama3": ["model.position.scaling={rope_type: llama3, factor: 4.0, original_max_position_embeddings: 16}"],
    # length-dependent: within the original length the frequencies never change, so cached == cache-free
    # exactly; beyond it the cached hidden states of earlier tokens were computed at a shorter length (cache.py)
    "dynamic": ["model.position.scaling={rope_type: dynamic, factor: 2.0, original_max_position_embeddings: 64}"],
}


@pytest.mark.parametrize("variant", list(ROPE_VARIANTS))
def test_rope_variants_cache(variant):
    assert_cache_agrees(tiny("rope", *ROPE_VARIANTS[variant]), [5, 1, 1, 17], new_tokens=20)


def test_dynamic_last_query_sees_the_current_length():
    """Keys are cached unrotated: a one-layer model's next-token logits at every step equal a cache-free forward's
    even beyond the original length, where dynamic NTK changes the frequencies at each step."""
    block = "{rope_type: dynamic, factor: 2.0, original_max_position_embeddings: 8}"
    model = tiny("rope", "model.n_layers=1", f"model.position.scaling={block}")
    x = torch.randint(0, V, (1, 24))
    cache = KVCache.for_model(model)
    with torch.no_grad():
        model(x[:, :4], cache=cache)
        for t in range(4, 24):
            step = model(x[:, t : t + 1], cache=cache)[:, -1]
            assert torch.allclose(step, model(x[:, : t + 1])[:, -1], atol=1e-4), t


EXTENSION_CASES = [
    ("logn", {"train_len": 8}),
    ("rerope", {"window": 6}),
    ("self_extend", {"group_size": 3, "window": 6}),
    ("dca", {"chunk_size": 10, "local_window": 3}),
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}),
]


@pytest.mark.parametrize("method,params", EXTENSION_CASES, ids=[m for m, _ in EXTENSION_CASES])
def test_training_free_extensions_with_cache(method, params):
    from minilm.positions.training_free import install_extension

    model = tiny("rope")
    install_extension(model, method, **params)
    assert_cache_agrees(model, [9, 1, 1, 15], new_tokens=21)


def test_document_ids_through_the_cache():
    model = tiny("rope")
    x = torch.randint(0, V, (2, 16))
    docs = torch.tensor([[0] * 5 + [1] * 11, [0] * 9 + [1] * 7])
    with torch.no_grad():
        assert torch.allclose(model(x, doc_ids=docs), incremental_logits(model, x, [6, 1, 9], doc_ids=docs), atol=1e-4)


def test_encoding_without_cache_support_falls_back():
    model = tiny("rope")
    model.blocks[0].attn.pos.supports_kv_cache = False  # as an encoding class would declare it
    prompt = torch.randint(0, V, (1, 5))
    with pytest.warns(UserWarning, match="cannot decode with a KV cache") as caught:
        out = generate(model, prompt, 6, greedy=True)
    # the warning points at the caller (it pointed into torch.no_grad's wrapper, and quoted its line)
    assert caught[0].filename == __file__
    model.blocks[0].attn.pos.supports_kv_cache = True
    assert torch.equal(out, generate(model, prompt, 6, greedy=True))


def test_sampling_is_seeded_and_filters():
    model = tiny("rope")
    prompt = [5, 7, 11]
    a = generate(model, prompt, 12, temperature=1.0, seed=3)
    b = generate(model, prompt, 12, temperature=1.0, seed=3)
    assert torch.equal(a, b) and a.shape == (1, 15) and a[0, :3].tolist() == prompt
    greedy = generate(model, prompt, 12, greedy=True)
    assert torch.equal(generate(model, prompt, 12, top_k=1, seed=0), greedy)
    assert torch.equal(generate(model, prompt, 12, top_p=1e-6, seed=0), greedy)
    assert torch.equal(generate(model, prompt, 12, temperature=0.0), greedy)


def test_any_integer_is_a_seed():
    """generate.py --seed 99999999999999999999999 ended in a traceback (torch's generator takes 64 bits) where
    evaluate.py's --seed takes any integer; the seeds torch takes keep their draws (a negative one as 2**64 + it)."""
    model, prompt = tiny("rope"), [5, 7, 11]
    a = generate(model, prompt, 12, seed=3)
    assert torch.equal(generate(model, prompt, 12, seed=3 + 2**64), a)
    assert torch.equal(generate(model, prompt, 12, seed=-1), generate(model, prompt, 12, seed=2**64 - 1))
    assert generate(model, prompt, 12, seed=-(10**30)).shape == (1, 15)



@pytest.mark.parametrize("seed", [0.5, "3", True])
def test_a_seed_that_is_not_a_whole_number_is_refused(seed):
    """seed=0.5 and seed=0.9 drew the same samples (int() truncated both to 0), and seed="3" was read as 3."""
    with pytest.raises(MinilmError, match=f"seed: must be a whole number .*got {seed!r}"):
        generate(tiny("rope"), [5, 7, 11], 3, seed=seed)


def test_filter_logits():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[True, False, False, True]]
    # probabilities ≈ 0.09, 0.64, 0.24, 0.03: 0.64 < 0.7, so the nucleus of 0.7 holds the top two
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[True, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.5)).tolist() == [[True, False, True, True]]


def test_eos_stops_and_pads():
    model = tiny("rope")
    prompt = torch.randint(0, V, (1, 4))
    free = generate(model, prompt, 10, greedy=True)
    eos = int(free[0, 6])  # the third generated token
    out = generate(model, prompt, 10, greedy=True, eos_id=eos)
    first = (free[0, 4:] == eos).nonzero()[0].item() + 4
    assert out.shape[1] == first + 1 and int(out[0, -1]) == eos


def test_bad_arguments_and_bounded_encodings():
    model = tiny("rope")
    with pytest.raises(MinilmError, match="top_p"):
        generate(model, [1, 2], 3, top_p=0.0)
    with pytest.raises(MinilmError, match="prompt"):
        generate(model, [], 3)
    learned = tiny("learned")
    with pytest.raises(MinilmError, match="more than the 64 this model"):
        generate(learned, [1] * 60, 10)
    for kwargs, said in [({"top_k": 2.5}, "top_k: must be a whole number, got 2.5"),
                         ({"max_new_tokens": 2.5}, "max_new_tokens: must be a whole number, got 2.5"),
                         ({"top_k": True}, "top_k: must be a whole number, got True")]:  # fmt: skip
        with pytest.raises(MinilmError, match=said):  # (torch's TypeError from topk, or range's)
            generate(model, [1, 2], **{"max_new_tokens": 3, **kwargs})
    assert generate(model, [1, 2], torch.tensor(2).item(), top_k=torch.tensor(2).item(), seed=0).shape == (1, 4)


@pytest.mark.parametrize("prompt,said", [
    ([5, V], rf"token id {V} is outside this model's vocabulary \(0 to {V - 1}\); encode the prompt with the run's own"),
    (torch.tensor([[3, -1]]), "token id -1 is outside this model's vocabulary"),
    (torch.tensor([1.7, 2.0]), "token ids must be integers, got torch.float32"),  # was cast to [1, 2]
    ([1.7, 2.0], "token ids must be integers"),
])  # fmt: skip
def test_a_prompt_of_ids_the_model_has_no_embedding_for_is_named(prompt, said):
    """An id from another run's tokenizer was torch's 'IndexError: index out of range in self'; a float id was
    truncated to an integer without a word."""
    with pytest.raises(MinilmError, match=said):
        generate(tiny("rope"), prompt, 3, greedy=True)


def test_extreme_temperatures():
    """A temperature so small that logits / temperature overflow samples the argmax (its limit) instead of failing
    in torch.multinomial on a nan softmax; nan and inf are refused like a negative temperature."""
    model = tiny("rope")
    prompt = [5, 7, 11]
    greedy = generate(model, prompt, 8, greedy=True)
    assert torch.equal(generate(model, prompt, 8, temperature=1e-45, seed=0), greedy)
    try:  # as every CLI runs (minilm.cli.flush_denormals): the subnormal 1e-45 read as 0 gave 0 / 0 = nan
        if torch.set_flush_denormal(True):  # (False: this CPU cannot flush them, so nothing to check)
            assert torch.equal(generate(model, prompt, 8, temperature=1e-45, seed=0), greedy)
    finally:
        torch.set_flush_denormal(False)  # torch has no getter: back to its default
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(MinilmError, match="temperature"):
            generate(model, prompt, 3, temperature=bad)


def test_huge_max_new_tokens_stops_at_eos_without_allocating_it():
    """max_new_tokens is an upper bound: a huge one with an EOS that comes first decodes normally (the KV cache
    used to be allocated for prompt + max_new_tokens up front, which failed with out-of-memory)."""
    model = tiny("rope")
    prompt = torch.randint(0, V, (1, 4))
    first = int(generate(model, prompt, 1, greedy=True)[0, -1])
    out = generate(model, prompt, 10**12, greedy=True, eos_id=first)
    assert out.shape == (1, 5) and int(out[0, -1]) == first


def test_on_token_sees_each_new_token_as_it_is_chosen():
    model = tiny("rope")
    prompt = torch.randint(0, V, (1, 4))
    seen = []
    out = generate(model, prompt, 6, greedy=True, on_token=lambda nxt: seen.append(int(nxt[0])))
    assert seen == out[0, 4:].tolist() and len(seen) == 6


def test_text_stream_holds_partial_characters_back():
    """Byte-fallback tokens split a character over several ids: each decodes to U+FFFD until the last byte comes,
    so a streamed piece must never contain one, and the pieces must add up to the whole decoded text."""
    from minilm.model.generate import TextStream

    text = 'x = "é€😀" # done'
    ids = list(text.encode())  # one id per byte: the worst case of byte fallback
    stream = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    pieces = [stream.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + stream.flush() == text
    assert pieces[:4] == ["x", " ", "=", " "]  # plain characters come out at once
    cut = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    held = [cut.push(i) for i in "é".encode()[:1]]  # a character whose last byte never came
    assert held == [""] and cut.flush() == "\ufffd"
    # a decoder that rewrites text already shown (capitalizing it once a second id comes): what was printed cannot
    # be taken back, so nothing more is streamed — no piece that would garble the text after the printed "a"
    rewriting = TextStream(lambda ids: "".join(chr(96 + i) for i in ids).capitalize() if len(ids) > 1 else "a")
    assert [rewriting.push(i) for i in (1, 2, 3)] == ["a", "", ""]


def test_text_stream_keeps_the_space_a_dummy_prefix_decoder_drops_at_a_text_s_start():
    """sentencepiece with a dummy prefix (its defaults, a user's data.tokenizer.model_file) decodes '▁main' alone as
    'main': the new ids decoded without the prompt lost the space before the first new word ('defmain'). With the
    prompt's last ids as context, the stream prints what the new ids add to the prompt's text."""
    from minilm.model.generate import TextStream

    pieces = {1: "▁def", 2: "▁main", 3: "(", 4: "▁x"}

    def decode(ids):  # sentencepiece's rule: '▁' is a space, and the text's first one is dropped
        return "".join(pieces[i] for i in ids).replace("▁", " ").removeprefix(" ")

    plain, stream = TextStream(decode), TextStream(decode, context=[1])
    assert [plain.push(i) for i in (2, 3, 4)] == ["main", "(", " x"]  # (the old output: 'def' + 'main(' glued)
    assert [stream.push(i) for i in (2, 3, 4)] + [stream.flush()] == [" main", "(", " x", ""]
    assert decode([1]) + " main( x" == decode([1, 2, 3, 4])


def test_rows_that_finish_early_are_padded_with_eos():
    """In a batch, a row that produced EOS stays EOS while the others go on decoding exactly as they would alone."""
    model = tiny("rope")
    for seed in range(50):  # row 0 ends two steps before row 1, and would not repeat EOS on its own
        prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(seed))
        free = generate(model, prompt, 10, greedy=True)[:, 4:]  # no EOS: all 10 new tokens
        eos = int(free[0, 1])
        first = [(row == eos).nonzero().flatten().tolist() for row in free]
        row1_later = not first[1] or first[1][0] > first[0][0] + 1
        if row1_later and (free[0, first[0][0] :] != eos).any():
            break
    else:
        pytest.fail("no prompt pair found")
    out = generate(model, prompt, 10, greedy=True, eos_id=eos)[:, 4:]
    end0 = first[0][0]
    assert (out[0, end0:] == eos).all() and out.shape[1] > end0 + 1
    assert torch.equal(out[1], free[1, : out.shape[1]])


def test_top_k_of_the_vocabulary_or_more_keeps_every_token():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    for k in (4, 5, 1000):
        assert torch.equal(filter_logits(logits, top_k=k), logits)
    assert generate(tiny("rope"), [5, 7], 3, top_k=10 * V, seed=0).shape == (1, 5)


def test_the_nucleus_stops_at_the_token_whose_mass_reaches_top_p():
    """Four equally likely tokens (0.25 each, exact in fp32): a nucleus of 0.5 is reached by two of them, so only
    two survive — a third, whose predecessors already hold exactly top_p, is outside; 0.51 needs three."""
    logits = torch.zeros(1, 4)
    assert int(torch.isfinite(filter_logits(logits, top_p=0.5)).sum()) == 2
    assert int(torch.isfinite(filter_logits(logits, top_p=0.51)).sum()) == 3
    assert int(torch.isfinite(filter_logits(logits, top_p=1.0)).sum()) == 4


def test_generation_leaves_the_model_in_the_mode_it_found():
    """generate() decodes in eval mode (no dropout) and restores a training model's mode, also after an error."""
    model = tiny("rope", "model.dropout=0.5").train()
    prompt = [5, 7, 11]
    out = generate(model, prompt, 6, greedy=True)
    assert model.training
    assert torch.equal(out, generate(model.eval(), prompt, 6, greedy=True)) and not model.training
    model.train()
    with pytest.raises(RuntimeError, match="stop"):
        generate(model, prompt, 6, greedy=True, on_token=lambda nxt: (_ for _ in ()).throw(RuntimeError("stop")))
    assert model.training


def test_a_bounded_encoding_decodes_up_to_its_last_position_and_no_further():
    """The last new token is chosen from the logits at the last position and never read back: a 64-position model
    continues a 64-token prompt by one token (refused before), and 60 by 5, the same as the full forward's choice."""
    learned = tiny("learned")  # 64 positions (SMALL)
    for prompt, new in ((60, 5), (64, 1)):
        out = generate(learned, [1] * prompt, new, greedy=True)
        assert out.shape == (1, 65)
        assert out[0, -1] == learned(out[:, :64])[0, -1].argmax()
    said = (r"^prompt \(60 tokens\) \+ max_new_tokens \(6\) reads 65 positions \(the last new token is not read "
            r"back\), more than the 64 this model's learned encoding supports; at most 5 new tokens fit after this "
            r"prompt$")
    with pytest.raises(MinilmError, match=said):
        generate(learned, [1] * 60, 6, greedy=True)
    # named as a caller's user gives them (scripts/generate.py: its flags), as check_sampling's errors are
    flags = {"prompt": "--prompt", "max_new_tokens": "--max-new-tokens"}
    said = r"^--prompt \(65 tokens\) \+ --max-new-tokens \(1\) reads 65 .*; shorten the prompt to at most 64 tokens$"
    with pytest.raises(MinilmError, match=said):
        generate(learned, [1] * 65, 1, greedy=True, names=flags)


def test_the_tightest_bound_of_any_position_module_limits_generation():
    model = tiny("learned")
    assert max_length(model) == 64 and max_length(tiny("rope")) is None
    model.blocks[1].attn.pos.max_length = lambda: 20  # one layer accepting fewer positions than the embedding
    assert max_length(model) == 20
    with pytest.raises(MinilmError, match="more than the 20 this model"):
        generate(model, [1] * 15, 7, greedy=True)


def test_top_k_below_one_and_a_negative_token_count_are_refused():
    model = tiny("rope")
    with pytest.raises(MinilmError, match="top_k: must be >= 1, got 0"):
        generate(model, [1, 2], 3, top_k=0)
    with pytest.raises(MinilmError, match="max_new_tokens: must be >= 0, got -1"):
        generate(model, [1, 2], -1)
    assert generate(model, [1, 2], 0).tolist() == [[1, 2]]  # zero new tokens: the prompt
    with pytest.raises(MinilmError, match="^--top-p: must be in"):  # named as a caller's user gives it
        check_sampling(3, 1.0, None, 2.0, names={"top_p": "--top-p"})


def _bytes_decode(ids):
    """A byte-fallback-only tokenizer: one id per UTF-8 byte (the worst case for partial characters)."""
    return bytes(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("text,stop,before", [
    ('x = "é€" # done\nnext', ["\n"], 'x = "é€" # done'),
    ('x = "é€" # done\nnext', ["€"], 'x = "é'),  # a stop string of three byte tokens
    ('x = "é€" # done\nnext', ["# do", '"é'], "x = "),  # the first occurrence in the text, not the first listed
    ('abab abc', ["abc"], "abab "),  # a held prefix ('ab') that does not complete, then one that does
    ('x = "é€" # done', ["none"], 'x = "é€" # done'),  # no stop string: everything, held text at the end included
])  # fmt: skip
def test_a_text_stream_ends_exactly_where_the_first_stop_string_begins(text, stop, before):
    """Streamed text stops at the first occurrence of a stop string, even one spanning several tokens or split inside
    a multi-byte character: nothing past it is ever printed, nor a broken character, and what is printed joins to the
    text before it."""
    from minilm.model.generate import TextStream

    stream = TextStream(_bytes_decode, stop=stop)
    pieces = []
    for i in text.encode():
        pieces.append(stream.push(i))
        assert before.startswith("".join(pieces))  # never past the stop string, not even for one step
    pieces.append(stream.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == before
    assert stream.stopped == (before != text)
    # a decoder that rewrites text already shown (as test_text_stream_holds_partial_characters_back's): nothing more is
    # printed, but a stop string in the rewritten text still ends the stream
    rewriting = TextStream(lambda ids: "".join(chr(96 + i) for i in ids).capitalize() if len(ids) > 1 else "a",
                           stop=["bc"])  # fmt: skip
    assert [(rewriting.push(i), rewriting.stopped) for i in (1, 2, 3)] == [("a", False), ("", False), ("", True)]
    # one that rewrites the context's own text once new ids follow: the stop string is read in the new ids' text
    context = TextStream(lambda ids: "".join(chr(96 + i) for i in ids).upper() if len(ids) > 1 else "a",
                         context=[1], stop=["BC"])  # fmt: skip
    assert [(context.push(i), context.stopped) for i in (2, 3)] == [("", False), ("", True)]


def test_generate_ends_each_row_at_its_first_stop_string():
    """generate(stop=..., decode=...) ends a row at the token that completes a stop string in its new text (a string
    of two tokens here), each row on its own, the others decoding on as they would alone; rows that stopped are
    padded with eos_id. The prompt's text is not searched."""
    model = tiny("rope")
    decode = lambda ids: "".join(chr(65 + i) for i in ids)  # noqa: E731  (one letter per id)
    prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(0))
    free = generate(model, prompt, 12, seed=0)[:, 4:]
    stop = decode(free[0, 2:4].tolist())  # row 0's 3rd and 4th new tokens
    assert stop not in decode(free[1].tolist()), "pick another prompt: row 1 must not stop"
    ends = [decode(row.tolist()).find(stop) for row in free]
    eos = V - 1
    out = generate(model, prompt, 12, seed=0, stop=[stop], decode=decode, eos_id=eos)[:, 4:]
    last = ends[0] + len(stop)  # row 0 ends with the token that completes the stop string
    assert last == 4
    assert torch.equal(out[0, :last], free[0, :last]) and (out[0, last:] == eos).all()
    assert torch.equal(out[1], free[1]) and out.shape[1] == 12
    one = generate(model, prompt[:1], 12, seed=0)[0, 4:]  # one row: one string, and no eos_id needed
    stop = decode(one[2:4].tolist())
    alone = generate(model, prompt[:1], 12, seed=0, stop=stop, decode=decode)[0, 4:]
    assert torch.equal(alone, one[: decode(one.tolist()).find(stop) + 2])
    in_prompt = decode(prompt[0, -2:].tolist())
    assert in_prompt not in decode(one.tolist())
    assert generate(model, prompt[:1], 12, seed=0, stop=[in_prompt], decode=decode).shape[1] == 16


@pytest.mark.parametrize("kwargs,said", [
    ({"stop": ["x", ""]}, "stop: each stop string must be a non-empty string, got ''"),
    ({"stop": [3]}, "stop: each stop string must be a non-empty string, got 3"),
    ({"stop": 3}, "stop: must be a string or a list of strings, got 3"),
    ({"stop": ["x"]}, r"stop: stop strings are read in the decoded text; give decode="),
    ({"stop": ["x"], "decode": str, "prompt_ids": [[1, 2], [3, 4]]}, "stop: with 2 rows, a row that stops is padded"),
])  # fmt: skip
def test_bad_stop_strings_are_refused(kwargs, said):
    with pytest.raises(MinilmError, match=said):
        generate(tiny("rope"), **{"prompt_ids": [1, 2], "max_new_tokens": 3, **kwargs})
