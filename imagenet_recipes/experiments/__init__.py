"""Experiments: research built on the product, kept beside it rather than inside it, one folder
each (README.md says what belongs here, who may import it, what its tests promise, and when an
experiment joins the product or retires).

    local_sgd/     post-local SGD and DiLoCo's outer step on DDP
                   (`python -m imagenet_recipes.experiments.local_sgd`)

The product and its tools never import this package nor start an experiment's command
(tests/test_layout.py checks both).
"""
