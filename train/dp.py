"""`python train/dp.py ARGS` runs `python -m imagenet_recipes.train.dp ARGS`, the installed
package's entry (its -h says what it does): a clone's way to start it, and what torchrun,
horovodrun and the launch scripts name."""
from _package import run_entry

if __name__ == "__main__":
    run_entry("dp")
