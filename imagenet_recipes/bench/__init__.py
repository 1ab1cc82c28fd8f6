"""Tools around the trainers, run as `python -m imagenet_recipes.bench.<tool>` from any folder of
an environment the package is installed in (`pip install -e .`, or through launch/env.sh); the
runs, results/ and RESULTS.md they read and write are the clone's:

  sweep         strategies x workers x precision, every combination a real run
  ps            parameter server (sync, async, ESync) vs DDP with a slow worker
  esync         ESync vs sync and async SGD with a slow worker, IID and by-class splits
  recipes       the presets of recipes/ at one small budget
  io            input-pipeline throughput, every loader on the same files and cores
  stages        where a training sample's time goes in the pytorch loader, stage by stage
                (read, decode, crop, resize, flip, collate, hand-over), one core
  loader_threads
                the pytorch loader's workers as processes or as threads: img/s, the GIL a
                sample holds, a training step's rate beside each
  decode        decode capacity: each data backend's input pipeline alone, a batch ready on
                the device (also bench.gpu's decode group)
  e2e           this project end to end against pytorch/examples', timm's and torchvision's
                training scripts on the same JPEGs, in turns
  hetero        DDP and the parameter server with one slower worker, time to accuracy
  gpu           GPU throughput: ResNet-50 O1/O2 fp16/bf16, engine vs bare, torch.compile,
                DDP on one NCCL rank, the pytorch and GPU-decoding loaders, peak memory,
                targets; where DDP's cost and the gap to timm's benchmark go (causes)
  scaling       the scaling model: predicted vs published and measured scaling
  results       the RESULTS.md blocks of a sweep and of the PS benchmark
  summarize     a Markdown table of runs
  plot_curves   learning curves of runs
  plot_scaling  the sweep's figures (figures/scaling_*.png)
  plot_ps       the PS benchmark's figures (figures/ps_*.png)
  regenerate    every RESULTS.md section and figure, from the logs kept in results/
  slow_workers  train/ddp.py and train/ps.py with an emulated straggler (--worker-slowdown),
                the instrument of ps, esync and hetero: `python -m
                imagenet_recipes.bench.slow_workers.ddp` (or `.ps`)

and the modules they share: common (the run-log reader, the RESULTS.md block and table
writers, this machine, the commit), jobs (starting runs as a user would), sweep_stats and
ps_stats (the numbers the tables and figures show), figure (matplotlib for files), bare_loop
and step_variants (a hand-written training step beside the engine's, and with one thing
changed), gpu_entry and gpu_tier (an entry script run for its peak memory; the GPU tier's
RESULTS.md block), kept (the compacted run logs of results/), render (RESULTS.md blocks from
templates/). Every table
and figure is drawn from the runs' log.jsonl files, never from typed numbers.

The one-question studies behind design decisions are not tools: they live in the lab
(lab/README.md), outside the installed package.
"""
