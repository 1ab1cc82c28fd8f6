"""`python -m imagenet_recipes.bench.gpu ARGS`: the tool (the package's docstring says what it
measures)."""
import sys

from imagenet_recipes.bench.gpu.run import main

sys.exit(main())
