"""A planted defect for tests/test_compile.py: with RECIPES_PLANT_COMPILE=eager-training, a
module passed to torch.compile trains eagerly while it still evaluates compiled. The state dict,
the checkpoint keys and the losses stay those of a compiled run, so only a count of the graphs
made in each phase tells the difference (the run's compiled_graphs).

    PYTHONPATH=tests/plants/compile RECIPES_PLANT_COMPILE=eager-training \
        launch/env.sh python -m pytest tests/test_compile.py     # must fail
"""
import os

if os.environ.get("RECIPES_PLANT_COMPILE") == "eager-training":
    import torch

    _compile = torch.compile

    def _eager_in_training(model=None, **kwargs):
        compiled = _compile(model, **kwargs)
        if isinstance(model, torch.nn.Module):
            compiled_forward = compiled.forward  # OptimizedModule calls it from __call__

            def forward(*args, **kw):
                return model(*args, **kw) if model.training else compiled_forward(*args, **kw)

            compiled.forward = forward
        return compiled

    torch.compile = _eager_in_training
