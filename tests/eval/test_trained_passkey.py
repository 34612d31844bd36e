"""The suite must be able to succeed too: a tiny GPT trained on CPU on the synthetic passkey rows of the training
sampler (the generator the evaluation prompts share) scores high on passkey at its training length, and the same
evaluation of the untrained model scores ~0. Slow: ~1 minute on 2 cores.

NOT RELIABLE YET (a non-strict xfail): 4 layers, d_model 64, answer-only loss, 1200 steps reach 98 % per-token
accuracy on training rows, but exact match on held-out filler varied between runs of this same test — >= 0.8,
0.63, >= 0.8 (the corpus and its tokenizer are rebuilt each session); 2000 steps gave 0.43, loss on every token
0.27. 2 layers stayed at ~0 within 3000 steps. A setting that learns the copy robustly is open work."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from minilm.data import make_sampler
from minilm.eval import EvalSettings, evaluate

from .conftest import tiny_gpt

SEQ_LEN, STEPS, WARMUP = 48, 1200, 100


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="retrieval on held-out filler varies run to run (0.63 to >= 0.8); see docstring")
def test_tiny_model_trained_on_passkey_retrieves_at_its_training_length(corpus_setup, eval_data):
    cfg, corpus = corpus_setup
    data_cfg = OmegaConf.merge(cfg.data, {"synthetic": {"fraction": 0.99, "tasks": ["passkey"], "style": "code"}})
    shape = {"n_layers": 4, "d_model": 64, "n_heads": 2}
    model = tiny_gpt(OmegaConf.merge(cfg, {"model": shape}), corpus.tokenizer.vocab_size)
    settings = EvalSettings(lengths=[SEQ_LEN], tasks=["passkey"], samples=10, depths=[0.0, 0.5, 1.0], seed=0)
    before = evaluate(model, eval_data, settings, log=lambda *_: None)["passkey"][str(SEQ_LEN)]

    sampler = make_sampler(corpus, "train", data_cfg, SEQ_LEN, 32, seed=0, phase="passkey")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / WARMUP))
    model.train()
    for step in range(STEPS):
        batch = sampler.batch(step)
        targets = batch["targets"].clone()
        targets[:, :-6] = -100  # the answer: 5 digits and the closing quote
        loss = model.loss(batch["input_ids"], targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        warmup.step()

    after = evaluate(model, eval_data, settings, log=lambda *_: None)
    assert before <= 0.1
    assert after["passkey"][str(SEQ_LEN)] >= 0.8, after["passkey_grid"]
