"""Experiments: research built on the product, kept beside it rather than inside it.

An experiment is a training method or an emulation that a study needed and the product does not
offer (yet): its options, its strategy and its entry script live here, built from the product's
own parts (a config subclass, a strategy subclass, `cli.main`). The product (the engine, the
strategies, the parameter server, train/) never imports this package; tests/test_layout.py
checks it. ARCHITECTURE.md ("Product, tools, lab") says what belongs here, when an experiment
moves into the product, and when one is retired.

    local_sgd/     post-local SGD and DiLoCo's outer step on DDP (experiments/local_sgd.py)
    slow_workers/  emulated slower devices through the product's step hooks, for the
                   parameter-server studies (experiments/slow_ddp.py, experiments/slow_ps.py)
"""
