"""The entry scripts, one module each, run as `python -m imagenet_recipes.train.<entry>` (or
`torchrun ... -m imagenet_recipes.train.<entry>`) from any folder wherever the package is
installed, a built wheel included. The clone's `train/<entry>.py` run the same modules.

    nd        one process, one device            dp    nn.DataParallel, one process
    ddp       DistributedDataParallel            ddp_apex  DDP + apex-style opt levels (O1)
    fsdp      FSDP2 (fully_shard)                hvd   Horovod
    ps        parameter server: sync, async, ESync
"""
