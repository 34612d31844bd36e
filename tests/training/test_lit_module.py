"""The Lightning adapter: what a training step calls, and the optimizer it builds."""

from minilm.config import load_config
from minilm.model import GPT
from minilm.training.lit_module import LitGPT
from minilm.training.optim import make_adamw, param_groups


def _model():
    return GPT(load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2"]).model, 40)


def test_train_compile_compiles_the_loss_a_step_calls():
    model = _model()
    eager = LitGPT(model, load_config(), total_steps=1)
    assert eager.loss_fn == model.loss
    compiled = LitGPT(model, load_config(overrides=["train.compile=true"]), total_steps=1)
    assert hasattr(compiled.loss_fn, "_torchdynamo_orig_callable"), "train.compile did not wrap the step's loss"


def test_weight_decay_on_matrices_only():
    model = _model()
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == n  # tied weights counted once


def test_adamw_uses_the_fused_kernel_on_cpu_and_steps_like_foreach():
    """Fused where torch has the kernel (CPU here: 0.6 vs 2.1 ms per tiny-config step); same update as foreach."""
    import torch

    cfg = load_config(overrides=["optim.weight_decay=0.1"])
    fused_model, foreach_model = _model(), _model()
    foreach_model.load_state_dict(fused_model.state_dict())
    fused = make_adamw(fused_model, cfg.optim)
    assert fused.defaults["fused"] is True
    foreach = torch.optim.AdamW(param_groups(foreach_model, 0.1), lr=cfg.optim.lr,
                                betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps)  # fmt: skip
    x = torch.randint(0, 40, (2, 8))
    for model, opt in ((fused_model, fused), (foreach_model, foreach)):
        for _ in range(3):
            model.loss(x[:, :-1], x[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(fused_model.parameters(), foreach_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _fit(micro: int, steps: int = 1, log_every: int = 1, batch: int = 4, prepare=None, **over):
    """Train a tiny LitGPT for ``steps`` optimizer steps on fixed rows (the same ``batch`` rows each step, in
    micro-batches of ``micro``); ``prepare(module)`` runs before the fit. Returns the scalars it logged,
    {tag: [(step, value), ...]}."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    over = {"train.batch_size": batch, "train.micro_batch_size": micro, "train.log_every": log_every,
            "optim.warmup_steps": 0, **over}  # fmt: skip
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2",
                                 *(f"{k}={v}" for k, v in over.items())])  # fmt: skip
    torch.manual_seed(1)
    module = LitGPT(GPT(cfg.model, 40), cfg, total_steps=steps)
    x = torch.randint(0, 40, (batch, 9), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": x[i:i + micro, :-1], "targets": x[i:i + micro, 1:]} for i in range(0, batch, micro)]
    logged = {}
    module.log_scalars = lambda scalars: [logged.setdefault(k, []).append((module.global_step, v))
                                          for k, v in scalars.items()]  # fmt: skip
    trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=batch // micro, logger=False, accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0)  # fmt: skip
    if prepare is not None:
        prepare(module)
    trainer.fit(module, DataLoader(rows * steps, batch_size=None))
    return logged


def test_logged_loss_is_the_whole_batch_mean_under_gradient_accumulation():
    """micro_batch_size only trades memory for time: the step's gradient is the same, and so must be its logged
    train/loss (the mean over the step's micro-batches). It was the last micro-batch's loss alone."""
    whole, halves, singles = (_fit(micro)["train/loss"][0][1] for micro in (4, 2, 1))
    assert abs(halves - whole) < 1e-5 and abs(singles - whole) < 1e-5, (whole, halves, singles)


def test_logged_lr_is_the_lr_the_step_used():
    """The scheduler steps before on_train_batch_end, so the optimizer's current lr is the next step's: a one-step
    phase without warmup trains at the peak lr, and logged the floor (lr · min_lr_ratio)."""
    logged = _fit(4, **{"optim.lr": 0.01, "optim.min_lr_ratio": 0.1})
    assert logged["lr"] == [(1, 0.01)]
    logged = _fit(4, steps=3, **{"optim.lr": 0.01, "optim.warmup_steps": 3})  # warmup: 1/3, 2/3, 3/3 of the peak
    assert [round(v, 6) for _, v in logged["lr"]] == [0.003333, 0.006667, 0.01]


def test_tokens_per_sec_counts_the_steps_since_the_last_log(monkeypatch):
    """At a phase's last step (not a multiple of log_every) fewer than log_every steps have passed since the last
    log; tokens_per_sec assumed log_every, overstating the speed."""
    import itertools
    from types import SimpleNamespace

    from minilm.training import lit_module

    ticks = itertools.count(1.0)  # the module's clock advances one second per read: once per log
    monkeypatch.setattr(lit_module, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    per_step = 4 * 256  # batch_size 4 x the default seq_len
    logged = _fit(4, steps=6, log_every=4)
    assert dict(logged["tokens_per_sec"]) == {4: 4 * per_step, 6: 2 * per_step}


def test_a_step_whose_gradient_is_not_finite_is_skipped_or_stops_the_phase(capsys):
    """A finite loss with a NaN gradient: clipping wrote NaN into every weight (it scales by clip / norm), and only
    the next step's loss stopped the phase, the model already lost; with max_bad_steps > 0 every later step was
    "skipped" on a ruined model. Now the step itself is skipped (weights untouched) or stops the phase."""
    import pytest
    import torch

    from minilm.errors import MinilmError

    modules = []

    def poison(module):  # every step's gradient of the embedding is NaN; the loss stays finite
        module.model.tok_emb.weight.register_hook(lambda g: g * float("nan"))
        modules.append((module, {k: v.clone() for k, v in module.model.state_dict().items()}))

    with pytest.raises(MinilmError, match="gradient norm became nan at step 0; stopping"):
        _fit(4, prepare=poison)
    logged = _fit(4, steps=2, prepare=poison, **{"train.max_bad_steps": 2})
    module, before = modules[-1]
    assert module.bad_steps == 2 and all(torch.equal(v, before[k]) for k, v in module.model.state_dict().items())
    assert all(torch.isfinite(torch.tensor(v)) for _, v in logged["train/loss"])
    assert capsys.readouterr().out.count("gradient norm became nan") == 2


def test_a_nan_loss_skips_its_step_through_the_gradient_and_then_stops_the_phase(capsys):
    """A NaN loss is no longer skipped by returning None from training_step (under DDP the other ranks would wait
    in the all-reduce for the skipping one): its gradient is NaN too, so the step is skipped where every rank
    decides alike. max_bad_steps=1: the first is skipped with the weights untouched, the second stops."""
    import pytest
    import torch

    from minilm.errors import MinilmError

    modules = []

    def poison(module):
        loss = module.loss_fn
        module.loss_fn = lambda *a, **k: loss(*a, **k) * float("nan")
        modules.append((module, {k: v.clone() for k, v in module.model.state_dict().items()}))

    with pytest.raises(MinilmError, match="the loss became nan at step 1; stopping"):
        _fit(2, steps=3, prepare=poison, **{"train.max_bad_steps": 1})
    module, before = modules[-1]
    assert module.bad_steps == 2 and all(torch.equal(v, before[k]) for k, v in module.model.state_dict().items())
    assert "warning: the loss became nan at step 0; skipped (1/1)" in capsys.readouterr().out
