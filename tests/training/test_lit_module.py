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
