"""Parameter-server baseline over torch.distributed.rpc: sync, async and ESync.

The synchronous engine's train step does not fit a server that applies updates as they arrive,
so the parameter server has its own small loop, reusing the engine's models, data, precision,
metrics, validation routine, run lifecycle (lifecycle.py), checkpoints and run log:
  options.py        ParameterServerOptions (--mode, --num-servers, --split, ...), and
                    RuleOptions: what an update rule reads
  config.py         PSConfig: the engine's flags plus the parameter server's section
  wire.py           what travels: lists of tensors (never modules), and their byte counts
  state_service.py  ESync's state query service: keep stepping locally, or aggregate now?
  server.py         rank 0: the RPC surface, rounds, counters, logging, evaluations, checkpoints
  shards.py         --num-servers: the parameters in shards, and servers 1..K-1 that hold them
  update_rules.py   what an update does, per mode (sync SGD, ESync averaging, async SGD)
  monitor.py        finds dead or hung workers so no round waits forever
  worker.py         the ranks after the servers: pull, compute gradients (or local steps), push
  evaluator.py      background jobs of the server, and the separate checkpoint watcher
  main.py           roles (servers, workers), RPC start-up and shutdown, failures -> exit codes
"""
