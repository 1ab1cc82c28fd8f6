"""Parameter-server baseline over torch.distributed.rpc: sync, async and ESync.

The synchronous engine's train step does not fit a server that applies updates as they arrive,
so the parameter server has its own small loop, reusing the engine's models, data, metrics,
checkpoints and run log:
  config.py         PSConfig: the engine's flags plus --mode, --worker-slowdown, --split, ...
  wire.py           what travels: lists of tensors (never modules), and their byte counts
  state_service.py  ESync's state query service: keep stepping locally, or aggregate now?
  server.py         rank 0: holds the model and optimizer, aggregates, evaluates, checkpoints
  worker.py         ranks 1..N: pull, compute gradients (or local steps) on a shard, push
  evaluator.py      validation, in the server's background thread or as a separate watcher
  main.py           roles, RPC start-up and shutdown, failures -> exit codes
"""
