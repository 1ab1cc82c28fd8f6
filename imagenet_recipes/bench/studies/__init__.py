"""One-question studies: measurements that each settled a design decision of these recipes,
kept with their records so that anyone can check the decision or measure again elsewhere.

  loop           the engine's optimizer step (Trainer.train_step) vs a hand-written one, same
                 batches (also bench.gpu's engine-vs-bare pairs)
  layout         a training step in NCHW vs channels_last, crop size by crop size
  hvd            Horovod vs DDP throughput, in turns
  ddp_cost       DDP's weak-scaling efficiency taken apart
  rpc_transport  the parameter server's RPC transports: idle CPU and round trip

Each runs as `python -m imagenet_recipes.bench.studies.<name>`; `python -m imagenet_recipes.bench.studies` rebuilds their page,
imagenet_recipes/bench/studies/README.md, from imagenet_recipes/bench/studies/records/ (`--check`: compare only). Their tests are
marked `study`, which the default test run leaves out (`pytest -m study` runs them).
"""
