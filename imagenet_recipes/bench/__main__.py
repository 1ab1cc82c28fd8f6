"""`python -m imagenet_recipes.bench`: the list of tools (each runs as
`python -m imagenet_recipes.bench.<tool>`)."""
from imagenet_recipes import bench

print(bench.__doc__.strip())
