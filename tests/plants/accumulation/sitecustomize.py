"""Planted defects for the gradient-accumulation tests: with RECIPES_PLANT_ACCUMULATION=NAME on
the environment and this folder on PYTHONPATH, every Python process started (the entry
scripts, their ranks) carries the defect; tests/plants/check.py runs each against the test
that must catch it.

  ddp-reduces-every-micro-batch   DDP's no_sync ignored: the sum is right, the traffic is not
                                  (tests/test_accumulation.py, ddp: the collective counts)
  ddp-never-reduces               no_sync on the last micro-batch too: ranks drift apart
                                  (test_accumulation.py, ddp: the weights)
  fsdp-reduces-every-micro-batch  FSDP's gradient sync left on (test_accumulation.py, fsdp)
  horovod-one-pass-per-step       Horovod's backward_passes_per_step left at 1
                                  (test_accumulation.py, horovod)
  shards-in-blocks                rank r takes the r-th block of the epoch's order instead of
                                  every W-th sample: micro-batches no longer nd's
                                  (test_accumulation.py, ddp: the samples)
  resume-forgets-accumulation     a mid-epoch resume positions the sampler as if each step
                                  took one micro-batch (tests/test_fault_tolerance.py,
                                  preemption with --grad-accum 2)
"""
import contextlib
import os

PLANT = os.environ.get("RECIPES_PLANT_ACCUMULATION", "")

if PLANT in ("ddp-reduces-every-micro-batch", "fsdp-reduces-every-micro-batch"):
    module = __import__("imagenet_recipes.strategies." + PLANT.split("-")[0],
                        fromlist=["_"])
    strategy = {"ddp": "DDPStrategy", "fsdp": "FSDPStrategy"}[PLANT.split("-")[0]]
    getattr(module, strategy)._no_sync = lambda self: contextlib.nullcontext()

elif PLANT == "ddp-never-reduces":
    from imagenet_recipes.strategies import ddp

    ddp.DDPStrategy.micro_step = lambda self, last: self._no_sync()

elif PLANT == "horovod-one-pass-per-step":
    from imagenet_recipes.strategies import horovod

    _follow = horovod.HorovodStrategy.follow

    def _one_pass(self, plan):
        _follow(self, plan)
        self.backward_passes_per_step = 1

    horovod.HorovodStrategy.follow = _one_pass

elif PLANT == "shards-in-blocks":
    from imagenet_recipes.data import sampling

    def _blocks(self):
        order = self._remaining_order()
        size = len(order) // self.world
        crop = self.crop_of_epoch(self.epoch) if self.crop_of_epoch else None
        for position, copy in order[self.rank * size:(self.rank + 1) * size]:
            index = self.subset[position] if self.subset is not None else position
            yield sampling.SampleKey(index, sampling.sample_seed(self.seed, self.epoch, index,
                                                                 copy), crop)

    _iter = sampling.ShardedSampler.__iter__
    sampling.ShardedSampler.__iter__ = lambda self: (_blocks(self) if self.shuffle
                                                     else _iter(self))

elif PLANT == "resume-forgets-accumulation":
    from imagenet_recipes import engine

    _epoch = engine.Trainer.train_one_epoch

    def _forgetful(self):
        loader, accum = self.train_loader, self.cfg.grad_accum
        real = loader.set_epoch
        loader.set_epoch = lambda epoch, start_sample=0: real(epoch, start_sample // accum)
        try:
            return _epoch(self)
        finally:
            del loader.set_epoch

    engine.Trainer.train_one_epoch = _forgetful
