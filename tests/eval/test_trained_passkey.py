"""The suite must be able to succeed too: a tiny GPT trained on CPU on the synthetic passkey rows of the training
sampler (the generator the evaluation prompts share) scores high on passkey at its training length, and the same
evaluation of the untrained model scores ~0. Slow: thousands of small steps (minutes on 2 cores).

The loss is restricted to the answer tokens, so copying the key is the whole training signal.
NOT YET VERIFIED TO PASS: with 2 layers, d_model 64 and 3000 steps at length 48 (answer-only loss, lr 3e-3) the
model reached about 57% per-token answer accuracy and ~0% exact match (it copies some digits, not all five); a
larger model or a longer run is needed, and finding one is open work (see the issue's report)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from minilm.data import make_sampler
from minilm.eval import EvalSettings, evaluate

from .conftest import tiny_gpt

SEQ_LEN, STEPS = 48, 3000


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,  # a known gap: when a setting that learns the task is found, this turns into an error to remove
    reason="not yet learnable at this size: 2 layers, d_model 64, 3000 steps reach ~57% per-token and ~0% exact",
)
def test_tiny_model_trained_on_passkey_retrieves_at_its_training_length(corpus_setup, eval_data):
    cfg, corpus = corpus_setup
    data_cfg = OmegaConf.merge(cfg.data, {"synthetic": {"fraction": 0.99, "tasks": ["passkey"], "style": "code"}})
    model = tiny_gpt(OmegaConf.merge(cfg, {"model": {"d_model": 64, "n_heads": 2}}), corpus.tokenizer.vocab_size)
    settings = EvalSettings(lengths=[SEQ_LEN], tasks=["passkey"], samples=10, depths=[0.0, 0.5, 1.0], seed=0)
    before = evaluate(model, eval_data, settings, log=lambda *_: None)["passkey"][str(SEQ_LEN)]

    sampler = make_sampler(corpus, "train", data_cfg, SEQ_LEN, 32, seed=0, phase="passkey")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for step in range(STEPS):
        batch = sampler.batch(step)
        targets = batch["targets"].clone()
        targets[:, :-6] = -100  # the answer: 5 digits and the closing quote
        loss = model.loss(batch["input_ids"], targets)
        opt.zero_grad()
        loss.backward()
        opt.step()

    after = evaluate(model, eval_data, settings, log=lambda *_: None)
    assert before <= 0.1
    assert after["passkey"][str(SEQ_LEN)] >= 0.8, after["passkey_grid"]
