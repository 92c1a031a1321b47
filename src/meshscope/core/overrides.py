"""The experiment overrides the command line offers, shared by the parser and the experiments' errors.

Each maps a flag to the Config field it sets; an experiment whose Config lacks the field refuses it.
"""

OVERRIDES = {
    # flag: (dest, type, help)
    "--world": ("world", int, "number of ranks"),
    "--tp": ("tp", int, "tensor-parallel size"),
    "--cp": ("cp", int, "context-parallel size"),
    "--dp": ("dp", int, "data-parallel size"),
    "--pp": ("pp", int, "pipeline-parallel size (stages)"),
    "--ep": ("ep", int, "expert-parallel size"),
    "--etp": ("etp", int, "expert tensor-parallel size"),
    "--batch": ("batch", int, "rows of each data-parallel replica's batch (EP: tokens per source rank)"),
    "--hidden": ("hidden", int, "model dim D"),
    "--ffn": ("ffn", int, "hidden dim H of the MLP"),
    "--microbatches": ("microbatches", int, "pipeline microbatches M"),
    "--schedule": ("schedule", str, "pipeline schedule: gpipe | 1f1b"),
    "--semantics": ("semantics", str, "TP gradient semantics: summed-loss | replicated-loss"),
    "--routing": ("routing", str, "MoE routing: balanced | skewed | learned"),
    "--skew": ("skew", str, "MoE skew ratio, e.g. 7:1"),
    "--topk": ("topk", int, "router top-k"),
    "--capacity-factor": ("capacity_factor", float, "expert capacity factor"),
    "--experts": ("experts", int, "number of experts"),
    "--steps": ("steps", int, "training steps"),
}

SWITCHES = {
    # flag: (dest, help); each also has its --no- form
    "--input-grad": ("input_grad", "whether the model input requires grad"),
    "--pad": ("pad", "MoE: pad expert buffers to capacity (static splits) instead of exchanging counts"),
    "--pp-scatter-gather": ("pp_scatter_gather", "PP x TP: send 1/tp of each boundary tensor, all-gather it in tp on arrival"),
    "--moe": ("moe", "nd_mlp: the last pipeline stage is an expert-parallel MoE layer"),
}

CLI_DESTS = tuple(dest for dest, _, _ in OVERRIDES.values()) + tuple(dest for dest, _ in SWITCHES.values())
"""Config fields that a command-line flag can set."""


def overrides_of(args) -> dict:
    """The overrides an argparse namespace sets (flags left at None are not overrides)."""
    return {d: getattr(args, d) for d in CLI_DESTS if getattr(args, d, None) is not None}
