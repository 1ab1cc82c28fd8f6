"""Run as an entry script is run (`python tests/loader_server_probe.py`, no PYTHONPATH, the
package imported from where it is installed): starts the loader workers' fork server the way
the entry scripts do, then asks a process forked from it which of the modules a loader worker
needs it already holds. Prints them, one per line, as `name yes|no`."""
if __name__ == "__main__":
    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data.loader_server import loader_worker_context, start_loader_server

    start_loader_server(parse_args(["-j", "2", "data"], entry="nd"))
    pool = loader_worker_context().Pool(1)
    try:
        for name in ("imagenet_recipes.data.pytorch", "torch", "torchvision"):
            held = pool.apply(eval, (f"__import__('sys').modules.get({name!r}) is not None",))
            print(name, "yes" if held else "no", flush=True)
    finally:
        # close + join, never terminate (what `with Pool()` does): a process forked from the
        # server inherits its SIGTERM = ignore (data/worker_server.py), so terminate's SIGTERM
        # does nothing, and a worker whose stop sentinel terminate drained waits forever
        pool.close()
        pool.join()
