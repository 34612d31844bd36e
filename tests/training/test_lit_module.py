"""The Lightning adapter: what a training step calls, and the optimizer it builds."""

import re

import pytest

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


def test_train_compile_mode_reaches_torch_compile(monkeypatch):
    """train.compile_mode is the mode LitGPT compiles the loss in; "default" passes none (torch's own default)."""
    import torch

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    for mode in ("default", "max-autotune-no-cudagraphs"):
        LitGPT(_model(), load_config(overrides=["train.compile=true", f"train.compile_mode={mode}"]), total_steps=1)
    assert [kw["mode"] for kw in calls] == [None, "max-autotune-no-cudagraphs"]


@pytest.mark.parametrize("overrides, says", [
    ([], None), (["train.compile=true"], ", compiled"),
    (["train.compile=true", "train.compile_mode=max-autotune-no-cudagraphs"],
     ", compiled (max-autotune-no-cudagraphs)"),
    (["model.sdpa_kernel=cudnn"], ", SDPA kernel cudnn first (on CUDA)"),
])  # fmt: skip
def test_the_training_log_says_how_the_model_compiles_and_its_sdpa_kernel(overrides, says):
    from minilm.training import phases

    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", *overrides])
    lines = []
    phases._new_model(cfg, {"train": phases.phase_config(cfg, "train")}, 40, lines.append)
    (line,) = lines
    assert line.startswith("model: ")
    if says is None:
        assert "compiled" not in line and "SDPA" not in line, line
    else:
        assert re.search(r"\(train\.precision auto[^)]*\)" + re.escape(says), line), line


def test_weight_decay_on_matrices_only():
    model = _model()
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == n  # tied weights counted once


def test_position_tables_and_relative_biases_take_no_weight_decay():
    """A table of values per position, distance or head (T5's bucket biases, Shaw's R^K and R^V, ...) is a bias or
    an embedding, not a map of activations: decay pulled it toward "no position" because it has two dimensions.
    With a zero gradient AdamW's step is the decay alone: the tables stay, the maps beside them shrink."""
    import torch
    from torch import nn

    from minilm.positions import PositionDims, build_position

    tables = {"learned": {"table"}, "t5": {"table"}, "shaw": {"rel_k", "rel_v"}, "transformer_xl": {"u", "v"},
              "deberta": {"rel"}, "cope": {"pos_emb"}, "fire": set(), "floater": set(), "conv": set()}  # fmt: skip
    dims = PositionDims(d_model=16, n_heads=2, n_kv_heads=2, head_dim=8, n_layers=1)
    hooks = nn.ModuleDict({n: build_position({"name": n}, dims, "embedding" if n in ("learned", "floater", "conv")
                                             else "attention") for n in tables})  # fmt: skip
    with torch.no_grad():
        for p in hooks.parameters():
            p.add_(0.1)  # off zero-initialized values (CoPE's table, FLOATER's h_out), which decay cannot move
    before = {n: p.detach().clone() for n, p in hooks.named_parameters()}
    opt = torch.optim.AdamW(param_groups(hooks, 0.5), lr=0.1)
    for p in hooks.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    kept = {n for n, p in hooks.named_parameters() if p.dim() >= 2 and torch.equal(p, before[n])}
    assert kept == {f"{name}.{t}" for name, ts in tables.items() for t in ts}
    assert not torch.equal(hooks["transformer_xl"].w_kr.weight, before["transformer_xl.w_kr.weight"])  # a map


def test_optimizer_state_of_another_grouping_is_refused_not_loaded_onto_other_parameters(tmp_path):
    """The optimizer's state is indexed by its parameters' order, which the weight-decay groups set: moments saved
    before the position tables left weight decay belong, index by index, to other parameters now. A phase's
    optimizer.pt and a step checkpoint record the names in order; files without them are checked by what they show
    (the moments' shapes, the groups' sizes)."""
    import torch

    from minilm.errors import MinilmError
    from minilm.training.phases import _carried_optimizer_state

    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.position.name=t5"])
    module = LitGPT(GPT(cfg.model, 40), cfg, total_steps=1)
    names = module.optimizer_params()
    assert names.index("blocks.0.attn.pos.table") > names.index("blocks.0.mlp.w_out.weight")  # no decay: last
    opt = module.configure_optimizers()["optimizer"]
    for p in module.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    state = opt.state_dict()
    path = tmp_path / "short" / "optimizer.pt"
    path.parent.mkdir()
    torch.save({"state": state["state"], "params": names}, path)
    module.initial_optimizer_state = _carried_optimizer_state(module.model, cfg, tmp_path, "short", "long")
    module.configure_optimizers()  # its own: loads
    for carried, says in (({"state": state["state"], "params": names[::-1]},  # names
                           r"holds .* order \(its parameter 0 is norm.weight, this model's tok_emb"),
                          ({"state": {i: state["state"][i] for i in (0, 1)} | {1: state["state"][len(names) - 1]}},
                           "holds the optim")):  # an older file: the shapes
        torch.save(carried, path)
        with pytest.raises(MinilmError, match=f"carry_optimizer: {path} " + says + r".*; start its moments afresh "
                           "with --phase long phases.long.carry_optimizer=false"):
            _carried_optimizer_state(module.model, cfg, tmp_path, "short", "long")
    sizes = [len(g["params"]) for g in state["param_groups"]]  # an older checkpoint: the table in the first group
    old = {"optimizer_states": [{"param_groups": [{"params": [0] * (sizes[0] + 1)}, {"params": [0] * (sizes[1] - 1)}]}]}
    with pytest.raises(MinilmError, match="the checkpoint of phase 'train' holds the optimizer state of other.*; "
                       "retrain the phase from the previous one's weights with --phase train"):
        module.on_load_checkpoint(old)
    ok = {"optimizer_states": [state], "minilm": {"optimizer_params": names}}
    module.on_load_checkpoint(ok)


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


def _fit(micro: int, steps: int = 1, log_every: int = 1, batch: int = 4, prepare=None, accelerator: str = "cpu",
         callbacks=(), ckpt_path=None, val_batches: int = 0, **over):
    """Train a tiny LitGPT for ``steps`` optimizer steps on fixed rows (the same ``batch`` rows each step, in
    micro-batches of ``micro``); ``prepare(module)`` runs before the fit; ``ckpt_path``: a checkpoint it resumes
    from; ``val_batches``: validate at the end on that many batches of those rows, split into the same micro-batches
    (as PhaseData splits them). Returns the scalars it logged, {tag: [(step, value), ...]}."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ProgressBar
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
    trainer = L.Trainer(max_steps=steps, max_epochs=1, accumulate_grad_batches=batch // micro, logger=False,
                        accelerator=accelerator, devices=1, enable_checkpointing=False,
                        enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
                        enable_model_summary=False, limit_val_batches=None if val_batches else 0,
                        num_sanity_val_steps=0, callbacks=list(callbacks))  # fmt: skip
    if prepare is not None:
        prepare(module)
    val = DataLoader(rows * val_batches, batch_size=None) if val_batches else None
    trainer.fit(module, DataLoader(rows * steps, batch_size=None), val, ckpt_path=ckpt_path)
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

    with pytest.raises(MinilmError, match="gradient norm became nan at step 1; stopping"):
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

    with pytest.raises(MinilmError, match="the loss became nan at step 2; stopping"):
        _fit(2, steps=3, prepare=poison, **{"train.max_bad_steps": 1})
    module, before = modules[-1]
    assert module.bad_steps == 2 and all(torch.equal(v, before[k]) for k, v in module.model.state_dict().items())
    assert "warning: the loss became nan at step 1; skipped (1/1)" in capsys.readouterr().out


def _steps_callback(at: list, on_end=None):
    """A Lightning callback writing into ``at[0]`` the optimizer step (1-based, as logged) each micro-batch belongs
    to; ``on_end(trainer, module)`` runs at the end of the fit."""
    from lightning.pytorch.callbacks import Callback

    class Steps(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            at[0] = trainer.global_step + 1

        def on_train_end(self, trainer, pl_module):
            if on_end is not None:
                on_end(trainer, pl_module)

    return Steps()


def test_steps_between_logs_read_nothing_back_from_the_device():
    """On a GPU each host read of a tensor's value (item, float) waits for the device, which then idles while
    Python sets up the next step. A step read its gradient norm (to skip a bad step) and, through the progress bar,
    its loss (Lightning read the logged tensor back twice). Now only a log reads, every train.log_every steps.
    Counted as the reads (aten._local_scalar_dense) in each step: progress bar on, two micro-batches a step."""
    import collections

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from minilm.training.progress import progress_bar

    reads, at, shown = collections.Counter(), [None], {}

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads[at[0]] += 1
            return func(*args, **(kwargs or {}))

    bar = progress_bar()
    with Reads():
        logged = _fit(2, steps=6, log_every=4, callbacks=[
            _steps_callback(at, on_end=lambda trainer, module: shown.update(bar.get_metrics(trainer, module))), bar])
    assert [step for step, _ in logged["train/loss"]] == [4, 6]
    assert sorted(step for step in reads if step is not None) == [4, 6], reads
    assert shown["loss"] == round(logged["train/loss"][-1][1], 3)  # the bar shows the last log's loss


def test_a_bad_step_between_logs_is_skipped_on_the_device_and_counted_at_the_log(capsys):
    """With the fused AdamW a step whose gradient norm is not finite is skipped by the kernel itself (found_inf):
    weights, moments and step count untouched, no host read. The next log counts it and warns of it, or stops the
    phase, naming the step."""
    import math

    import torch

    from minilm.errors import MinilmError

    modules = []

    def poison_step_1(module):  # the second step's gradient is NaN, its loss finite
        module.model.tok_emb.weight.register_hook(lambda g: g * float("nan") if module.global_step == 1 else g)
        modules.append(module)

    logged = _fit(4, steps=3, log_every=3, prepare=poison_step_1, **{"train.max_bad_steps": 1})
    module = modules[-1]
    assert module.bad_steps == 1 and logged["grad_norm"][0][0] == 3 and math.isfinite(logged["grad_norm"][0][1])
    assert "warning: the gradient norm became nan at step 2; skipped (1/1)" in capsys.readouterr().out
    opt = module.trainer.optimizers[0]
    assert {int(opt.state[p]["step"]) for p in module.model.parameters()} == {2}  # 3 steps, 1 skipped
    assert all(torch.isfinite(p).all() for p in module.model.parameters())
    with pytest.raises(MinilmError, match="gradient norm became nan at step 2; stopping"):
        _fit(4, steps=3, log_every=3, prepare=poison_step_1)


def test_a_checkpoint_counts_the_bad_steps_not_yet_read():
    """A checkpoint between logs holds the bad-step count: the steps the device skipped since the last log are read
    first."""
    import torch

    module = _module(**{"train.max_bad_steps": 5})
    module._unsettled = [(107, torch.tensor(float("nan")), torch.tensor(2.0), 1),
                         (108, torch.tensor(0.5), torch.tensor(2.0), 1)]  # fmt: skip
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["minilm"]["bad_steps"] == 1 and module.last_grad_norm == 0.5 and not module._unsettled


@pytest.mark.gpu
def test_on_a_gpu_steps_between_logs_never_wait_for_the_device():
    """The same as test_steps_between_logs_read_nothing_back_from_the_device, by CUDA itself: any synchronizing
    call inside a step that does not log raises (torch.cuda.set_sync_debug_mode)."""
    import torch
    from lightning.pytorch.callbacks import Callback

    from minilm.training.progress import progress_bar

    class NoSync(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            step = trainer.global_step + 1
            if step % 4 and step != trainer.max_steps:
                torch.cuda.set_sync_debug_mode("error")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            torch.cuda.set_sync_debug_mode("default")

    try:
        logged = _fit(2, steps=6, log_every=4, accelerator="gpu", callbacks=[NoSync(), progress_bar()])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [step for step, _ in logged["train/loss"]] == [4, 6]


def _opt(fused: bool = False):
    """A stand-in optimizer: what on_before_optimizer_step reads of one."""
    return type("Opt", (), {"param_groups": [{"lr": 0.1}], "defaults": {"fused": fused}})()


def _module(phase: str = "train", **over):
    """A tiny LitGPT outside a fit, its trainer a stand-in holding only what the hook under test reads."""
    from types import SimpleNamespace

    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2",
                                 *(f"{k}={v}" for k, v in over.items())])  # fmt: skip
    module = LitGPT(GPT(cfg.model, 40), cfg, total_steps=10, step_offset=100, phase=phase)
    module.trainer = SimpleNamespace(accumulate_grad_batches=2, global_step=0, global_rank=0, logger=None,
                                     loggers=[], precision="32-true",
                                     strategy=SimpleNamespace(reduce=lambda t, reduce_op: t))  # fmt: skip
    return module


def test_a_phase_that_stops_on_bad_steps_names_its_own_keys_and_its_own_step():
    """After a NaN, a phase giving its own lr was told to 'Lower optim.lr', which it overrides (nothing changed), and
    the step was the run's alone: 'at step 6' for a 2-step phase after a 4-step one."""
    import pytest
    from omegaconf import OmegaConf

    from minilm.errors import MinilmError

    module = _module(phase="long", **{"train.max_bad_steps": 0})
    module.set_in = OmegaConf.create({"lr": 1.0e30, "steps": 10})
    with pytest.raises(MinilmError, match=r"^phase 'long': the loss became nan at step 103 \(the phase's step 3 of "
                                          r"10\); stopping .* Lower phases.long.lr, raise optim.warmup_steps, or "):
        module._bad_step("the loss became nan", 103)
    module = _module(**{"train.max_bad_steps": 0})
    module.step_offset = 0
    with pytest.raises(MinilmError, match=r"nan at step 3; stopping .* Lower optim.lr, raise optim.warmup_steps"):
        module._bad_step("the loss became nan", 3)


def test_dropout_seed_is_a_function_of_the_micro_step_phase_and_seed():
    """Each micro-batch of an accumulated step draws its own dropout masks (not the step's first one's again), and
    the same (seed, phase, micro-step) draws the same masks whatever the generator held before (exact resume)."""
    import torch

    def draw(module, batch_idx, step=0):
        module.trainer.global_step = step
        torch.rand(5)  # whatever the data loaders drew from the global generator before
        module.on_train_batch_start({}, batch_idx)
        return torch.rand(4)

    module = _module()
    first, second, next_step = draw(module, 0), draw(module, 1), draw(module, 2, step=1)
    assert not torch.equal(first, second) and not torch.equal(second, next_step) and not torch.equal(first, next_step)
    assert torch.equal(draw(module, 0), first) and torch.equal(draw(module, 1), second)
    assert not torch.equal(draw(_module(phase="extend"), 0), first)
    assert not torch.equal(draw(_module(**{"run.seed": 7}), 0), first)


def test_grad_clip_bounds_the_step_s_gradient_norm_and_0_disables_it():
    import torch

    for clip, expected in ((0.5, 0.5), (0.0, None)):
        module = _module(**{"optim.grad_clip": clip})
        for p in module.model.parameters():
            p.grad = torch.full_like(p, 3.0)
        before = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.model.parameters()])).item()
        module.on_before_optimizer_step(_opt())
        after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.model.parameters()])).item()
        assert module.last_grad_norm == pytest.approx(before)  # the logged norm is the unclipped one
        assert after == pytest.approx(expected if expected is not None else before, rel=1e-4)


def test_fp16_skips_only_overflowing_gradients_itself_a_non_finite_loss_is_still_a_bad_step():
    """Under 16-mixed the GradScaler skips a step whose gradient overflowed (a finite loss): not a bad step. A NaN
    loss is one, whatever the precision."""
    import torch

    from minilm.errors import MinilmError

    opt = _opt(fused=True)  # fused, but under fp16 the GradScaler, not found_inf, skips the step
    for loss, bad in ((1.0, False), (float("nan"), True)):
        module = _module()
        module.trainer.precision = "16-mixed"
        module._loss_sum, module._loss_count = torch.tensor(loss), 1
        for p in module.model.parameters():
            p.grad = torch.full_like(p, float("inf"))
        if bad:
            with pytest.raises(MinilmError, match="the loss became nan"):
                module.on_before_optimizer_step(opt)
        else:
            module.on_before_optimizer_step(opt)
            assert module.bad_steps == 0 and all(p.grad is not None for p in module.model.parameters())


def test_scalars_go_to_the_run_s_step_axis_from_rank_0_only():
    from types import SimpleNamespace

    written = []
    logger = SimpleNamespace(experiment=SimpleNamespace(add_scalar=lambda *a, **k: written.append((a, k))))
    for rank in (1, 0):
        module = _module()
        module.trainer.logger, module.trainer.loggers, module.trainer.global_rank = logger, [logger], rank
        module.trainer.global_step = 7
        module.log_scalars({"lr": 0.5})
    assert written == [(("lr", 0.5), {"global_step": 107})]  # step_offset 100 + this phase's step 7


def test_the_dropout_seed_goes_to_the_cpus_generator_and_the_models_devices_alone(monkeypatch):
    """torch.manual_seed seeds every backend torch knows, and one not initialized (CUDA in a CPU run, XPU, MTIA)
    formats a stack trace per call to keep for later: 1.4 ms of host time per step. A step seeds what it draws from:
    the CPU's generator, and its device's (on CPU, none more)."""
    import torch

    called = []
    for mod in (torch.cuda, torch.mps, torch.xpu, torch.mtia):
        for name in ("manual_seed", "manual_seed_all"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, lambda *a, _name=f"{mod.__name__}.{name}": called.append(_name))
    module = _module()
    module.on_train_batch_start({}, 0)
    first = torch.rand(3)
    module.on_train_batch_start({}, 0)
    assert called == [] and torch.equal(torch.rand(3), first)


def test_checkpoint_state_restores_bad_steps_and_the_generator_and_refuses_another_phase():
    import torch

    from minilm.errors import MinilmError

    module = _module(phase="a")
    module.bad_steps = 2
    torch.manual_seed(3)
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    expected = torch.rand(4)
    resumed = _module(phase="a")
    torch.manual_seed(99)
    resumed.on_load_checkpoint(checkpoint)
    assert resumed.bad_steps == 2 and torch.equal(torch.rand(4), expected)
    with pytest.raises(MinilmError, match="checkpoint belongs to phase 'a', not 'b'"):
        _module(phase="b").on_load_checkpoint(checkpoint)


def test_validation_time_is_not_counted_as_training_time(monkeypatch):
    """tokens_per_sec measures training throughput: seconds spent validating between two logs are left out."""
    import itertools
    from types import SimpleNamespace

    from minilm.training import lit_module

    ticks = itertools.count(1.0)  # one second per clock read
    monkeypatch.setattr(lit_module, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))

    def validate_once(module):  # a validation (two clock reads: one second) between the first and second step
        start = module.on_train_batch_start

        def wrapped(batch, batch_idx):
            if batch_idx == 1:
                module.on_validation_start()
                module.on_validation_end()
            return start(batch, batch_idx)

        module.on_train_batch_start = wrapped

    per_step = 4 * 256
    logged = _fit(4, steps=2, log_every=2, prepare=validate_once)
    # clock: train start 1, validation 2..3 (1 s paused), log at 4: 2 steps over 4 - 1 - 1 = 2 training seconds
    assert dict(logged["tokens_per_sec"]) == {2: 2 * per_step / 2}


def test_adamw_decays_matrices_toward_zero_and_leaves_norms_and_biases_alone():
    """With a zero gradient AdamW's update is the weight decay alone: matrices shrink by lr · weight_decay, norm
    gains (and any vector) stay as they are."""
    import torch

    cfg = load_config(overrides=["optim.weight_decay=0.5", "optim.lr=0.1"])
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = make_adamw(model, cfg.optim)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[name] * factor, msg=name)
    assert any(p.dim() < 2 for p in model.parameters())  # the model has norms or biases to leave alone


@pytest.mark.parametrize("losses, val_loss, ppl", [((1.0, 3.0), 2.0, 7.38905609893065),
                                                    ((100.0, 60.0), 80.0, 5.184705528587072e21)])  # fmt: skip
def test_validation_logs_the_mean_loss_and_its_perplexity_capped_at_e50(losses, val_loss, ppl):
    """val/loss is the mean over the validation batches; val/ppl = exp(val/loss), capped at exp(50) so a diverged
    model logs a number, not inf."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    module = _module()
    module.trainer = None
    batches = [{"input_ids": torch.zeros(1, 4, dtype=torch.long), "targets": torch.full((1, 4), i)}
               for i in range(len(losses))]  # fmt: skip
    def loss_fn(ids, targets, reduction="mean", **k):  # each batch's mean loss, over its 4 targets
        return torch.tensor(losses[int(targets[0, 0])]) * (targets.numel() if reduction == "sum" else 1)

    module.loss_fn = loss_fn
    logged = {}
    module.log_scalars = logged.update
    trainer = L.Trainer(logger=False, accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False)  # fmt: skip
    trainer.validate(module, DataLoader(batches, batch_size=None), verbose=False)
    assert logged["val/loss"] == pytest.approx(val_loss) and logged["val/ppl"] == pytest.approx(ppl)


def test_a_skipped_step_is_reported_by_rank_0_only(capsys):
    """Every DDP rank skips a bad step alike (its gradient norm is all-reduced): each printed the warning."""
    from types import SimpleNamespace

    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.max_bad_steps=5"])
    for rank in (0, 1):
        module = LitGPT(GPT(cfg.model, 40), cfg, total_steps=1)
        module._trainer = SimpleNamespace(global_rank=rank, global_step=3)
        module._bad_step("the loss became nan", 3)
    assert capsys.readouterr().out.count("the loss became nan at step 3; skipped (1/5)") == 1


def test_a_ctrl_c_swallowed_before_a_step_ends_stops_the_phase_at_that_step():
    """A Ctrl-C lost where it arrived (a finalizer, a library's except) leaves the flag of ``minilm.cli``: the phase
    stops at the end of the step, as Lightning stops on Ctrl-C (its shutdown exits; minilm's ``_run_trainer`` turns
    that into the KeyboardInterrupt the CLI reports), instead of training on."""
    from minilm.cli import _interrupt

    seen = []

    def swallow_after_the_first_step(module):
        module.log_scalars = lambda scalars: seen.append(module.global_step) or _interrupt.set()

    try:
        with pytest.raises(SystemExit):
            _fit(4, steps=5, prepare=swallow_after_the_first_step, log_every=1)
    finally:
        _interrupt.clear()
    assert seen == [1]


@pytest.mark.parametrize("hook", ["on_train_start", "on_validation_start"])
def test_sigterm_under_ddp_interrupts_at_once_without_a_collective(hook):
    """Lightning's SIGTERM handler (installed by every fit / validate) calls dist.broadcast inside the signal
    handler: `kill` of rank 0 in the middle of a step's all_reduce hung every rank of a DDP run for good. Under
    DDP the module's first hooks put minilm's handler back (a KeyboardInterrupt: the Ctrl-C shutdown, exit 143)."""
    import os
    import signal
    from types import SimpleNamespace

    import lightning as L

    from minilm.cli import _interrupt, _sigterm

    before = signal.getsignal(signal.SIGTERM)
    connector = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)._signal_connector
    try:
        connector.register_signal_handlers()  # what Trainer._run does before the hooks
        module = LitGPT(_model(), load_config(), total_steps=1)
        module.trainer = SimpleNamespace(world_size=2, global_step=0)
        getattr(module, hook)()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # (the handler runs at the next bytecode)
                pass
        assert _sigterm.is_set()
    finally:
        connector.teardown()
        signal.signal(signal.SIGTERM, before)
        _sigterm.clear()
        _interrupt.clear()


def test_the_logged_training_loss_under_ddp_is_the_global_batchs_mean():
    """train/loss (and the progress bar's loss) of a DDP step is the mean over every rank's targets, as the step
    trained on and as one process with the same global batch logs: it was rank 0's rows alone."""
    from types import SimpleNamespace

    import torch

    other_rank = torch.tensor([30.0, 10.0])  # the other rank's summed loss and targets (mean 3.0)

    def reduce(t, reduce_op):
        assert reduce_op == "sum"
        return t + other_rank

    module = LitGPT(_model(), load_config(overrides=["train.log_every=1"]), total_steps=4)
    module.trainer = SimpleNamespace(world_size=2, global_step=1, accumulate_grad_batches=1, logger=None,
                                     global_rank=0, strategy=SimpleNamespace(reduce=reduce))  # fmt: skip
    module._loss_sum, module._loss_count = torch.tensor(10.0), torch.tensor(10)  # this rank's mean: 1.0
    module.end_step(0)
    assert module.logged_loss == pytest.approx(2.0)


@pytest.mark.parametrize("lightning_version, rich_version, rich", [
    ("2.5.0", "15.0.0", False), ("2.5.2", "14.1.0", False), ("2.5.3", "15.0.0", True), ("2.5.0", "14.0.0", True)])
def test_the_progress_bar_is_tqdms_where_lightnings_rich_bar_breaks(monkeypatch, lightning_version, rich_version,
                                                                     rich):  # fmt: skip
    """Lightning before 2.5.3 pops rich's live stack unguarded at every stage start, and from rich 14.1 it is empty
    there: every run raised IndexError at its first validation (lightning 2.4.0 with rich 15.0.0)."""
    import importlib.metadata

    import lightning

    from minilm.training import progress

    pytest.importorskip("rich")
    monkeypatch.setattr(lightning, "__version__", lightning_version)
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: rich_version if name == "rich" else real(name))
    assert isinstance(progress.progress_bar(), progress._RichBar if rich else progress._TqdmBar)


@pytest.mark.parametrize("kind", ["rich", "tqdm"])
def test_the_progress_bar_counts_optimizer_steps(tmp_path, kind):
    """Under gradient accumulation the bar counted micro-batches: 3 steps of 4 micro-batches showed 12 on the bar
    (and 4/12 after the first step), while train.steps and every log line say 3. It counts steps, and a fit resumed
    from a checkpoint goes on from its step (tqdm's bar had no total there: 'steps/?')."""
    from lightning.pytorch.callbacks import Callback

    from minilm.training import progress

    if kind == "rich":
        pytest.importorskip("rich")

    def bar_shows(bar):  # (done, total) as the bar draws them
        if kind == "tqdm":
            return bar.train_progress_bar.n, bar.train_progress_bar.total
        task = {t.id: t for t in bar.progress.tasks}[bar.train_progress_bar_id]  # (a KeyError, not a StopIteration
        return task.completed, task.total  # that Lightning's loop would take for the end of the data)

    class Watch(Callback):  # after the bar in the callbacks: what it shows once it has drawn each micro-batch
        def __init__(self, bar, save_at=None):
            self.bar, self.save_at, self.seen = bar, save_at, []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.seen.append(bar_shows(self.bar))
            if trainer.global_step == self.save_at and (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
                trainer.save_checkpoint(tmp_path / "step1.ckpt")

    bars = [progress._RichBar() if kind == "rich" else progress._TqdmBar() for _ in range(2)]
    watch = Watch(bars[0], save_at=1)
    _fit(1, steps=3, callbacks=[bars[0], watch])
    assert watch.seen == [(0, 3)] * 3 + [(1, 3)] * 4 + [(2, 3)] * 4 + [(3, 3)], watch.seen
    resumed = Watch(bars[1])
    _fit(1, steps=3, callbacks=[bars[1], resumed], ckpt_path=tmp_path / "step1.ckpt")
    assert resumed.seen == [(1, 3)] * 3 + [(2, 3)] * 4 + [(3, 3)], resumed.seen


def test_the_tqdm_bar_shows_the_loss_with_three_decimals():
    """Lightning's tqdm bar writes three significant digits padded with zeros: a loss of 3.7012 read 3.700, one of
    12.3456 read 12.30. It writes three decimals, as the rich bar does."""
    from minilm.training import progress

    bar = progress._TqdmBar()
    logged = _fit(1, steps=2, log_every=1, callbacks=[bar])
    loss = logged["train/loss"][-1][1]
    assert f"loss={loss:.3f}" in bar.train_progress_bar.postfix, (loss, bar.train_progress_bar.postfix)


@pytest.mark.parametrize("kind", ["rich", "tqdm"])
def test_the_validation_bar_counts_validation_batches(kind):
    """The validation loader splits each of its train.val_batches batches into the step's micro-batches, and the
    bar counted those: val_batches 3 of 4 micro-batches showed 12/12 (and 1/12 after the first micro-batch). It
    counts the batches train.val_batches sets: 3, moving once each batch's last micro-batch is in."""
    from lightning.pytorch.callbacks import Callback

    from minilm.training import progress

    if kind == "rich":
        pytest.importorskip("rich")

    class Watch(Callback):  # after the bar in the callbacks: what it shows once it has drawn each micro-batch
        def __init__(self, bar):
            self.bar, self.seen = bar, []

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if kind == "tqdm":
                self.seen.append((self.bar.val_progress_bar.n, self.bar.val_progress_bar.total))
            else:
                task = {t.id: t for t in self.bar.progress.tasks}[self.bar.val_progress_bar_id]
                self.seen.append((task.completed, task.total))

    bar = progress._RichBar() if kind == "rich" else progress._TqdmBar()
    watch = Watch(bar)
    logged = _fit(1, steps=1, val_batches=3, callbacks=[bar, watch])
    assert "val/loss" in logged  # (the validation ran)
    assert watch.seen == [(0, 3)] * 3 + [(1, 3)] + [(1, 3)] * 3 + [(2, 3)] + [(2, 3)] * 3 + [(3, 3)], watch.seen
