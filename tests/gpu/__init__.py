# A package, so that its conftest and modules do not take the names of tests/'s own (both
# folders have a conftest.py; pytest would import both as `conftest`).
