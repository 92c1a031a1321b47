"""Expert-parallel mixture of experts (seed, "Expert Parallel / MoE 数据流" to "MoE 参数与结果").

router   - which expert each token goes to: the seed's deterministic top-1 and a learned top-k gate
           with capacity, drops/padding and the Switch load-balancing loss;
dispatch - token order <-> expert order through the project's AllToAllV, splits from the router;
layer    - the local experts (Linear D x D + GELU), the layer that ties it together, and its dense
           single-process reference.
"""
