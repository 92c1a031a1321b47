# Shared by the device scripts that run torch's test Transformer (source it from the repository root).
# That module imports expecttest, which the device image lacks and where nothing can be installed: a
# stand-in module (its TestCase is all common_utils needs at import), on PYTHONPATH after src.
mkdir -p /tmp/shim && printf 'import unittest\n\n\nclass TestCase(unittest.TestCase):\n    pass\n' > /tmp/shim/expecttest.py
export PYTHONPATH=src:/tmp/shim MESHSCOPE_CACHE=/tmp/meshscope-cache

# bench_trace.py in TREE (a checkout holding src/ and benchmarks/), its C++ recorder built first (a hash
# and a listing once it is in the cache): bench_tree TREE OUTFILE [bench_trace.py's arguments...]
bench_tree() {
  local tree=$1 out=$2; shift 2
  (cd "$tree" && PYTHONPATH=src:/tmp/shim timeout 280 python3 -c "from meshscope.capture import native_build; native_build.ensure()" \
     && PYTHONPATH=src:/tmp/shim timeout 300 python3 benchmarks/bench_trace.py "$@") > "$out" 2>&1
}
