# Shared by the device scripts that run torch's test Transformer (source it from the repository root).
# That module imports expecttest, which the device image lacks and where nothing can be installed: a
# stand-in module (its TestCase is all common_utils needs at import), on PYTHONPATH after src.
mkdir -p /tmp/shim && printf 'import unittest\n\n\nclass TestCase(unittest.TestCase):\n    pass\n' > /tmp/shim/expecttest.py
export PYTHONPATH=src:/tmp/shim MESHSCOPE_CACHE=/tmp/meshscope-cache
