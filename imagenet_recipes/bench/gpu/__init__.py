"""GPU throughput as a benchmark, not a test: ResNet-50 at 224 px, batch 256, channels_last.

    launch/env.sh python -m imagenet_recipes.bench.gpu --list                     # the units, their rows, groups
    launch/env.sh python -m imagenet_recipes.bench.gpu --group loop    --json runs/bench_gpu/loop.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group compile --json runs/bench_gpu/compile.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group scripts --json runs/bench_gpu/scripts.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group peers --timm train.py \\
        --torchvision vision/references/classification/train.py --json runs/bench_gpu/peers.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group causes --timm-benchmark benchmark.py \\
        --json runs/bench_gpu/causes.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --device cpu -a resnet18 --image-size 32 -b 4 --steps 2 \\
        --warmup 1 --repeats 2 --amp-dtype bfloat16 --only O1-bf16,ddp-1rank   # the tool, on a CPU

A unit is one measurement and gives one or more rows; the groups together measure every row, each
sized for one call on one GPU (docs/benchmarks.md, "Fitting a GPU session"). --only names units
(--group and --only together: both sets), and a unit whose targets or ratios compare with another
unit's rows brings that unit along, so every target of a record is judged within it.

  loop     (bench.bare_loop, in this process) the engine's train step against a hand-written
           PyTorch loop with the same model, precision and optimizer, on the same batches
           already on the GPU, in alternating rounds: O1 and O2, in float16 and bfloat16. The engine is set up
           with the entry scripts' own flags (--dummy --opt-level ... --channels-last).
  compile  the same pair with torch.compile on both sides (--amp-dtype's half type, O1).
  scripts  the entry scripts as users start them, timed from their own interval log lines:
           train/nd.py --dummy (synthetic, the reference of the others); train/ddp.py under
           torchrun with one process (NCCL on a GPU, gloo on a CPU); train/nd.py on generated
           JPEGs with the pytorch loader; the same with --data-backend gpu (TorchCodec's
           nvJPEG, when torchcodec is installed; --gpu-decoder nvimgcodec, also with --compile)
           and with dali-gpu (when nvidia.dali is).
  decode   (bench.decode, in this process) each backend's input pipeline alone, no model: the
           pytorch loader at -j from a few to every core but one (its row: the best), the gpu
           backend with each --gpu-decoder, dali-gpu and dali-cpu, each a batch ready on the
           device, over the loader rows' JPEG set; against the synthetic training rate (target:
           1.5x, room beside the step). CPU cores busy and the JPEG engines' use in the detail.
  peers    this project against timm's train.py and torchvision's reference train.py, end to
           end on the same generated JPEGs, GPU, model, batch, loader workers and epochs, in
           turns: bench.e2e's contenders nd fast (O1 float16, channels_last, the default
           loader), nd gpu decode and nd dali-gpu (where installed), timm fast (--amp
           --channels-last) and torchvision reference (--amp). The peers' scripts are
           fetched by you (--timm, --torchvision; bench.e2e's --help says from where); a
           peer not given is not run. img/s: the steady state (epochs 2 and later); the
           targets compare whole runs, start to exit.
  causes   where a gap between two loops goes (bench.step_variants, in this process): the
           hand-written step with one thing changed, in turns, eager and compiled (no loss
           scaler; timm's benchmark work: no loss scaler and no weight decay; DDP in a world of
           one with torch's defaults, with gradient_as_bucket_view, without the buffer
           broadcast); train/nd.py under torchrun (the launcher without DDP); and timm's own
           benchmark.py --bench train --amp --channels-last, eager and --torchcompile (fetched
           by you: --timm-benchmark), beside the step doing the same work.

img/s: pairs, the median of --repeats rounds of --steps steps after --warmup steps; nd and DDP,
the median of --repeats log intervals of --steps steps after the warm-up interval(s); loaders,
images over seconds across a window of 10 intervals of (workers x prefetch_factor) batches after
the warm-up, so the batches the workers had ready before the clock started are a tenth of the
window at most. Peak memory is torch.cuda.max_memory_allocated (for pairs: each side as if it ran
alone, see imagenet_recipes/bench/bare_loop.py); none on a CPU.

Targets (ResNet-50, one H100; --target NAME=VALUE replaces one): engine O1 float16 >= 3,000
img/s; engine / bare >= 0.97 (each pair); O2 >= O1 (engine, same half type); DALI GPU >= 0.85 x
synthetic (within 15 %), the gpu backend >= 0.98 x; each backend's decode-only rate >= 1.5x the
synthetic training rate; nvImageCodec with --compile >= 6,000 img/s (an H200's target); each of
our peers rows end to end >= 1.10x timm's train.py and torchvision's reference (their wall time
over ours, median of the repeats). A missed target is marked in the output and the record;
--strict makes it exit 1.

The record (--json) is rewritten after every unit, so a run stopped before its end keeps the rows
it finished. bench.regenerate renders RESULTS.md's `gpu` block from the records kept in
results/gpu/*.json (a row measured in several records: the latest).

The processes it starts (torchrun, the trainers and their loader workers) run in process groups
of their own, ended when their run ends or times out (--row-timeout) and when the tool exits or
gets SIGTERM, SIGINT or SIGHUP; the trainers also die with their parent (imagenet_recipes/bench/gpu_entry.py).

Exit status: 0; 1 when a unit failed, or with --strict when a target was missed; 2 on bad
arguments, or with --device cuda where no CUDA GPU is visible.
"""
# The modules, one job each: units (the units, their rows and targets), cli (the command line),
# run (a run: the units measured in turn, the record, the exit status), pairs (the engine against
# the bare loop, and the step variants, in this process), scripts (the processes it starts and the
# entry scripts' rows), loaders (the loader and decode-only rows), peers (bench.e2e against timm
# and torchvision, timm's benchmark.py), report (the console, the record file, RESULTS.md's block).
from imagenet_recipes.bench.gpu.report import block, records
from imagenet_recipes.bench.gpu.run import main

__all__ = ["block", "main", "records"]
