"""The Lightning adapter: what a training step calls, and the optimizer it builds."""

from minilm.config import load_config
from minilm.model import GPT
from minilm.training.lit_module import LitGPT, param_groups


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
