"""The scaling model of data-parallel training, in four parts:

  model.py     the maths: alpha-beta collectives, overlap with backward, predicted img/s
  cases.py     what it is given and checked against: hardware presets, published results
  measured.py  this machine: its runs' logs and its loopback link
  report.py    the tables, printed and written into RESULTS.md

`python -m imagenet_recipes.bench.scaling` runs it (see __main__.py).
"""
