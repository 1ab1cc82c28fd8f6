"""nvImageCodec's decoder with a fault planted, for rehearsing on a CPU what a GPU machine's
decoder may do to the GPU run (tools/gpu_session.sh) or to any other command:

    PYTHONPATH=tests/plants/nvimgcodec RECIPES_PLANT_NVIMGCODEC=crash \
        bash tools/gpu_session.sh --cpu --archive /tmp/run.tar.gz

RECIPES_PLANT_NVIMGCODEC:
  crash           the process dies of SIGSEGV at its first decode, as nvImageCodec 0.9's region
                  batches do on H100 and B200 (nvImageCodec issue #55)
  hang            the first decode never returns
  crash-regions-hang-whole
                  a call with regions crashes, one with whole images hangs: both of
                  nvImageCodec's modes broken, each its own way, in one run
  refuse-regions  every region comes back empty (None), as with nvJPEG older than 13.2 and
                  interpolated chroma; whole images decode as usual
  refuse-some     every third image of a call comes back empty: files the decoder refuses,
                  decoded on the CPU by the caller (a batch of two, the check at start, passes)
Only the process that probes, trains or measures is planted: DataLoader worker processes (the
`pytorch` backend's region reader) decode as usual. Python imports this file at start-up
(`sitecustomize`) from PYTHONPATH, in every process that gets the variables; it touches
nothing until nvidia.nvimgcodec is imported.
"""
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time

MODE = os.environ.get("RECIPES_PLANT_NVIMGCODEC", "")
MODES = ("crash", "hang", "crash-regions-hang-whole", "refuse-regions", "refuse-some")


def _in_loader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def _plant(module) -> None:
    class Decoder(module.Decoder):
        def decode(self, streams, *args, **kwargs):
            if _in_loader_worker():
                return super().decode(streams, *args, **kwargs)
            if MODE == "crash-regions-hang-whole":
                regions = any(stream.view is not None for stream in
                              (streams if isinstance(streams, (list, tuple)) else [streams]))
                fault = "crash" if regions else "hang"
            else:
                fault = MODE
            if fault == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            while fault == "hang":
                time.sleep(3600)
            images = super().decode(streams, *args, **kwargs)
            if not isinstance(streams, (list, tuple)):  # one stream, one image
                return None if streams.view is not None else images
            if MODE == "refuse-some":
                return [None if i % 3 == 2 else image for i, image in enumerate(images)]
            # a region is a stream with a view (get_sub_code_stream)
            return [None if stream.view is not None else image
                    for stream, image in zip(streams, images)]

    module.Decoder = Decoder


class _PlantAfterImport(importlib.abc.MetaPathFinder):
    """Finds nvidia.nvimgcodec where Python would, and plants the fault once it has loaded."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "nvidia.nvimgcodec":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def load_planted(module):
            load(module)
            _plant(module)

        spec.loader.exec_module = load_planted
        return spec


if MODE:
    if MODE not in MODES:
        raise SystemExit(f"RECIPES_PLANT_NVIMGCODEC={MODE}: one of {', '.join(MODES)}")
    sys.meta_path.insert(0, _PlantAfterImport())
