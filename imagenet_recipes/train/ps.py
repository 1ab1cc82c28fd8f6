"""Parameter-server baseline: sync, async and ESync over torch.distributed.rpc.

Rank 0 is the server (it holds the model and the optimizer and never runs the training
forward pass); ranks 1..N are workers that pull the weights, compute on their own shard and
push gradients (sync, async) or model deltas (esync).

    torchrun --nproc_per_node=4 train/ps.py --mode esync -a resnet18 -b 64 /data/imagenet
    python train/ps.py --evaluator runs/ps-esync-resnet18-... /data/imagenet   # separate eval
"""
from imagenet_recipes.ps.main import main as run


def main(argv=None) -> None:
    run(entry="ps", description=__doc__, argv=argv)


if __name__ == "__main__":
    main()
