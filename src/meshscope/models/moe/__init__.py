"""Expert-parallel mixture of experts (the chapter's MoE sections, data flow to results; docs/chapter.md,
Q19-Q25).

router   - which expert each token goes to: the chapter's deterministic top-1 and a learned top-k gate
           with capacity, drops/padding and the Switch load-balancing loss;
dispatch - token order <-> expert order through the project's AllToAllV, splits from the router;
layer    - the local experts (Linear D x D + GELU), the layer that ties it together, and its dense
           single-process reference.
"""
