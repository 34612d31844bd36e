"""Batches for one phase, indexed by micro-step so that resume and DDP sharding are exact.

The sampler (minilm.data) is a pure function of (seed, phase, index, rank); the train loader yields micro-batch
``(start + i) % accum`` of ``sampler.batch((start + i) // accum)``, where ``start`` is the micro-step the restored
trainer is at. Lightning restores the trainer's step before it asks for the loader, so a resumed phase sees
exactly the batches an uninterrupted one would. The sampler draws whole batches (``batch_size`` rows) and
``micro_batch_size`` only splits them, so gradient accumulation trains on the rows, and validates on the rows, of
a run without it: it trades memory for time and changes nothing else. (The loss of a step is the mean over all its
targets, not of its micro-batches' or ranks' means: those differ where rows have different numbers of targets,
synthetic rows under ``data.synthetic.loss: answer``. LitGPT weighs them, from the count each micro-batch carries.)
"""

from __future__ import annotations

import functools

import lightning as L
from torch.utils.data import DataLoader, Dataset

from minilm.config import micro_batch_size, phase_steps
from minilm.data import IGNORE
from minilm.errors import MinilmError

STEP_TARGETS = "step_targets"  # the key of a train micro-batch that counts its step's targets (_StepBatches)


def _micro(batch: dict, m: int, accum: int) -> dict:
    """Micro-batch ``m`` of ``accum`` of a batch: its rows [m·B/accum, (m+1)·B/accum)."""
    rows = next(iter(batch.values())).shape[0] // accum
    return {k: v[m * rows : (m + 1) * rows] for k, v in batch.items()}


class _StepBatches(Dataset):
    def __init__(self, fetch, start: int, length: int, accum: int):
        self.fetch, self.start, self.length, self.accum = fetch, start, length, accum
        self._step, self._batch = None, None  # the step whose batch is being split (its micro-batches come in a row)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        step, m = divmod(self.start + i, self.accum)
        if step != self._step:
            self._step, self._batch = step, self.fetch(step)
            self._targets = int((self._batch["targets"] != IGNORE).sum())
        # the targets of the whole step on this rank: LitGPT weighs each micro-batch's loss by its share of the step's
        # targets, so the step's gradient is the mean over all its targets however the rows are split
        return {**_micro(self._batch, m, self.accum), STEP_TARGETS: self._targets}


class PhaseData(L.LightningDataModule):
    def __init__(self, corpus, pcfg, phase: str):
        super().__init__()
        self.corpus, self.cfg, self.phase = corpus, pcfg, phase
        self.accum = pcfg.train.batch_size // micro_batch_size(pcfg.train)
        self._val = None

    @functools.cached_property
    def sampler(self):
        """The phase's train sampler, built once the trainer (its rank) is attached."""
        from minilm.data import make_sampler

        t = self.cfg.train
        return make_sampler(
            self.corpus, "train", self.cfg.data, t.seq_len, t.batch_size, self.cfg.run.seed, self.phase,
            rank=self.trainer.global_rank, world_size=self.trainer.world_size,
        )  # fmt: skip

    # Saved in every checkpoint and checked on resume: the batches are a function of the step, so there is no
    # position to restore, but a resume whose seed or sampling settings differ would silently draw other data.
    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "sampler" in state:  # checkpoints written before the sampler's identity was saved have none
            self.sampler.load_state_dict(self.as_split_now(state["sampler"], self.sampler))

    @staticmethod
    def as_split_now(saved: dict, sampler) -> dict:
        """A checkpoint's sampler state as ``sampler`` (this process's) would save it, where the two draw the same
        rows. Rank 0 writes the one checkpoint every rank resumes from: the rank in it is 0's, not this process's
        (every other rank warned that its batches "differ from the original run" on an exact resume). And the
        sampler draws the global batch, ``batch_size x world_size`` rows, whatever their split: 2 processes x 2 rows
        continue as 1 x 4. Another global batch is refused: ``--resume`` says so before the run changes
        (run_checks._check_trained_with); this is the check of a checkpoint restored any other way."""
        was = (saved.get("batch_size"), saved.get("world_size", 1))
        now = sampler.batch_size * sampler.world_size
        if was[0] is not None and was[0] * was[1] != now:
            raise MinilmError(f"the checkpoint trained on a global batch of {was[0] * was[1]} sequences (batch_size "
                              f"{was[0]} x {was[1]} process(es)), this run on {now} ({sampler.batch_size} x "
                              f"{sampler.world_size}); train.batch_size is per device: give the global batch it "
                              "trained with")  # fmt: skip
        split = {"rank": sampler.rank, "world_size": sampler.world_size}
        return {**saved, **split, **({"batch_size": sampler.batch_size} if was[0] is not None else {})}

    def train_dataloader(self) -> DataLoader:
        sampler = self.sampler
        total = phase_steps(self.cfg) * self.accum
        start = self.trainer.global_step * self.accum  # restored before this is called
        # The loader keeps the phase's full length (Lightning checks val_check_interval against it); the loop
        # stops at max_steps, before the indices run past the phase.
        return DataLoader(_StepBatches(sampler.batch, start, total, self.accum), batch_size=None, shuffle=False,
                          num_workers=0)  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        if self._val is None:
            from minilm.data import validation_batches

            t = self.cfg.train
            whole = validation_batches(
                self.corpus, self.cfg.data, t.seq_len, t.batch_size, t.val_batches, self.cfg.run.seed,
                rank=self.trainer.global_rank, world_size=self.trainer.world_size,
            )  # fmt: skip
            self._val = [_micro(b, m, self.accum) for b in whole for m in range(self.accum)]
        return DataLoader(self._val, batch_size=None, shuffle=False, num_workers=0)
