"""The memory a run cannot do without (minilm/training/memory.py): the parameter count it is judged by, the machine's
memory as read, the refusal, and running out of memory said as an error naming the phase."""

import pytest
import torch
from omegaconf import OmegaConf

from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.model import GPT
from minilm.positions import REGISTRY
from minilm.training import memory
from minilm.training.memory import check_model_fits_host, host_memory_bytes, is_out_of_memory, out_of_memory, param_count


def _model_cfg(**over):
    cfg = load_config(None, [f"model.{k}={v}" for k, v in over.items()])
    return cfg.model


@pytest.mark.parametrize("over", [
    {}, {"tie_embeddings": False}, {"mlp": "gelu", "n_kv_heads": 2},
    *({"position.name": name} for name in sorted(REGISTRY) if name != "rope"),  # every encoding builds on meta
])  # fmt: skip
@pytest.mark.parametrize("vocab", [0, 300])
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_the_count_from_one_block_is_the_models_count(over, vocab):
    """Counted from a one-block model on the meta device; equal to the model's own count for every layer count."""
    mcfg = _model_cfg(n_layers=3, d_model=64, n_heads=4, **over)
    model = GPT(mcfg, vocab)
    assert param_count(mcfg, vocab) == sum(p.numel() for p in model.parameters())


def test_a_t5_table_too_large_for_any_machine_is_counted_not_built():
    """num_buckets 2^50: T5's bucket thresholds (a search holding a tensor per bucket, on the CPU) were computed
    while the model was built on the meta device to be counted, an allocation error traceback before the count could
    refuse the 2^50-row table."""
    mcfg = _model_cfg(n_layers=2, d_model=32, n_heads=2, **{"position.name": "t5", "position.num_buckets": 2**50,
                                                             "position.max_distance": 2**50 + 1})
    assert param_count(mcfg, 0) > 2 * 2 * 2**50  # two layers of a (2^50, 2 heads) table
    with pytest.raises(MinilmError, match=r"model\.n_layers=2, model\.d_model=32: .* more than this machine"):
        check_model_fits_host(mcfg, 0)


def test_host_memory_is_ram_and_swap_or_a_lower_cgroup_limit(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       1000 kB\nMemFree:  10 kB\nSwapTotal:  24 kB\n")
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert host_memory_bytes(info, ()) == 1024 * 1024
    v2.write_text("max\n")  # cgroup v2 without a limit
    assert host_memory_bytes(info, (v2, tmp_path / "absent")) == 1024 * 1024
    v1.write_text("500000\n")
    assert host_memory_bytes(info, (v2, v1)) == 500000
    assert host_memory_bytes(tmp_path / "absent", (tmp_path / "absent",)) is None


def test_a_model_larger_than_the_machine_is_refused_naming_its_size(monkeypatch):
    mcfg = _model_cfg(n_layers=2, d_model=64, n_heads=4)
    n = param_count(mcfg, 300)
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 16 * n)
    check_model_fits_host(mcfg, 300)  # exactly fits
    with pytest.raises(MinilmError, match=r"model.n_layers=2, model.d_model=64: .*16 bytes per parameter.*model\.d_ff"):
        check_model_fits_host(mcfg, 300, processes=2)  # two DDP ranks on this machine: two copies
    with pytest.raises(MinilmError, match="not counting the embedding"):
        monkeypatch.setattr(memory, "host_memory_bytes", lambda: 16 * n // 2)
        check_model_fits_host(mcfg, 0)
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: None)  # unknown: nothing refused
    check_model_fits_host(mcfg, 300, processes=1000)


def test_out_of_memory_is_recognised_and_said_with_what_to_change():
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: ...")
    assert is_out_of_memory(cuda) and is_out_of_memory(cpu) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(ValueError("memory"))
    msg = str(out_of_memory(cuda, "extend", 120, "cuda:0"))
    assert msg.startswith("phase 'extend' ran out of memory on cuda:0 at step 120 (CUDA out of memory. Tried")
    assert "more detail" not in msg and "--resume" in msg and "model.activation_checkpointing=true" in msg


def test_omegaconf_model_sections_of_a_saved_run_are_counted_too():
    """A plain DictConfig (a saved run's, without the schema) counts as the schema's does."""
    mcfg = _model_cfg(n_layers=2, d_model=32, n_heads=2)
    plain = OmegaConf.create(OmegaConf.to_container(mcfg))
    assert param_count(plain, 50) == param_count(mcfg, 50)


def test_a_model_larger_than_the_gpu_is_refused_naming_both_sizes(monkeypatch):
    mcfg = _model_cfg(n_layers=2, d_model=64, n_heads=4)
    n = param_count(mcfg, 300)
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 16 * n)
    memory.check_model_fits_device(mcfg, 300)  # exactly fits
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 16 * n - 1)
    with pytest.raises(MinilmError, match=r"model.n_layers=2, model.d_model=64: .* on each GPU: .*more than this GPU's"):
        memory.check_model_fits_device(mcfg, 300)
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: None)  # no CUDA: nothing refused
    memory.check_model_fits_device(mcfg, 300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="reads this machine's GPU, which the CPU run has none of")
def test_without_cuda_no_device_memory_is_read():
    assert memory.device_memory_bytes() is None


@pytest.mark.parametrize("cuda", [False, True])
def test_the_run_check_refuses_a_model_too_large_for_the_device_it_trains_on(monkeypatch, tmp_path, cuda):
    """Through the check a run makes before its corpus is prepared (train.py's, a study's): on CUDA against the GPU's
    memory, on the CPU against the host's; each refusal names the memory it was judged by."""
    from minilm.training import phases, run_checks

    cfg = load_config("configs/tiny.yaml", [f"run.dir={tmp_path / 'run'}", "model.n_layers=2000"])
    monkeypatch.setattr(phases.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 10**9)  # a 1 GB GPU
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 10**9)  # and a 1 GB host
    with pytest.raises(MinilmError, match="this GPU's 1.0 GB" if cuda else "this machine's 1.0 GB"):
        run_checks.check_run(cfg, resume=False, data=False)
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("name, key", [("learned", "max_positions"), ("shaw", "max_distance"), ("cope", "npos_max")])
def test_a_position_table_too_large_for_the_machine_is_named(monkeypatch, name, key):
    """A position encoding's table that makes the model too large (model.position.max_distance=1e11 for Shaw: 51,200G
    parameters) was refused with "make the model smaller (model.n_layers, model.d_model, model.d_ff)", keys the user
    had not changed; the refusal names the encoding's size parameter instead."""
    mcfg = _model_cfg(n_layers=2, d_model=64, n_heads=4, **{"position.name": name, f"position.{key}": 10**6})
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 16 * 10**6)
    with pytest.raises(MinilmError, match=rf"G of them in the position encoding \({name}\);.*make the model smaller "
                                          rf"\(model\.position\.{key}\) or"):
        check_model_fits_host(mcfg, 300)
    small = _model_cfg(n_layers=2, d_model=64, n_heads=4, **{"position.name": name})
    assert memory.position_param_count(small) == sum(
        p.numel() for m in [GPT(small, 300).pos_emb, *GPT(small, 300).position_modules()] for p in m.parameters())
