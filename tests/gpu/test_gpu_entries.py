"""Group `entries`: every entry script for a few real steps on the device."""
import pytest

from .gpu_tier import SMALL, expected_backend, finite_losses, need, on_device, train

ENTRIES = {  # name: (script, processes, extra options, backend expected in the run record)
    "nd": ("nd.py", 0, (), None),
    "dp": ("dp.py", 0, (), None),
    "ddp": ("ddp.py", 1, (), expected_backend()),
    "ddp_apex-O2": ("ddp_apex.py", 1, ("--opt-level", "O2"), expected_backend()),
    "hvd": ("hvd.py", 0, (), None),
    "fsdp": ("fsdp.py", 1, (), expected_backend()),
    "ps-sync": ("ps.py", 2, ("--mode", "sync"), None),
}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_entry_script_trains_on_the_device(name, runs, images, saw):
    script, nproc, extra, backend = ENTRIES[name]
    if script == "hvd.py":
        need("horovod", "launch/install_horovod.sh builds it")
    log = train(runs, f"entry-{name}", script, [*SMALL, *extra, images], nproc)
    losses = finite_losses(log)
    run = log["run"][0]
    if backend:
        assert run.get("backend") == backend, f"backend {run.get('backend')}, not {backend}"
    if script != "ps.py":  # the parameter server's record names no single device
        on_device(log)
    saw(f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        + (f", {backend}" if backend else ""))
