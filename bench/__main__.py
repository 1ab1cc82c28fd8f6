"""`python -m bench`: the list of tools (each one runs as `python -m bench.<tool>`)."""
import bench

print(bench.__doc__.strip())
