"""Runs an entry script with nvImageCodec's decoder planted to return no image, as it does when
its GPU decoders cannot work (nvJPEG missing, no hardware decoder in a container):

    python tests/planted_decoder.py MODE train/nd.py ARGS...

MODE: `nothing`: every image comes back None, the check at start included; `every-third`: the
check at start passes, then every third image of each batch comes back None (files the decoder
refuses while training).
"""
import os
import runpy
import sys

from imagenet_recipes.data import jpeg_decoders

mode, script = sys.argv[1], sys.argv[2]
unplanted_init = jpeg_decoders.NvImageCodecDecoder.__init__


class PlantedDecoder:
    """nvImageCodec's Decoder, with some of its results dropped."""

    def __init__(self, decoder):
        self.decoder, self.calls = decoder, 0

    def decode(self, streams, **kwargs):
        images = list(self.decoder.decode(streams, **kwargs))
        self.calls += 1
        if mode == "nothing":
            return [None] * len(images)
        if self.calls == 1:  # the check at start
            return images
        return [None if i % 3 == 2 else image for i, image in enumerate(images)]


def planted_init(self, *args, **kwargs):
    unplanted_init(self, *args, **kwargs)
    self.decoder = PlantedDecoder(self.decoder)


jpeg_decoders.NvImageCodecDecoder.__init__ = planted_init
sys.argv = [script, *sys.argv[3:]]
sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
runpy.run_path(script, run_name="__main__")
