"""Runs an entry script with every training sample index its sampler hands out appended to a
file, so a test can count what a run (or an interrupted and resumed pair of runs) trained on:

    python tests/sample_trace.py OUT_DIR train/ddp.py ARGS...     (or under torchrun)

Use -j 0: DataLoader worker processes prefetch indices ahead of training; without them the
sampler is read one batch at a time, exactly as the steps consume it.

With SAMPLE_TRACE_DELAY_S set, each training sample is handed out that many seconds late: a
floor under a step's time, so a test can signal a run mid-epoch on any CPU, however fast.
"""
import os
import runpy
import sys
import time

from imagenet_recipes.data import sampling

out_dir, script = sys.argv[1], sys.argv[2]
untraced_iter = sampling.ShardedSampler.__iter__
delay_s = float(os.environ.get("SAMPLE_TRACE_DELAY_S", "0"))


def traced_iter(self):
    path = os.path.join(out_dir, f"rank{os.environ.get('RANK', '0')}-pid{os.getpid()}.txt")
    with open(path, "a") as out:
        for key in untraced_iter(self):
            if self.shuffle:  # the training sampler; validation is counted by its own tests
                out.write(f"{self.epoch} {key.index}\n")
                out.flush()
                time.sleep(delay_s)
            yield key


sampling.ShardedSampler.__iter__ = traced_iter
sys.argv = [script, *sys.argv[3:]]
sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
runpy.run_path(script, run_name="__main__")
