"""Group `layout`: channels_last and torch.compile on the device."""
import pytest

from .gpu_tier import SIMULATED, SMALL, finite_losses, on_device, train


@pytest.mark.parametrize("flags", [("--channels-last", "--opt-level", "O1"), ("--compile",),
                                   ("--compile", "--channels-last", "--opt-level", "O2")],
                         ids=["channels-last", "compile", "compile-channels-last-O2"])
def test_layout_flags_train(flags, runs, images, saw):
    if SIMULATED and "--compile" in flags:
        pytest.skip("torch.compile on the CPU spends minutes in inductor's C++ build: the CPU "
                    "simulation leaves it to the GPU")
    name = "layout-" + "-".join(f.strip("-") for f in flags)
    log = train(runs, name, "nd.py", [*SMALL, *flags, images], timeout=480)
    losses = finite_losses(log)
    on_device(log)
    saw(f"{' '.join(flags)}: {len(losses)} steps, loss {losses[-1]:.3f}")
